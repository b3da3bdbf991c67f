// Hex text of bytes: the one encoder and decoder of kvd (chunk hashes in logs, tier object
// names and the lmcache HTTP API, client tags, CUDA memory ids, paging tokens).
//
// Lowercase digits, two per byte, no separators. HexDecode takes either case and refuses
// anything else (an odd length, a sign, a prefix, a space) rather than guessing.
// Pure functions: any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvd {

// Appends two hex digits per byte of data[0, len) to out.
void AppendHex(std::string& out, const void* data, size_t len);

std::string HexEncode(const void* data, size_t len);
inline std::string HexEncode(std::string_view bytes) { return HexEncode(bytes.data(), bytes.size()); }

// The bytes `hex` spells; nullopt when its length is odd or a character is not a hex digit.
std::optional<std::string> HexDecode(std::string_view hex);

}  // namespace kvd
