// A multi-stream binary arithmetic coder, for the entropy-coder comparison in
// kvd-codec-bench only (not part of the format): one stream per (plane, channel) over all
// tokens, 32-bit low/high with pending (E3) bits, frequencies of `prob_bits` precision,
// symbols found by binary search over the cumulative frequencies (the structure of
// lmcache's CacheGen kernels; written from the textbook algorithm).
#pragma once

#include <cstdint>
#include <vector>

namespace kvd::bench {

struct ArithStreams {
  std::vector<uint8_t> bytes;     // streams back to back
  std::vector<uint32_t> lengths;  // per channel
};

// sym: [tokens][channels]; freq: [channels][alphabet], each row summing to 2^prob_bits.
ArithStreams ArithEncode(const uint8_t* sym, uint32_t tokens, uint32_t channels, const uint16_t* freq,
                         int alphabet, int prob_bits);
void ArithDecode(const ArithStreams& s, uint32_t tokens, uint32_t channels, const uint16_t* freq, int alphabet,
                 int prob_bits, uint8_t* sym);

}  // namespace kvd::bench
