// plane decoder (plane.h): checks the payload, builds each block's tables, runs the AVX2
// or the scalar reference decoder.
#include <algorithm>
#include <cstring>

#include "codec/float_bits.h"
#include "codec/format.h"
#include "codec/model_core.h"
#include "codec/plane.h"

namespace kvd::codec::plane {
namespace {

// Entries past the last table the AVX2 table fill may write.
constexpr size_t kFillPad = 8;

Status Corrupt(const std::string& why) { return Status::InvalidArgument("cachegen: corrupted plane: " + why); }

// The largest finite value of each output dtype: decoded values saturate there, so a
// plane never decodes to infinity (fp16 data at 65504 has a bf16 scale of 65536).
template <Dtype D>
constexpr float kLimit = D == Dtype::kFloat16 ? 65504.0f : (D == Dtype::kBfloat16 ? 0x1.fep127f : 0x1.fffffep127f);

template <Dtype D>
inline void Store(uint8_t* out, size_t index, float v) {
  v = v > kLimit<D> ? kLimit<D> : (v < -kLimit<D> ? -kLimit<D> : v);
  if constexpr (D == Dtype::kBfloat16) {
    const uint16_t h = FloatToBf16(v);
    memcpy(out + 2 * index, &h, 2);
  } else if constexpr (D == Dtype::kFloat16) {
    const uint16_t h = FloatToFp16(v);
    memcpy(out + 2 * index, &h, 2);
  } else {
    memcpy(out + 4 * index, &v, 4);
  }
}

template <Dtype D>
bool ScalarBlock(const BlockJob& job, uint32_t t0, uint32_t* st, const uint8_t** words, const uint8_t* end) {
  const PlaneSpec& sp = *job.spec;
  const uint8_t* w = *words;
  for (uint32_t t = t0; t < sp.tokens; ++t) {
    const int k = sp.IsAnchor(t) ? 1 : 0;
    const ClassTables& ct = job.cls[k];
    const uint32_t mask = (1u << ct.prob_bits) - 1u;
    const float step = job.steps[t];
    const size_t row = size_t{t} * sp.channels + job.channel0;
    for (int j = 0; j < job.lanes; ++j) {
      uint32_t x = st[j];
      const uint32_t* table = ct.slots + ct.lane_at[j];
      uint32_t s;
      if (ct.search_steps == 0) {
        const uint32_t e = table[x & mask];
        s = SlotSym(e);
        x = SlotFreq(e) * (x >> ct.prob_bits) + SlotBias(e);
      } else {
        s = SearchSymbol(table, ct.search_steps, x & mask);
        const uint32_t e = table[s];
        x = (e >> 16) * (x >> ct.prob_bits) + (x & mask) - (e & 0xffffu);
      }
      if (x < kRansLow) {
        if (end - w < 2) return false;
        x = (x << 16) | format::Get16(w);
        w += 2;
      }
      st[j] = x;
      float v = static_cast<float>(static_cast<int>(s) - ct.levels) * step;
      if (sp.anchors()) {
        float& r = job.recon[job.channel0 + j];
        if (k == 1) {
          r = v;
        } else {
          v = r + v;
        }
      }
      Store<D>(job.out, row + j, v);
    }
  }
  *words = w;
  return true;
}

// Fills one slot table (2^prob_bits entries) from a channel's parameter bytes.
// With avx2, up to 7 entries past the table's end are written too.
bool BuildSlotTable(uint8_t center, uint8_t shape, int alphabet, int prob_bits, bool avx2, uint32_t* table) {
  uint16_t freq[kMaxAlphabet];
  if (!Frequencies(center, shape, alphabet, prob_bits, avx2, freq)) return false;
  if (avx2) {
    FillSlotTableAvx2(freq, alphabet, table);
    return true;
  }
  uint32_t cum = 0;
  for (int s = 0; s < alphabet; ++s) {
    const uint32_t base = PackSlot(freq[s], 0, static_cast<uint32_t>(s));
    uint32_t* run = table + cum;
    for (uint32_t i = 0; i < freq[s]; ++i) run[i] = base + (i << 7);  // bias = i
    cum += freq[s];
  }
  return true;
}

// Fills one search table (2^steps entries, ClassTables) from a channel's parameter bytes.
bool BuildSearchTable(uint8_t center, uint8_t shape, int alphabet, int prob_bits, int steps, bool avx2,
                      uint32_t* table) {
  uint16_t freq[kMaxAlphabet];
  if (!Frequencies(center, shape, alphabet, prob_bits, avx2, freq)) return false;
  uint32_t cum = 0;
  for (int s = 0; s < alphabet; ++s) {
    table[s] = SearchEntry(cum, freq[s]);
    cum += freq[s];
  }
  for (int s = alphabet; s < (1 << steps); ++s) table[s] = kSearchEnd;
  return true;
}

// Points the lanes of one class of a block at their channels' tables (of the form
// ct->search_steps says), building the tables the pool does not hold yet. Inactive lanes
// point at table 0 and are never decoded. The caller sets ct->slots once every class of
// the block is placed (the pool may move while it grows).
bool PlaceClassTables(const uint8_t* params, int lanes, int alphabet, bool avx2, Scratch* sc, ClassTables* ct) {
  const int prob_bits = ct->prob_bits, steps = ct->search_steps;
  const size_t n = size_t{1} << (steps != 0 ? steps : prob_bits);
  for (int j = 0; j < kLanes; ++j) {
    if (j >= lanes) {
      ct->lane_at[j] = 0;
      continue;
    }
    const uint8_t center = params[2 * j], shape = params[2 * j + 1];
    const uint32_t key = TableKey(prob_bits, alphabet, center, shape) | (steps != 0 ? kSearchKey : 0);
    uint32_t at = sc->slot_table_at.Find(key);
    if (at == TableIndex::kNone) {
      // The caller made room for a whole block (DecodeTyped).
      at = static_cast<uint32_t>(sc->slot_table_used);
      uint32_t* table = sc->slot_tables.get() + at;
      if (!(steps != 0 ? BuildSearchTable(center, shape, alphabet, prob_bits, steps, avx2, table)
                       : BuildSlotTable(center, shape, alphabet, prob_bits, avx2, table))) {
        return false;
      }
      sc->slot_table_at.Insert(key, at);
      sc->slot_table_used += n;
    }
    ct->lane_at[j] = static_cast<int32_t>(at);
  }
  return true;
}

template <Dtype D>
Status DecodeTyped(std::span<const uint8_t> payload, const PlaneSpec& sp, Scratch* sc, uint8_t* out, bool simd) {
  const uint32_t T = sp.tokens, C = sp.channels;
  const int classes = sp.anchors() ? 2 : 1;
  const int levels[2] = {Levels(sp.bins), Levels(sp.anchors() ? sp.anchor_bins : sp.bins)};
  const int alpha[2] = {2 * levels[0] + 1, 2 * levels[1] + 1};
  const int pbits[2] = {ProbBits(sp, 0), ProbBits(sp, 1)};
  for (int k = 0; k < 2; ++k) {
    if (pbits[k] < kMinProbBits || pbits[k] > kMaxProbBits || (1 << pbits[k]) < alpha[k]) {
      return Status::InvalidArgument("cachegen: bad probability precision");
    }
  }
  const uint64_t fixed = FixedBytes(sp);
  if (payload.size() < fixed) return Corrupt("payload shorter than its tables");
  const uint8_t* p = payload.data();
  // Scales: finite and not negative.
  sc->steps.resize(T);
  for (uint32_t t = 0; t < T; ++t) {
    const uint16_t sb = format::Get16(p + 2 * t);
    if ((sb & 0x8000u) || (sb & 0x7f80u) == 0x7f80u) return Corrupt("bad scale at token " + std::to_string(t));
    sc->steps[t] = Bf16ToFloat(sb) / static_cast<float>(levels[sp.IsAnchor(t) ? 1 : 0]);
  }
  const uint8_t* params[2] = {p + 2 * size_t{T}, p + 2 * size_t{T} + 2 * size_t{C}};
  for (int k = 0; k < classes; ++k) {
    for (uint32_t c = 0; c < C; ++c) {
      if (!ShapeIsValid(params[k][2 * c + 1])) return Corrupt("bad distribution of channel " + std::to_string(c));
    }
  }
  const uint32_t S = sp.Streams();
  const uint8_t* lengths = p + fixed - 4 * size_t{S};
  uint64_t total = fixed;
  for (uint32_t s = 0; s < S; ++s) {
    const uint32_t len = format::Get32(lengths + 4 * s);
    if (len < 4 * kLanes || (len - 4 * kLanes) % 2 != 0) return Corrupt("bad stream length");
    total += len;
  }
  if (total != payload.size()) return Corrupt("stream lengths do not add up to the payload");

  const bool avx2 = simd && HaveAvx2();
  sc->recon.assign(C, 0.0f);
  BlockJob job;
  job.spec = &sp;
  job.steps = sc->steps.data();
  job.recon = sc->recon.data();
  job.out = out;
  // Slot tables or search tables (ClassTables) per class, by how many tokens it has.
  const uint32_t anchor_tokens = sp.anchors() ? (T + sp.anchor_group - 1) / sp.anchor_group : 0;
  const uint32_t class_tokens[2] = {T - anchor_tokens, anchor_tokens};
  size_t block_tables = 0;  // most a block adds to the table pool (every lane a new table)
  for (int k = 0; k < 2; ++k) {
    int steps = 0;
    while ((1 << steps) < alpha[k]) ++steps;
    const bool search = sc->search_weight != 0 && uint64_t{class_tokens[k]} * std::max(steps, 1) * sc->search_weight <
                                                      (uint64_t{1} << pbits[k]);
    job.cls[k].prob_bits = pbits[k];
    job.cls[k].levels = levels[k];
    job.cls[k].search_steps = search ? std::max(steps, 1) : 0;
    if (k < classes) block_tables += kLanes * (size_t{1} << (search ? std::max(steps, 1) : pbits[k]));
  }
  const uint8_t* stream = p + fixed;
  for (uint32_t s = 0; s < S; ++s) {
    const uint32_t len = format::Get32(lengths + 4 * s);
    const uint8_t* end = stream + len;
    uint32_t st[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      st[j] = format::Get32(stream + 4 * j);
      if (st[j] < kRansLow || st[j] >= kRansHigh) return Corrupt("bad stream state");
    }
    const uint8_t* w = stream + 4 * kLanes;
    const uint32_t c0 = s * sp.stream_channels;
    const uint32_t c1 = c0 + sp.stream_channels < C ? c0 + sp.stream_channels : C;
    for (uint32_t cb = c0; cb < c1; cb += kLanes) {
      const int lanes = static_cast<int>(c1 - cb < kLanes ? c1 - cb : kLanes);
      if (sc->slot_table_used + block_tables > std::max(sc->slot_table_limit, block_tables)) {
        sc->slot_table_used = 0;
        sc->slot_table_at.Clear();
      }
      if (sc->slot_table_capacity < sc->slot_table_used + block_tables + kFillPad) {
        // Allocated once per Scratch (again only for a larger precision): no table is
        // ever copied.
        const size_t cap = std::max(sc->slot_table_limit, block_tables) + kFillPad;
        sc->slot_tables = std::make_unique_for_overwrite<uint32_t[]>(cap);
        sc->slot_table_capacity = cap;
        sc->slot_table_used = 0;
        sc->slot_table_at.Clear();
      }
      for (int k = 0; k < classes; ++k) {
        if (!PlaceClassTables(params[k] + 2 * size_t{cb}, lanes, alpha[k], avx2, sc, &job.cls[k])) {
          return Corrupt("bad distribution");
        }
      }
      // Without anchors class 1 is never decoded; it is class 0.
      if (classes == 1) job.cls[1] = job.cls[0];
      for (int k = 0; k < 2; ++k) job.cls[k].slots = sc->slot_tables.get();
      job.channel0 = cb;
      job.lanes = lanes;
      uint32_t t = 0;
      if (avx2 && lanes == kLanes) DecodeBlockAvx2(job, &t, st, &w, end);
      if (!ScalarBlock<D>(job, t, st, &w, end)) return Corrupt("stream ends early");
    }
    if (w != end) return Corrupt("stream has trailing words");
    for (int j = 0; j < kLanes; ++j) {
      if (st[j] != kRansLow) return Corrupt("stream does not end in its initial state");
    }
    stream = end;
  }
  return Status::Ok();
}

}  // namespace

bool DecodeBlockScalar(const BlockJob& job, uint32_t t0, uint32_t* states, const uint8_t** words,
                       const uint8_t* end) {
  switch (job.spec->dtype) {
    case Dtype::kBfloat16: return ScalarBlock<Dtype::kBfloat16>(job, t0, states, words, end);
    case Dtype::kFloat16: return ScalarBlock<Dtype::kFloat16>(job, t0, states, words, end);
    default: return ScalarBlock<Dtype::kFloat32>(job, t0, states, words, end);
  }
}

Status Decode(std::span<const uint8_t> payload, const PlaneSpec& spec, Scratch* scratch, uint8_t* out,
              bool simd) {
  switch (spec.dtype) {
    case Dtype::kBfloat16: return DecodeTyped<Dtype::kBfloat16>(payload, spec, scratch, out, simd);
    case Dtype::kFloat16: return DecodeTyped<Dtype::kFloat16>(payload, spec, scratch, out, simd);
    case Dtype::kFloat32: return DecodeTyped<Dtype::kFloat32>(payload, spec, scratch, out, simd);
    default: return Status::InvalidArgument("cachegen: plane dtype cannot be quantized");
  }
}

}  // namespace kvd::codec::plane
