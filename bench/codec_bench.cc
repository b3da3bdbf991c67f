// kvd-codec-bench: CacheGen encode / decode throughput per core, side by side in one run
// (docs/compression.md "Speed", docs/benchmarks.md).
//
//   kvd-codec-bench --objects FILE --layout KV,LAYERS,TOKENS,HIDDEN[,DTYPE] [--reps N]
//   kvd-codec-bench --synthetic            (KV-like random data, 2x32x256x1024 bf16)
//
// Single thread. Throughput is raw KV bytes per second of this thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID), so a busy shared machine does not deflate it; wall-clock
// figures and the load average are printed beside it. Rows: encode and decode at
// several bin counts, with and without anchors, the AVX2 and the scalar decoder, and the
// entropy-coder comparison (32-lane interleaved rANS vs one binary arithmetic coder per
// (plane, channel) stream, as lmcache's CacheGen kernels code it) on the same symbols
// and distributions.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "arith_coder.h"
#include "codec/codec.h"
#include "codec/float_bits.h"
#include "codec/format.h"
#include "codec/model_core.h"
#include "codec/plane.h"

using namespace kvd;         // NOLINT
using namespace kvd::codec;  // NOLINT

namespace {

double ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double Wall() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct Timing {
  double cpu = 0, wall = 0;
};

template <typename Fn>
Timing Time(int reps, Fn fn) {
  fn();  // warm up
  Timing t;
  const double c0 = ThreadCpu(), w0 = Wall();
  for (int r = 0; r < reps; ++r) fn();
  t.cpu = (ThreadCpu() - c0) / reps;
  t.wall = (Wall() - w0) / reps;
  return t;
}

std::vector<uint8_t> Synthetic(const ObjectLayout& l) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  const auto& g = l.groups[0];
  std::vector<uint8_t> obj(l.Bytes());
  for (uint32_t p = 0; p < g.kv_size * g.layers; ++p) {
    std::vector<float> scale(g.hidden), prev(g.hidden, 0);
    for (auto& s : scale) s = 0.2f + std::fabs(nd(rng));
    for (int o = 0; o < 4; ++o) scale[(p * 37 + o * 101) % g.hidden] *= 20;
    for (uint32_t t = 0; t < g.tokens; ++t) {
      for (uint32_t c = 0; c < g.hidden; ++c) {
        prev[c] = 0.9f * prev[c] + 0.43f * nd(rng);
        const uint16_t h = FloatToBf16(scale[c] * prev[c]);
        memcpy(&obj[((size_t{p} * g.tokens + t) * g.hidden + c) * 2], &h, 2);
      }
    }
  }
  return obj;
}

void Row(const char* name, double bytes, const Timing& t, double load, const char* note = "") {
  printf("| %-58s | %8.3f | %8.3f | %5.1f | %s\n", name, bytes / t.cpu / 1e9, bytes / t.wall / 1e9, load, note);
}

double Load() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

// Quantized symbols and fitted distributions of every plane, for the coder comparison.
struct PlaneSymbols {
  uint32_t tokens, channels;
  int alphabet, prob_bits;
  std::vector<uint8_t> sym;         // [t][c]
  std::vector<uint16_t> freq;       // [c][alphabet]
};

PlaneSymbols Quantize(const uint8_t* data, uint32_t T, uint32_t C, uint32_t bins) {
  PlaneSymbols ps;
  ps.tokens = T;
  ps.channels = C;
  const int m = static_cast<int>(bins / 2) - 1;
  ps.alphabet = 2 * m + 1;
  ps.prob_bits = ProbBitsFor(ps.alphabet);
  ps.sym.resize(size_t{T} * C);
  std::vector<uint32_t> hist(size_t{C} * 64, 0);
  for (uint32_t t = 0; t < T; ++t) {
    float amax = 0;
    for (uint32_t c = 0; c < C; ++c) {
      uint16_t h;
      memcpy(&h, data + (size_t{t} * C + c) * 2, 2);
      amax = std::max(amax, std::fabs(Bf16ToFloat(h)));
    }
    const float step = Bf16ToFloat(FloatToBf16Up(amax)) / m;
    for (uint32_t c = 0; c < C; ++c) {
      uint16_t h;
      memcpy(&h, data + (size_t{t} * C + c) * 2, 2);
      int q = step > 0 ? static_cast<int>(std::nearbyint(Bf16ToFloat(h) / step)) : 0;
      q = std::clamp(q, -m, m) + m;
      ps.sym[size_t{t} * C + c] = static_cast<uint8_t>(q);
      hist[size_t{c} * 64 + q]++;
    }
  }
  ps.freq.resize(size_t{C} * ps.alphabet);
  for (uint32_t c = 0; c < C; ++c) {
    uint8_t center, shape;
    plane::FitChannel(&hist[size_t{c} * 64], ps.alphabet, ps.prob_bits, &center, &shape);
    BuildFrequencies(center, shape, ps.alphabet, ps.prob_bits, &ps.freq[size_t{c} * ps.alphabet]);
  }
  return ps;
}

}  // namespace

int main(int argc, char** argv) {
  ObjectLayout layout;
  std::string file;
  int reps = 5;
  bool synthetic = false;
  bool decode_only = false;  // profiling aids: encode once, decode --reps times; or
  bool encode_only = false;  // encode --reps times
  uint32_t only_bins = 16, only_anchor = 0, only_anchor_bins = 0;  // their settings
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--objects" && i + 1 < argc) {
      file = argv[++i];
    } else if (a == "--layout" && i + 1 < argc) {
      GroupShape g;
      unsigned kv, l, t, h;
      if (sscanf(argv[++i], "%u,%u,%u,%u", &kv, &l, &t, &h) != 4) return 2;
      g = {kv, l, t, h, Dtype::kBfloat16};
      layout.groups.push_back(g);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (a == "--encode-only") {
      encode_only = true;
    } else if (a == "--decode-only") {
      decode_only = true;
    } else if (a == "--bins" && i + 1 < argc) {
      only_bins = static_cast<uint32_t>(atoi(argv[++i]));
    } else if (a == "--anchor" && i + 1 < argc) {
      only_anchor = static_cast<uint32_t>(atoi(argv[++i]));
    } else if (a == "--anchor-bins" && i + 1 < argc) {
      only_anchor_bins = static_cast<uint32_t>(atoi(argv[++i]));
    } else if (a == "--synthetic") {
      synthetic = true;
    } else {
      fprintf(stderr,
              "usage: kvd-codec-bench --objects FILE --layout KV,L,T,H | --synthetic [--reps N]\n"
              "       [--encode-only | --decode-only [--bins N] [--anchor G] [--anchor-bins B]]\n");
      return 2;
    }
  }
  std::vector<uint8_t> all;
  if (synthetic || file.empty()) {
    layout.groups = {{2, 32, 256, 1024, Dtype::kBfloat16}};
    all = Synthetic(layout);
  } else {
    std::ifstream f(file, std::ios::binary);
    all.assign(std::istreambuf_iterator<char>(f), {});
  }
  const uint64_t ob = layout.Bytes();
  if (layout.groups.empty() || all.size() < ob || all.size() % ob) {
    fprintf(stderr, "objects file is not a whole number of objects of the layout\n");
    return 2;
  }
  const size_t n = all.size() / ob;
  const double bytes = static_cast<double>(all.size());
  printf("kvd-codec-bench: %zu objects of %s (%.1f MB), %d reps, AVX2 %s\n", n, layout.Describe().c_str(),
         bytes / 1e6, reps, plane::HaveAvx2() ? "yes" : "no");
  printf("| %-58s | GB/s/core (CPU time) | GB/s (wall) | load | notes\n", "operation (raw KV bytes)");
  printf("|---|---|---|---|---|\n");
  std::vector<std::vector<uint8_t>> enc(n);
  std::vector<uint8_t> out(ob);
  CachegenOptions only;
  only.bins = BinSchedule::Uniform(only_bins);
  only.anchor_group = only_anchor;
  only.anchor_bins = only_anchor_bins;
  const std::string only_name = std::to_string(only_bins) + " bins" +
                                (only_anchor ? ", anchors G=" + std::to_string(only_anchor) : std::string());
  if (encode_only) {
    const CachegenOptions& o = only;
    Row(("encode, " + only_name).c_str(), bytes, Time(reps, [&] {
          for (size_t i = 0; i < n; ++i) enc[i] = *Encode(layout, {all.data() + i * ob, ob}, o);
        }), Load());
    return 0;
  }
  if (decode_only) {
    const CachegenOptions& o = only;
    for (size_t i = 0; i < n; ++i) enc[i] = *Encode(layout, {all.data() + i * ob, ob}, o);
    Row(("decode, " + only_name).c_str(), bytes, Time(reps, [&] {
          for (size_t i = 0; i < n; ++i) {
            if (!Decode(enc[i], out, &layout).ok()) abort();
          }
        }), Load());
    return 0;
  }
  // The floor: memcpy of the same objects into the same output buffer.
  Row("memcpy (raw object into the output buffer)", bytes, Time(reps, [&] {
        for (size_t i = 0; i < n; ++i) memcpy(out.data(), all.data() + i * ob, ob);
      }), Load());
  // lmcache's fp8 serde (1 byte per element, no entropy coding), for parity.
  {
    std::vector<uint8_t> f8(Fp8EncodedBytes(layout) * n);
    const uint64_t fb = Fp8EncodedBytes(layout);
    Row("fp8 e4m3fn encode", bytes, Time(reps, [&] {
          for (size_t i = 0; i < n; ++i) {
            if (!Fp8Encode(layout, {all.data() + i * ob, ob}, Fp8Kind::kE4m3fn, {f8.data() + i * fb, fb}).ok()) abort();
          }
        }), Load(), "8 bits/value");
    Row("fp8 e4m3fn decode", bytes, Time(reps, [&] {
          for (size_t i = 0; i < n; ++i) {
            if (!Fp8Decode({f8.data() + i * fb, fb}, layout, Fp8Kind::kE4m3fn, out).ok()) abort();
          }
        }), Load());
  }
  struct Cfg {
    const char* name;
    uint32_t bins, anchor, abins;
  };
  for (const Cfg& c : {Cfg{"16 bins", 16, 0, 0}, Cfg{"32 bins", 32, 0, 0}, Cfg{"16 bins, anchors G=10 (32)", 16, 10, 32}}) {
    CachegenOptions o;
    o.bins = BinSchedule::Uniform(c.bins);
    o.anchor_group = c.anchor;
    o.anchor_bins = c.abins;
    o.threads = 1;
    const Timing te = Time(reps, [&] {
      for (size_t i = 0; i < n; ++i) enc[i] = *Encode(layout, {all.data() + i * ob, ob}, o);
    });
    size_t total = 0;
    for (const auto& e : enc) total += e.size();
    char note[96];
    snprintf(note, sizeof note, "%.3f bits/value", 8.0 * total / (bytes / 2));
    Row((std::string("encode, ") + c.name).c_str(), bytes, te, Load(), note);
    const Timing td = Time(reps, [&] {
      for (size_t i = 0; i < n; ++i) {
        if (!Decode(enc[i], out, &layout).ok()) abort();
      }
    });
    Row((std::string("decode, ") + c.name + ", AVX2").c_str(), bytes, td, Load());
  }
  // The plane decoder alone, object after object with a fresh Scratch each (as Decode
  // gives every object): its tables shared by channels of the same distribution (the
  // default), built for every block (slot_table_limit 0: how the decoder worked before
  // tables were shared), and the scalar reference; with anchors also slot tables for
  // both classes (search_weight 0: how the decoder worked before the anchors' search
  // tables); the same bytes out.
  for (const Cfg& c : {Cfg{"16 bins", 16, 0, 0}, Cfg{"32 bins", 32, 0, 0}, Cfg{"16 bins, anchors G=10 (32)", 16, 10, 32}}) {
    CachegenOptions o;
    o.bins = BinSchedule::Uniform(c.bins);
    o.anchor_group = c.anchor;
    o.anchor_bins = c.abins;
    for (size_t i = 0; i < n; ++i) enc[i] = *Encode(layout, {all.data() + i * ob, ob}, o);
    const auto& g = layout.groups[0];
    std::vector<uint8_t> pout(size_t{g.tokens} * g.hidden * 2);
    auto decode_planes = [&](bool simd, size_t limit, uint32_t search_weight = plane::Scratch{}.search_weight) {
      for (size_t i = 0; i < n; ++i) {
        plane::Scratch sc;
        sc.slot_table_limit = limit;
        sc.search_weight = search_weight;
        auto h = format::ReadHeader(enc[i]);
        size_t at = h->TablesEnd();
        for (const auto& e : h->planes) {
          const plane::PlaneSpec ps = plane::PlaneSpecOf(g, e, *h);
          if (e.mode == format::PlaneMode::kCachegen &&
              !plane::Decode({enc[i].data() + at, e.payload_bytes}, ps, &sc, pout.data(), simd).ok()) {
            abort();
          }
          at += e.payload_bytes;
        }
      }
    };
    const size_t shared = plane::Scratch{}.slot_table_limit;
    Row((std::string("decode planes, ") + c.name + ", AVX2, shared tables").c_str(), bytes,
        Time(reps, [&] { decode_planes(true, shared); }), Load());
    Row((std::string("decode planes, ") + c.name + ", AVX2, tables per block").c_str(), bytes,
        Time(reps, [&] { decode_planes(true, 0); }), Load());
    if (c.anchor != 0) {
      Row((std::string("decode planes, ") + c.name + ", AVX2, shared, slot tables only").c_str(), bytes,
          Time(reps, [&] { decode_planes(true, shared, 0); }), Load());
    }
    Row((std::string("decode planes, ") + c.name + ", scalar reference").c_str(), bytes,
        Time(reps, [&] { decode_planes(false, shared); }), Load());
  }
  // Entropy coders alone, same symbols and distributions: 32-lane rANS (the codec's
  // streams, decode to symbols) vs a binary arithmetic coder per (plane, channel).
  {
    const auto& g = layout.groups[0];
    const size_t plane_bytes = size_t{g.tokens} * g.hidden * 2;
    std::vector<PlaneSymbols> planes;
    for (size_t i = 0; i < n; ++i) {
      for (uint32_t p = 0; p < g.kv_size * g.layers; ++p) {
        planes.push_back(Quantize(all.data() + i * ob + p * plane_bytes, g.tokens, g.hidden, 16));
      }
    }
    std::vector<bench::ArithStreams> ac(planes.size());
    const Timing tae = Time(reps, [&] {
      for (size_t i = 0; i < planes.size(); ++i) {
        const auto& ps = planes[i];
        ac[i] = bench::ArithEncode(ps.sym.data(), ps.tokens, ps.channels, ps.freq.data(), ps.alphabet, ps.prob_bits);
      }
    });
    size_t ac_bytes = 0;
    for (const auto& a : ac) ac_bytes += a.bytes.size() + 2 * a.lengths.size();
    std::vector<uint8_t> syms;
    const Timing tad = Time(reps, [&] {
      for (size_t i = 0; i < planes.size(); ++i) {
        const auto& ps = planes[i];
        syms.resize(ps.sym.size());
        bench::ArithDecode(ac[i], ps.tokens, ps.channels, ps.freq.data(), ps.alphabet, ps.prob_bits, syms.data());
      }
    });
    for (size_t i = 0; i < planes.size(); ++i) {
      const auto& ps = planes[i];
      syms.resize(ps.sym.size());
      bench::ArithDecode(ac[i], ps.tokens, ps.channels, ps.freq.data(), ps.alphabet, ps.prob_bits, syms.data());
      if (syms != ps.sym) {
        fprintf(stderr, "arithmetic coder round trip failed on plane %zu\n", i);
        return 1;
      }
    }
    char note[96];
    snprintf(note, sizeof note, "%.3f bits/value payload", 8.0 * ac_bytes / (bytes / 2));
    Row("arith coder encode, 16 bins (symbols only)", bytes, tae, Load(), note);
    Row("arith coder decode, 16 bins (symbols only)", bytes, tad, Load());
  }
  return 0;
}
