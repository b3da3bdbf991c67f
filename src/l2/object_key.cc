#include "l2/object_key.h"

#include "common/hex.h"

#include <charconv>
#include <cstring>
#include <vector>

namespace kvd::l2 {
namespace {

constexpr std::string_view kSep = "@";
constexpr std::string_view kSlash = "-SEP-";
constexpr std::string_view kFileExt = ".data";
constexpr std::string_view kTagMark = "~k";
constexpr size_t kMaxSalt = 128;

bool IsLowerHex(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Hex(uint64_t v, int min_digits) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, 16);
  const int digits = static_cast<int>(end - buf);
  std::string s(digits < min_digits ? static_cast<size_t>(min_digits - digits) : 0, '0');
  s.append(buf, end);
  return s;
}

// Parses hex (optionally "0x"-prefixed, as Python's int(s, 16) accepts) into a uint32.
std::optional<uint32_t> ParseHex32(std::string_view s) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  if (s.empty() || s.size() > 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    int d = HexValue(c);
    if (d < 0) return std::nullopt;
    v = v * 16 + static_cast<uint32_t>(d);
  }
  return v;
}

std::vector<std::string_view> Split(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t at = s.find(kSep, start);
    if (at == std::string_view::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, at - start));
    start = at + 1;
  }
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t start = 0;
  while (true) {
    size_t at = s.find(from, start);
    if (at == std::string_view::npos) {
      out.append(s.substr(start));
      return out;
    }
    out.append(s.substr(start, at - start));
    out.append(to);
    start = at + from.size();
  }
}

// "<hash>[~k<tag>]"
std::string HashField(const ObjectKey& key) {
  std::string s = HashHex(key.chunk_hash);
  if (!key.layout_tag.empty()) {
    s.append(kTagMark);
    s.append(key.layout_tag);
  }
  return s;
}

// Fills hash and tag from "<hash>[~k<tag>]".
bool ParseHashField(std::string_view field, ObjectKey* key) {
  std::string_view hash = field;
  size_t mark = field.find(kTagMark);
  if (mark != std::string_view::npos) {
    hash = field.substr(0, mark);
    std::string_view tag = field.substr(mark + kTagMark.size());
    if (!IsLowerHex(tag)) return false;
    key->layout_tag = std::string(tag);
  }
  if (hash.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    int hi = HexValue(hash[2 * i]), lo = HexValue(hash[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    key->chunk_hash[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

// Parses the 4 or 5 '@'-separated fields after the prefix.
std::optional<ObjectKey> ParseFields(const std::vector<std::string_view>& parts, size_t first,
                                     bool file_spelling) {
  const size_t n = parts.size() - first;
  if (n != 4 && n != 5) return std::nullopt;
  ObjectKey key;
  key.model_name = file_spelling ? ReplaceAll(parts[first], kSlash, "/") : std::string(parts[first]);
  auto rank = ParseHex32(parts[first + 1]);
  auto group = ParseHex32(parts[first + 2]);
  if (!rank || !group) return std::nullopt;
  key.kv_rank = *rank;
  key.object_group = *group;
  if (!ParseHashField(parts[first + 3], &key)) return std::nullopt;
  if (n == 5) {
    if (parts[first + 4].empty()) return std::nullopt;
    key.cache_salt = std::string(parts[first + 4]);
  }
  if (!ValidateObjectKey(key).ok()) return std::nullopt;
  return key;
}

}  // namespace

size_t ObjectKeyHash::operator()(const ObjectKey& key) const noexcept {
  uint64_t h = 0;
  std::memcpy(&h, key.chunk_hash.data(), sizeof h);
  h ^= (static_cast<uint64_t>(key.kv_rank) << 32) ^ key.object_group;
  h ^= std::hash<std::string>{}(key.model_name) * 0x9e3779b97f4a7c15ULL;
  h ^= std::hash<std::string>{}(key.cache_salt) + (h << 6) + (h >> 2);
  h ^= std::hash<std::string>{}(key.layout_tag) + (h << 6) + (h >> 2);
  return static_cast<size_t>(h);
}

uint32_t KvRank(uint32_t world_size, uint32_t rank) {
  return (world_size << 24) | (rank << 16) | (world_size << 8) | rank;
}

std::string HashHex(const std::array<uint8_t, 32>& hash) {
  return HexEncode(hash.data(), hash.size());
}

Status ValidateObjectKey(const ObjectKey& key) {
  if (key.model_name.empty() || key.model_name == "." || key.model_name == "..") {
    return Status::InvalidArgument("model name '" + key.model_name + "' cannot name a tier object");
  }
  if (key.model_name.find('@') != std::string::npos ||
      key.model_name.find('\0') != std::string::npos) {
    return Status::InvalidArgument("model name must not contain '@' or NUL");
  }
  if (key.cache_salt.size() > kMaxSalt) {
    return Status::InvalidArgument("cache_salt longer than 128 characters");
  }
  for (char c : key.cache_salt) {
    if (c == '@' || c == '/' || c == '\\' || c == '\0') {
      return Status::InvalidArgument("cache_salt must not contain '@', '/', '\\' or NUL");
    }
  }
  if (!key.layout_tag.empty() && !IsLowerHex(key.layout_tag)) {
    return Status::InvalidArgument("layout tag must be lower-case hex");
  }
  return Status::Ok();
}

std::string RespKey(const ObjectKey& key, std::string_view key_prefix) {
  std::string s;
  s.reserve(key_prefix.size() + key.model_name.size() + 96 + key.cache_salt.size());
  if (!key_prefix.empty()) {
    s.append(key_prefix);
    s.append(kSep);
  }
  s.append(key.model_name);
  s.append(kSep);
  s.append(Hex(key.kv_rank, 8));
  s.append(kSep);
  s.append(Hex(key.object_group, 1));
  s.append(kSep);
  s.append(HashField(key));
  if (!key.cache_salt.empty()) {
    s.append(kSep);
    s.append(key.cache_salt);
  }
  return s;
}

std::optional<ObjectKey> ParseRespKey(std::string_view text, std::string_view key_prefix) {
  auto parts = Split(text);
  size_t first = 0;
  if (!key_prefix.empty()) {
    if (parts.empty() || parts[0] != key_prefix) return std::nullopt;
    first = 1;
  }
  return ParseFields(parts, first, /*file_spelling=*/false);
}

std::string FileName(const ObjectKey& key) {
  std::string s = ReplaceAll(key.model_name, "/", kSlash);
  s.append(kSep);
  s.append("0x");
  s.append(Hex(key.kv_rank, 8));
  s.append(kSep);
  s.append(Hex(key.object_group, 1));
  s.append(kSep);
  s.append(HashField(key));
  if (!key.cache_salt.empty()) {
    s.append(kSep);
    s.append(key.cache_salt);
  }
  s.append(kFileExt);
  return s;
}

std::optional<ObjectKey> ParseFileName(std::string_view name) {
  if (name.size() <= kFileExt.size() || name.substr(name.size() - kFileExt.size()) != kFileExt) {
    return std::nullopt;
  }
  return ParseFields(Split(name.substr(0, name.size() - kFileExt.size())), 0,
                     /*file_spelling=*/true);
}

}  // namespace kvd::l2
