// MsgpackWriter: builds one msgpack document in a std::string with the smallest encoding of
// every integer, string and container header (what msgspec and msgpack-cxx write), so a
// small reply fits the string's inline buffer and costs no heap allocation. Internal to
// wire/ (reply encoders in codec.cc, client-side encoders in request_encoder.cc). A plain
// value; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvd::wire::internal {

class MsgpackWriter {
 public:
  explicit MsgpackWriter(size_t reserve = 64) { out_.reserve(reserve); }
  void Nil() { out_ += '\xc0'; }
  void Bool(bool v) { out_ += v ? '\xc3' : '\xc2'; }
  void Int(int64_t v) {
    if (v >= 0) {
      const auto u = static_cast<uint64_t>(v);
      if (u < 0x80) return Byte(static_cast<uint8_t>(u));
      if (u <= 0xff) return Head(0xcc, u, 1);
      if (u <= 0xffff) return Head(0xcd, u, 2);
      if (u <= 0xffffffffu) return Head(0xce, u, 4);
      return Head(0xcf, u, 8);
    }
    if (v >= -32) return Byte(static_cast<uint8_t>(v));
    const auto u = static_cast<uint64_t>(v);
    if (v >= -128) return Head(0xd0, u, 1);
    if (v >= -32768) return Head(0xd1, u, 2);
    if (v >= -2147483648ll) return Head(0xd2, u, 4);
    Head(0xd3, u, 8);
  }
  void Str(std::string_view s) {
    const size_t n = s.size();
    if (n < 32) {
      Byte(static_cast<uint8_t>(0xa0 | n));
    } else if (n <= 0xff) {
      Head(0xd9, n, 1);
    } else if (n <= 0xffff) {
      Head(0xda, n, 2);
    } else {
      Head(0xdb, n, 4);
    }
    out_ += s;
  }
  void Bin(std::string_view s) {
    const size_t n = s.size();
    if (n <= 0xff) {
      Head(0xc4, n, 1);
    } else if (n <= 0xffff) {
      Head(0xc5, n, 2);
    } else {
      Head(0xc6, n, 4);
    }
    out_ += s;
  }
  void Array(size_t n) { Container(0x90, 0xdc, n); }
  void Map(size_t n) { Container(0x80, 0xde, n); }
  void Ext(int8_t type, std::string_view data) {
    const size_t n = data.size();
    switch (n) {
      case 1: Byte(0xd4); break;
      case 2: Byte(0xd5); break;
      case 4: Byte(0xd6); break;
      case 8: Byte(0xd7); break;
      case 16: Byte(0xd8); break;
      default:
        if (n <= 0xff) {
          Head(0xc7, n, 1);
        } else if (n <= 0xffff) {
          Head(0xc8, n, 2);
        } else {
          Head(0xc9, n, 4);
        }
    }
    Byte(static_cast<uint8_t>(type));
    out_ += data;
  }
  void Raw(std::string_view encoded) { out_ += encoded; }
  std::string Take() { return std::move(out_); }

 private:
  void Byte(uint8_t b) { out_ += static_cast<char>(b); }
  // A header byte and `width` big-endian bytes of v.
  void Head(uint8_t b, uint64_t v, int width) {
    Byte(b);
    for (int i = width - 1; i >= 0; --i) Byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Container(uint8_t fix, uint8_t b16, size_t n) {
    if (n < 16) return Byte(static_cast<uint8_t>(fix | n));
    if (n <= 0xffff) return Head(b16, n, 2);
    Head(static_cast<uint8_t>(b16 + 1), n, 4);
  }
  std::string out_;
};


}  // namespace kvd::wire::internal
