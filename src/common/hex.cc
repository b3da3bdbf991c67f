#include "common/hex.h"

#include <cstdint>

namespace kvd {
namespace {

constexpr char kDigits[] = "0123456789abcdef";

int DigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void AppendHex(std::string& out, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t at = out.size();
  out.resize(at + 2 * len);
  for (size_t i = 0; i < len; ++i) {
    out[at + 2 * i] = kDigits[p[i] >> 4];
    out[at + 2 * i + 1] = kDigits[p[i] & 15];
  }
}

std::string HexEncode(const void* data, size_t len) {
  std::string out;
  AppendHex(out, data, len);
  return out;
}

std::optional<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = DigitValue(hex[2 * i]);
    const int lo = DigitValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace kvd
