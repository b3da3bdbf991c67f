#include "arith_coder.h"

#include <cstddef>

namespace kvd::bench {
namespace {

constexpr uint64_t kTop = 0xffffffffull, kHalf = 0x80000000ull, kQuarter = 0x40000000ull;

struct BitWriter {
  std::vector<uint8_t>* out;
  uint32_t acc = 0;
  int n = 0;
  void Bit(uint32_t b) {
    acc = (acc << 1) | b;
    if (++n == 8) {
      out->push_back(static_cast<uint8_t>(acc));
      acc = 0;
      n = 0;
    }
  }
  void Flush() {
    if (n > 0) out->push_back(static_cast<uint8_t>(acc << (8 - n)));
  }
};

struct BitReader {
  const uint8_t* p;
  const uint8_t* end;
  int bit = 0;
  uint32_t Bit() {
    if (p >= end) return 0;
    const uint32_t b = (*p >> (7 - bit)) & 1u;
    if (++bit == 8) {
      bit = 0;
      ++p;
    }
    return b;
  }
};

}  // namespace

ArithStreams ArithEncode(const uint8_t* sym, uint32_t tokens, uint32_t channels, const uint16_t* freq,
                         int alphabet, int prob_bits) {
  ArithStreams s;
  std::vector<uint32_t> cum(alphabet + 1);
  for (uint32_t c = 0; c < channels; ++c) {
    const uint16_t* f = freq + size_t{c} * alphabet;
    cum[0] = 0;
    for (int i = 0; i < alphabet; ++i) cum[i + 1] = cum[i] + f[i];
    const size_t start = s.bytes.size();
    BitWriter w{&s.bytes};
    uint64_t low = 0, high = kTop;
    uint32_t pending = 0;
    auto emit = [&](uint32_t b) {
      w.Bit(b);
      for (; pending > 0; --pending) w.Bit(b ^ 1u);
    };
    for (uint32_t t = 0; t < tokens; ++t) {
      const uint32_t x = sym[size_t{t} * channels + c];
      const uint64_t range = high - low + 1;
      high = low + ((range * cum[x + 1]) >> prob_bits) - 1;
      low = low + ((range * cum[x]) >> prob_bits);
      for (;;) {
        if (high < kHalf) {
          emit(0);
        } else if (low >= kHalf) {
          emit(1);
          low -= kHalf;
          high -= kHalf;
        } else if (low >= kQuarter && high < kHalf + kQuarter) {
          ++pending;
          low -= kQuarter;
          high -= kQuarter;
        } else {
          break;
        }
        low <<= 1;
        high = (high << 1) | 1;
      }
    }
    ++pending;
    emit(low < kQuarter ? 0 : 1);
    w.Flush();
    s.lengths.push_back(static_cast<uint32_t>(s.bytes.size() - start));
  }
  return s;
}

void ArithDecode(const ArithStreams& s, uint32_t tokens, uint32_t channels, const uint16_t* freq, int alphabet,
                 int prob_bits, uint8_t* sym) {
  std::vector<uint32_t> cum(alphabet + 1);
  size_t at = 0;
  for (uint32_t c = 0; c < channels; ++c) {
    const uint16_t* f = freq + size_t{c} * alphabet;
    cum[0] = 0;
    for (int i = 0; i < alphabet; ++i) cum[i + 1] = cum[i] + f[i];
    BitReader r{s.bytes.data() + at, s.bytes.data() + at + s.lengths[c]};
    at += s.lengths[c];
    uint64_t low = 0, high = kTop, value = 0;
    for (int i = 0; i < 32; ++i) value = (value << 1) | r.Bit();
    for (uint32_t t = 0; t < tokens; ++t) {
      const uint64_t range = high - low + 1;
      const uint64_t count = (((value - low + 1) << prob_bits) - 1) / range;
      int lo = 0, hi = alphabet;  // cum[lo] <= count < cum[hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (cum[mid] <= count) lo = mid; else hi = mid;
      }
      sym[size_t{t} * channels + c] = static_cast<uint8_t>(lo);
      high = low + ((range * cum[lo + 1]) >> prob_bits) - 1;
      low = low + ((range * cum[lo]) >> prob_bits);
      for (;;) {
        if (high < kHalf) {
        } else if (low >= kHalf) {
          low -= kHalf;
          high -= kHalf;
          value -= kHalf;
        } else if (low >= kQuarter && high < kHalf + kQuarter) {
          low -= kQuarter;
          high -= kQuarter;
          value -= kQuarter;
        } else {
          break;
        }
        low <<= 1;
        high = (high << 1) | 1;
        value = (value << 1) | r.Bit();
      }
    }
  }
}

}  // namespace kvd::bench
