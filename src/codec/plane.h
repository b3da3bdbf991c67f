// plane: CacheGen coding of one plane, a [tokens][channels] slice of an object (format
// v2, docs/compression.md "Byte format").
//
//   scales     tokens x u16    bf16 bit pattern of each token's scale s (>= its absmax)
//   params     channels x 2    per-channel distribution (center, shape) of normal tokens
//   params1    channels x 2    the same for anchor tokens (only with anchors)
//   lengths    streams x u32   byte length of each rANS stream
//   streams    one per kStreamChannels channels (rans.h)
//
// Quantization: M = bins/2 - 1, step = s / M (float32), symbol = clamp(rint(v / step),
// -M, M) + M, value = (symbol - M) * step. Without anchors v is the input value. With
// anchors (group G), token t with t % G == 0 is an anchor quantized with anchor bins and
// its value kept as the reference r; other tokens code v = x - r and decode to
// r + (symbol - M) * step. All arithmetic is float32, one rounding per operation.
//
// Threads: functions are reentrant; a Scratch belongs to one thread at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "codec/codec.h"
#include "codec/format.h"
#include "codec/model_core.h"
#include "codec/rans.h"

namespace kvd::codec::plane {

struct PlaneSpec {
  uint32_t tokens = 0;
  uint32_t channels = 0;
  Dtype dtype = Dtype::kBfloat16;
  uint32_t bins = 32;
  uint32_t anchor_bins = 0;     // used when anchor_group >= 2
  uint32_t anchor_group = 0;
  uint32_t stream_channels = 256;
  uint8_t prob_bits[2] = {0, 0};  // per token class; 0: ProbBitsFor(the class's alphabet)
  bool anchors() const { return anchor_group >= 2; }
  bool IsAnchor(uint32_t t) const { return anchors() && t % anchor_group == 0; }
  uint32_t Streams() const { return (channels + stream_channels - 1) / stream_channels; }
};

// The spec of a coded plane of `group` as the object's plane table entry and header
// describe it (its bins, precisions, anchor group and stream width): the one place
// encoder, decoder and the GPU decoder's plan turn a table entry into a PlaneSpec.
inline PlaneSpec PlaneSpecOf(const GroupShape& group, const format::PlaneEntry& entry, const format::Header& header) {
  PlaneSpec s;
  s.tokens = group.tokens;
  s.channels = group.hidden;
  s.dtype = group.dtype;
  s.bins = entry.bins;
  s.anchor_bins = entry.anchor_bins;
  s.prob_bits[0] = entry.prob_bits[0];
  s.prob_bits[1] = entry.prob_bits[1];
  s.anchor_group = header.anchor_group;
  s.stream_channels = header.stream_channels;
  return s;
}

inline int Levels(uint32_t bins) { return static_cast<int>(bins / 2) - 1; }
inline int Alphabet(uint32_t bins) { return 2 * Levels(bins) + 1; }
// The precision of token class k (0 normal, 1 anchors) of a plane.
int ProbBits(const PlaneSpec& spec, int k);

// Bytes of the payload before the streams.
uint64_t FixedBytes(const PlaneSpec& spec);

// Where each distribution's table starts in a pool, by TableKey: an open-addressing map
// that allocates nothing per key (it grows at half load).
class TableIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t Find(uint32_t key) const {
    if (slots_.empty()) return kNone;
    for (size_t i = Home(key);; i = (i + 1) & (slots_.size() - 1)) {
      const uint64_t e = slots_[i];
      if (e == kEmpty) return kNone;
      if (static_cast<uint32_t>(e >> 32) == key) return static_cast<uint32_t>(e);
    }
  }
  // key must not be present.
  void Insert(uint32_t key, uint32_t at) {
    if (2 * (size_ + 1) > slots_.size()) Grow();
    size_t i = Home(key);
    while (slots_[i] != kEmpty) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = (uint64_t{key} << 32) | at;
    ++size_;
  }
  void Clear() {
    if (size_ != 0) std::fill(slots_.begin(), slots_.end(), kEmpty);
    size_ = 0;
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};   // no key is 0xffffffff
  size_t Home(uint32_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void Grow() {
    std::vector<uint64_t> old(slots_.empty() ? 0 : slots_.size() * 2, kEmpty);
    old.swap(slots_);
    if (slots_.empty()) slots_.assign(1024, kEmpty);
    shift_ = 64 - __builtin_ctzll(slots_.size());
    size_ = 0;
    for (uint64_t e : old) {
      if (e != kEmpty) Insert(static_cast<uint32_t>(e >> 32), static_cast<uint32_t>(e));
    }
  }
  std::vector<uint64_t> slots_;
  int shift_ = 64;
  size_t size_ = 0;
};

// The key of a distribution's table: (precision, alphabet, center, shape).
inline uint32_t TableKey(int prob_bits, int alphabet, uint8_t center, uint8_t shape) {
  return (static_cast<uint32_t>(prob_bits) << 23) | (static_cast<uint32_t>(alphabet) << 16) |
         (static_cast<uint32_t>(center) << 8) | shape;
}

// BuildFrequencies (model_core.h), with AVX2 when `avx2` and the CPU has it: the same
// frequencies for every parameter (ModelTest.Avx2FrequenciesAreExact).
bool BuildFrequenciesAvx2(uint8_t center, uint8_t shape, int alphabet, int prob_bits, uint16_t* freq);
bool HaveAvx2();
inline bool Frequencies(uint8_t center, uint8_t shape, int alphabet, int prob_bits, bool avx2, uint16_t* freq) {
  return avx2 ? BuildFrequenciesAvx2(center, shape, alphabet, prob_bits, freq)
              : BuildFrequencies(center, shape, alphabet, prob_bits, freq);
}

// Reusable per-thread buffers.
struct Scratch {
  std::vector<uint8_t> symbols;      // tokens x channels
  std::vector<uint16_t> scales;      // tokens
  std::vector<float> row;            // channels
  std::vector<float> recon;          // channels (anchor values)
  std::vector<uint32_t> hist;        // class 0: channels x alphabet 0, then class 1 likewise
  std::vector<uint8_t> params;       // 2 classes x channels x 2
  std::vector<uint16_t> words;
  // Encoding: symbol tables (alphabet entries each) by TableKey, shared by channels with
  // the same distribution in this plane and the next ones; enc_at: where the table of
  // each (class, channel) of the plane starts in enc_pool.
  std::vector<EncSymbol> enc_pool;
  TableIndex enc_index;
  std::vector<uint32_t> enc_at;      // 2 classes x channels
  // Decoding: the tables built so far (a slot table of 2^P entries, or a search table of
  // at most 64, see ClassTables), and where each one starts in slot_tables, by
  // TableKey(P, alphabet, center, shape) (| kSearchKey for search tables). A table is a
  // pure function of its key, so channels with the same distribution share one, in this
  // plane and the next ones the Scratch decodes; when a block would grow the pool past
  // slot_table_limit entries the pool is emptied first (0: every block builds its own).
  std::unique_ptr<uint32_t[]> slot_tables;  // slot_table_capacity entries, not initialised
  size_t slot_table_capacity = 0;
  size_t slot_table_used = 0;
  TableIndex slot_table_at;
  size_t slot_table_limit = size_t{1} << 19;   // 2 MiB
  // A token class of a plane decodes by search when its tokens x search steps x
  // search_weight < 2^P, i.e. when it has too few tokens to pay for slot tables (the
  // anchors of G = 10: 26 tokens of 256); 0: never. Either way the output is the same.
  uint32_t search_weight = 4;
  std::vector<float> steps;          // decoding: tokens
};

// Appends the plane's payload to *out. Returns false, appending nothing, when the plane
// holds a value CacheGen cannot code (NaN or infinity) or would not get smaller; the
// caller then stores it raw. `simd`: use the AVX2 quantizer and rANS step when the CPU
// has them (false: the scalar reference; the bytes are the same).
bool Encode(const uint8_t* data, const PlaneSpec& spec, Scratch* scratch, std::vector<uint8_t>* out,
            bool simd = true);

// Decodes a payload into out (tokens x channels in spec.dtype). Checks every length,
// parameter and scale, and that each stream ends exactly where its states say.
// `simd`: use the AVX2 decoder when the CPU has it (false: the scalar reference).
Status Decode(std::span<const uint8_t> payload, const PlaneSpec& spec, Scratch* scratch, uint8_t* out,
              bool simd = true);

// ---- Internals shared by the decoders (plane_decode*.cc) ----------------------------

// Per-block decoding tables of one token class, one per lane, in one of two forms:
//  - slot tables (search_steps == 0): 2^prob_bits slots, each PackSlot(freq, slot - cum,
//    symbol) of the symbol whose range holds the slot (one lookup per symbol: x' = freq *
//    (x >> P) + bias). Lane j's slot s is slots[lane_at[j] + s].
//  - search tables (search_steps = n > 0, 2^n >= alphabet): 2^n entries SearchEntry(cum,
//    freq) of symbols 0..alphabet-1, then kSearchEnd; the symbol of a slot is the last
//    entry whose cum is <= slot, found in n halving steps. 64 entries at most instead
//    of 2^P: for a class with few tokens (anchors), building slot tables costs more
//    than the searches.
struct ClassTables {
  int prob_bits = 0;
  int levels = 0;                 // M
  int search_steps = 0;           // 0: slot tables
  const uint32_t* slots = nullptr;  // the table pool (Scratch::slot_tables)
  int32_t lane_at[32] = {};         // start of each lane's table in the pool
};
inline constexpr uint32_t kSearchKey = 1u << 31;  // TableKey of a search table
inline constexpr uint32_t kSearchEnd = 0xffff;    // cum above every slot (P <= 12)
inline uint32_t SearchEntry(uint32_t cum, uint32_t freq) { return cum | (freq << 16); }
// The symbol whose range holds `slot` in a search table of 2^steps entries.
inline uint32_t SearchSymbol(const uint32_t* table, int steps, uint32_t slot) {
  uint32_t s = 0;
  for (uint32_t b = (1u << steps) >> 1; b != 0; b >>= 1) {
    if ((table[s + b] & 0xffffu) <= slot) s += b;
  }
  return s;
}

struct BlockJob {
  const PlaneSpec* spec;
  ClassTables cls[2];           // 0: normal tokens, 1: anchors
  const float* steps;           // per token
  float* recon;                 // per channel of the plane (anchors)
  uint32_t channel0;            // first channel of the block
  int lanes;                    // active lanes (1..32)
  uint8_t* out;                 // plane output
};

// Decodes tokens [t0, tokens) of a block with the scalar reference; false when the
// stream runs out of words.
bool DecodeBlockScalar(const BlockJob& job, uint32_t t0, uint32_t* states, const uint8_t** words,
                       const uint8_t* end);
// AVX2 decoder for a full block (32 lanes): decodes tokens from *t while at least 64
// bytes of words remain, advancing *t; the caller finishes with the scalar decoder.
void DecodeBlockAvx2(const BlockJob& job, uint32_t* t, uint32_t* states, const uint8_t** words,
                     const uint8_t* end);
// Writes a slot table (2^P entries, PackSlot(freq, slot - cum, symbol)) from a channel's
// frequencies, like the scalar loop of the decoder, and up to 7 entries past its end.
void FillSlotTableAvx2(const uint16_t* freq, int alphabet, uint32_t* table);

// The encoder's choice of distribution for a histogram (counts of symbols 0..alphabet-1):
// mean, variance and kurtosis (a moment fit).
void FitChannel(const uint32_t* hist, int alphabet, int prob_bits, uint8_t* center, uint8_t* shape);
// FitChannel of four channels at once with AVX2, the same operations per channel in the
// same order (the same choices): hist[s * stride + j] counts symbol s of channel j
// (j < 4; counts < 2^31); params[2 j], params[2 j + 1]: the channel's center and shape.
void FitChannels4Avx2(const uint32_t* hist, size_t stride, int alphabet, uint8_t* params);
// Adds the counts of the normal tokens' symbols (symbols[t * channels + c] < alphabet;
// every token but t % anchor_group == 0 when anchor_group >= 2) to hist[s * channels + c].
void NormalHistogramAvx2(const uint8_t* symbols, uint32_t tokens, uint32_t channels, uint32_t anchor_group,
                         int alphabet, uint32_t* hist);
// The sigma index of a standard deviation (in symbols) in FitChannel.
int SigmaIndex(double sigma);

// AVX2 quantizer of one token row (plane_encode_avx2.cc), the same arithmetic as the
// scalar path: loads `channels` values of `dtype` (minus ref when ref != nullptr) into v
// and returns their absmax, or -1 when one is not finite.
float LoadRowAvx2(const uint8_t* src, Dtype dtype, uint32_t channels, const float* ref, float* v);
// Symbols clamp(rint(v / step), -m, m) + m (0 when step is 0) into sym.
void QuantizeRowAvx2(const float* v, uint32_t channels, float step, int m, uint8_t* sym);
// AVX2 rANS encoder of one full block (32 lanes), tokens tokens-1 down to 0, as the
// scalar EncodeStep loop codes it: symbols[t * row_stride + j] of lane j, lanes[32 k + j]
// the symbol table of lane j in token class k, states x[32] updated, words written
// backwards from w (the new end returned). Writes up to 7 words below the returned
// pointer, so the buffer needs 8 words of room below its last word.
uint16_t* EncodeBlockAvx2(uint32_t* x, const uint8_t* symbols, size_t row_stride, const EncSymbol* const* lanes,
                          uint32_t anchor_group, uint32_t tokens, uint16_t* w);

}  // namespace kvd::codec::plane
