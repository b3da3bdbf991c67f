// MsgpackReader (see msgpack_reader.h). Formats follow the msgpack specification; the
// order of checks within one item follows msgpack-cxx 4.x (header bytes, then payload
// bytes, then the size limit for str/bin/ext; element count, then depth, for containers).
#include "wire/msgpack_reader.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace kvd::wire::internal {

MsgpackReader::MsgpackReader(std::string_view doc, const DecodeLimits& limits)
    : doc_(doc),
      end_(doc.size()),
      max_array_(std::min(limits.max_array, doc.size())),
      max_map_(std::min(limits.max_map, doc.size() / 2)),
      max_str_(limits.max_str),
      max_bin_(limits.max_bin),
      max_ext_(limits.max_ext),
      max_depth_(limits.max_depth) {}

bool MsgpackReader::ReadBe(size_t n, uint64_t* v) {
  if (end_ - pos_ < 1 + n) return Fail("insufficient bytes");
  uint64_t x = 0;
  for (size_t i = 1; i <= n; ++i) x = (x << 8) | Byte(pos_ + i);
  pos_ += 1 + n;
  *v = x;
  return true;
}

bool MsgpackReader::Payload(size_t len, std::string_view* out) {
  if (end_ - pos_ < len) return Fail("insufficient bytes");
  *out = doc_.substr(pos_, len);
  pos_ += len;
  return true;
}

bool MsgpackReader::Next(MpItem* item, size_t depth) {
  if (reason_) return false;
  if (pos_ >= end_) return Fail("insufficient bytes");
  const uint8_t b = Byte(pos_);
  *item = MpItem{};
  uint64_t n = 0;
  // Positive and negative fixints, fixmap, fixarray, fixstr.
  if (b <= 0x7f) {
    item->kind = MpKind::kUint;
    item->u64 = b;
    ++pos_;
    return true;
  }
  if (b >= 0xe0) {
    item->kind = MpKind::kInt;
    item->i64 = static_cast<int8_t>(b);
    ++pos_;
    return true;
  }
  auto container = [&](MpKind kind, uint64_t count) {
    item->kind = kind;
    item->count = static_cast<uint32_t>(count);
    if (kind == MpKind::kArray && count > max_array_) return Fail("array size overflow");
    if (kind == MpKind::kMap && count > max_map_) return Fail("map size overflow");
    if (depth > max_depth_) return Fail("depth size overflow");
    return true;
  };
  auto str = [&](MpKind kind, uint64_t len, size_t limit, const char* overflow) {
    item->kind = kind;
    if (!Payload(len, &item->bytes)) return false;
    if (len > limit) return Fail(overflow);
    return true;
  };
  auto ext = [&](uint64_t len) {  // `len` data bytes follow one type byte
    item->kind = MpKind::kExt;
    std::string_view all;
    if (!Payload(len + 1, &all)) return false;
    if (len + 1 > max_ext_) return Fail("ext size overflow");
    item->ext_type = static_cast<int8_t>(all[0]);
    item->bytes = all.substr(1);
    return true;
  };
  if (b <= 0x8f) {
    ++pos_;
    return container(MpKind::kMap, b & 0x0f);
  }
  if (b <= 0x9f) {
    ++pos_;
    return container(MpKind::kArray, b & 0x0f);
  }
  if (b <= 0xbf) {
    ++pos_;
    return str(MpKind::kStr, b & 0x1f, max_str_, "str size overflow");
  }
  switch (b) {
    case 0xc0:
      ++pos_;
      item->kind = MpKind::kNil;
      return true;
    case 0xc1:
      return Fail("parse error");
    case 0xc2:
    case 0xc3:
      ++pos_;
      item->kind = MpKind::kBool;
      item->boolean = b == 0xc3;
      return true;
    case 0xc4:
    case 0xc5:
    case 0xc6:
      if (!ReadBe(size_t{1} << (b - 0xc4), &n)) return false;
      return str(MpKind::kBin, n, max_bin_, "bin size overflow");
    case 0xc7:
    case 0xc8:
    case 0xc9:
      if (!ReadBe(size_t{1} << (b - 0xc7), &n)) return false;
      return ext(n);
    case 0xca: {
      if (!ReadBe(4, &n)) return false;
      item->kind = MpKind::kFloat32;
      item->f64 = std::bit_cast<float>(static_cast<uint32_t>(n));
      return true;
    }
    case 0xcb:
      if (!ReadBe(8, &n)) return false;
      item->kind = MpKind::kFloat64;
      item->f64 = std::bit_cast<double>(n);
      return true;
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
      if (!ReadBe(size_t{1} << (b - 0xcc), &n)) return false;
      item->kind = MpKind::kUint;
      item->u64 = n;
      return true;
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: {
      const size_t width = size_t{1} << (b - 0xd0);
      if (!ReadBe(width, &n)) return false;
      // Sign-extend from `width` bytes.
      const int shift = static_cast<int>(64 - 8 * width);
      const int64_t v = static_cast<int64_t>(n << shift) >> shift;
      if (v >= 0) {
        item->kind = MpKind::kUint;
        item->u64 = static_cast<uint64_t>(v);
      } else {
        item->kind = MpKind::kInt;
        item->i64 = v;
      }
      return true;
    }
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
      ++pos_;
      return ext(size_t{1} << (b - 0xd4));
    case 0xd9:
    case 0xda:
    case 0xdb:
      if (!ReadBe(size_t{1} << (b - 0xd9), &n)) return false;
      return str(MpKind::kStr, n, max_str_, "str size overflow");
    case 0xdc:
    case 0xdd:
      if (!ReadBe(b == 0xdc ? 2 : 4, &n)) return false;
      return container(MpKind::kArray, n);
    case 0xde:
    case 0xdf:
      if (!ReadBe(b == 0xde ? 2 : 4, &n)) return false;
      return container(MpKind::kMap, n);
    default:
      return Fail("parse error");  // unreachable: every byte is covered above
  }
}

bool MsgpackReader::SkipContents(const MpItem& container, size_t depth) {
  if (container.kind != MpKind::kArray && container.kind != MpKind::kMap) return !reason_;
  const uint64_t items = container.kind == MpKind::kMap ? 2 * uint64_t{container.count}
                                                        : container.count;
  for (uint64_t i = 0; i < items; ++i) {
    if (!Skip(depth + 1)) return false;
  }
  return true;
}

bool MsgpackReader::Skip(size_t depth) {
  MpItem item;
  if (!Next(&item, depth)) return false;
  return SkipContents(item, depth);
}

}  // namespace kvd::wire::internal
