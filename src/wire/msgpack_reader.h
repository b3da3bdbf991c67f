// MsgpackReader: a bounded, allocation-free streaming reader of one msgpack document, for
// the request path's decoders (codec.cc). Internal to wire/ (and its tests and fuzzers).
//
// It reads item headers in stream order and enforces, in the same order and with the same
// reasons as msgpack-cxx's unpack with kvd's DecodeLimits (which the other decoders use):
// an array may announce at most min(max_array, document bytes) elements, a map at most
// min(max_map, bytes / 2) pairs, str/bin/ext payloads at most max_str/max_bin/max_ext
// bytes (an ext counts its type byte), containers nest at most max_depth deep, 0xc1 is a
// parse error and a document cut short is "insufficient bytes". The first violation stops
// the reader; reason() says which ("insufficient bytes", "parse error", "array size
// overflow", "map size overflow", "str size overflow", "bin size overflow", "ext size
// overflow", "depth size overflow"). Nothing is allocated: str/bin/ext payloads are views
// into the document. Integers follow msgpack-cxx's classification: a signed format holding
// a non-negative value reads as kUint.
//
// Not thread-safe (one reader per document); the document must outlive the reader and
// every view it returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "wire/codec.h"

namespace kvd::wire::internal {

enum class MpKind : uint8_t { kNil, kBool, kUint, kInt, kFloat32, kFloat64, kStr, kBin, kExt, kArray, kMap };

// One item header. Scalars carry their value; str/bin/ext their payload; array/map their
// element / pair count (the elements follow in the stream).
struct MpItem {
  MpKind kind = MpKind::kNil;
  bool boolean = false;
  uint64_t u64 = 0;     // kUint
  int64_t i64 = 0;      // kInt (always negative)
  double f64 = 0;       // kFloat32 / kFloat64
  std::string_view bytes;  // kStr / kBin / kExt (data without the type byte)
  int8_t ext_type = 0;  // kExt
  uint32_t count = 0;   // kArray: elements; kMap: key/value pairs
};

class MsgpackReader {
 public:
  MsgpackReader(std::string_view doc, const DecodeLimits& limits);

  // Reads the next item's header. `depth` is 1 + the number of containers enclosing the
  // item (1 for the document's top level). False once the reader has failed.
  bool Next(MpItem* item, size_t depth);
  // Skips the elements of `container` (an array or map just read at `depth`), checking
  // them as Next does.
  bool SkipContents(const MpItem& container, size_t depth);
  // Next + SkipContents: skips one whole value.
  bool Skip(size_t depth);

  // Fast path for token arrays: if the next item is a positive fixint or uint8/16/32 and
  // its bytes are present, stores its value and returns true; otherwise returns false
  // without consuming anything (the caller then uses Next).
  bool NextSmallUint(uint32_t* value) {
    if (pos_ >= end_) return false;
    const uint8_t b = static_cast<uint8_t>(doc_[pos_]);
    if (b < 0x80) {
      *value = b;
      pos_ += 1;
      return true;
    }
    switch (b) {
      case 0xcc:
        if (end_ - pos_ < 2) return false;
        *value = Byte(pos_ + 1);
        pos_ += 2;
        return true;
      case 0xcd:
        if (end_ - pos_ < 3) return false;
        *value = (uint32_t{Byte(pos_ + 1)} << 8) | Byte(pos_ + 2);
        pos_ += 3;
        return true;
      case 0xce:
        if (end_ - pos_ < 5) return false;
        *value = (uint32_t{Byte(pos_ + 1)} << 24) | (uint32_t{Byte(pos_ + 2)} << 16) |
                 (uint32_t{Byte(pos_ + 3)} << 8) | Byte(pos_ + 4);
        pos_ += 5;
        return true;
      default:
        return false;
    }
  }

  // Bulk fast path for token arrays: decodes up to n leading items that are positive
  // fixints or uint8/16/32 into out[0..) and returns how many it decoded (it stops at
  // anything else, and a few bytes before the end, where NextSmallUint / Next take over).
  size_t NextSmallUints(uint32_t* out, size_t n) {
    if (end_ < pos_ + 5) return 0;
    const uint8_t* const base = reinterpret_cast<const uint8_t*>(doc_.data());
    const uint8_t* p = base + pos_;
    const uint8_t* const stop = base + end_ - 4;  // every case below reads at most p[0..4]
    size_t i = 0;
    while (i < n && p < stop) {
      const uint8_t b = p[0];
      uint32_t w;
      if (b < 0x80) {
        out[i++] = b;
        p += 1;
      } else if (b == 0xce) {
        std::memcpy(&w, p + 1, 4);
        out[i++] = __builtin_bswap32(w);
        p += 5;
      } else if (b == 0xcd) {
        out[i++] = (uint32_t{p[1]} << 8) | p[2];
        p += 3;
      } else if (b == 0xcc) {
        out[i++] = p[1];
        p += 2;
      } else {
        break;
      }
    }
    pos_ = static_cast<size_t>(p - base);
    return i;
  }

  bool failed() const { return reason_ != nullptr; }
  const char* reason() const { return reason_; }
  // True when the whole document has been read (nothing trails the top-level value).
  bool at_end() const { return pos_ == end_; }
  size_t position() const { return pos_; }

 private:
  uint8_t Byte(size_t at) const { return static_cast<uint8_t>(doc_[at]); }
  bool Fail(const char* reason) {
    reason_ = reason;
    return false;
  }
  // Reads n big-endian bytes after the header byte into *v (n <= 8).
  bool ReadBe(size_t n, uint64_t* v);
  bool Payload(size_t len, std::string_view* out);

  const std::string_view doc_;
  const size_t end_;
  const size_t max_array_, max_map_, max_str_, max_bin_, max_ext_, max_depth_;
  size_t pos_ = 0;
  const char* reason_ = nullptr;
};

}  // namespace kvd::wire::internal
