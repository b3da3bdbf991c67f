// kvd-codec-gpu-check: the CUDA CacheGen decoder against the CPU decoders on the same
// encoded objects (run by scripts/gpu-check.sh on a machine with an NVIDIA GPU).
//
// For each case (bins, anchors, dtypes, odd channel counts, several streams per plane):
// encode on the CPU, decode with codec::Decode (AVX2/scalar), with the host emulator of
// the kernel (EmulateDeviceDecode) and with the GPU (DecodeOnGpu); all three must be
// equal byte for byte, and a damaged stream must be refused by the GPU. Then the
// kernel's throughput on a Llama-3-8B-sized object (2 x 32 x 256 x 1024 bf16, 32 MiB).
// Prints one line per case and "CODEC GPU: PASS" or "CODEC GPU: FAIL ..."; exit 0 on PASS.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/device_decode.h"
#include "codec/float_bits.h"
#include "codec/format.h"

using namespace kvd;         // NOLINT
using namespace kvd::codec;  // NOLINT

namespace {

std::vector<uint8_t> KvLike(const GroupShape& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  const uint32_t isz = DtypeBytes(g.dtype);
  std::vector<uint8_t> obj(g.Bytes());
  for (uint32_t p = 0; p < g.kv_size * g.layers; ++p) {
    std::vector<float> scale(g.hidden), prev(g.hidden, 0);
    for (uint32_t c = 0; c < g.hidden; ++c) scale[c] = (c % 61 == 5 ? 4.0f : 1.0f) * (0.2f + std::fabs(nd(rng)));
    for (uint32_t t = 0; t < g.tokens; ++t) {
      for (uint32_t c = 0; c < g.hidden; ++c) {
        prev[c] = 0.9f * prev[c] + 0.43f * nd(rng);
        const float v = scale[c] * prev[c];
        uint8_t* dst = obj.data() + ((uint64_t{p} * g.tokens + t) * g.hidden + c) * isz;
        if (g.dtype == Dtype::kBfloat16) {
          const uint16_t h = FloatToBf16(v);
          memcpy(dst, &h, 2);
        } else if (g.dtype == Dtype::kFloat16) {
          const uint16_t h = FloatToFp16(v);
          memcpy(dst, &h, 2);
        } else {
          memcpy(dst, &v, 4);
        }
      }
    }
  }
  return obj;
}

}  // namespace

int main() {
  if (!GpuDecoderBuilt()) {
    printf("CODEC GPU: FAIL (this build has no CUDA decoder)\n");
    return 1;
  }
  struct Case {
    const char* name;
    GroupShape g;
    uint32_t bins, anchor, abins;
  };
  const Case cases[] = {
      {"bf16 6x256x128, 16 bins", {2, 6, 256, 128, Dtype::kBfloat16}, 16, 0, 0},
      {"bf16 6x256x128, 32 bins", {2, 6, 256, 128, Dtype::kBfloat16}, 32, 0, 0},
      {"bf16 4x256x128, anchors G=10 (16/32)", {2, 4, 256, 128, Dtype::kBfloat16}, 16, 10, 32},
      {"fp16 2x100x200, 24 bins", {2, 2, 100, 200, Dtype::kFloat16}, 24, 0, 0},
      {"fp32 1x64x1000 (4 streams), 64 bins", {1, 1, 64, 1000, Dtype::kFloat32}, 64, 7, 8},
      {"bf16 2x1x37, 8 bins", {2, 2, 1, 37, Dtype::kBfloat16}, 8, 0, 0},
  };
  {
    ObjectLayout l;
    l.groups = {{2, 1, 8, 32, Dtype::kBfloat16}};
    std::vector<uint8_t> obj(l.Bytes(), 0), out(l.Bytes());
    const Status st = DecodeOnGpu(*Encode(l, obj, CachegenOptions{}), out);
    if (st.code() == StatusCode::kUnavailable) {
      printf("CODEC GPU: FAIL (%s)\n", st.ToString().c_str());
      return 1;
    }
  }
  bool ok = true;
  for (const Case& c : cases) {
    ObjectLayout l;
    l.groups = {c.g};
    const auto obj = KvLike(c.g, 3);
    CachegenOptions o;
    o.bins = BinSchedule::Uniform(c.bins);
    o.anchor_group = c.anchor;
    o.anchor_bins = c.abins;
    auto enc = Encode(l, obj, o);
    if (!enc.ok()) {
      printf("%-40s FAIL encode: %s\n", c.name, enc.status().ToString().c_str());
      ok = false;
      continue;
    }
    std::vector<uint8_t> cpu(obj.size()), emu(obj.size()), gpu(obj.size());
    const Status s1 = Decode(*enc, cpu, &l);
    const Status s2 = EmulateDeviceDecode(*enc, emu);
    const Status s3 = DecodeOnGpu(*enc, gpu);
    const bool same = s1.ok() && s2.ok() && s3.ok() && cpu == emu && cpu == gpu;
    size_t first = 0;
    while (first < cpu.size() && cpu[first] == gpu[first]) ++first;
    printf("%-40s %s%s%s\n", c.name, same ? "ok" : "FAIL", s3.ok() ? "" : (" gpu: " + s3.ToString()).c_str(),
           same || !s3.ok() ? "" : (" first difference at byte " + std::to_string(first)).c_str());
    ok = ok && same;
  }
  // A damaged stream word (checksums recomputed) must be refused on the GPU as well.
  {
    ObjectLayout l;
    l.groups = {{2, 2, 256, 128, Dtype::kBfloat16}};
    const auto obj = KvLike(l.groups[0], 4);
    CachegenOptions o;
    o.bins = BinSchedule::Uniform(16);
    auto enc = *Encode(l, obj, o);
    auto plan = PrepareDeviceDecode(enc);
    std::vector<uint8_t> out(obj.size());
    const auto& j = plan->jobs[0];
    enc[j.stream_offset + j.stream_bytes - 3] ^= 0x21;  // a word near the end
    std::vector<uint8_t> cpu(obj.size());
    const bool cpu_refuses = !Decode(enc, cpu, &l).ok();  // the checksum catches it first
    printf("%-40s %s\n", "damaged object refused", cpu_refuses && !DecodeOnGpu(enc, out).ok() ? "ok" : "FAIL");
    ok = ok && cpu_refuses && !DecodeOnGpu(enc, out).ok();
  }
  // Throughput of the kernel alone (the object already on the device is not timed apart:
  // DecodeOnGpu reports the kernel's own time).
  {
    ObjectLayout l;
    l.groups = {{2, 32, 256, 1024, Dtype::kBfloat16}};
    const auto obj = KvLike(l.groups[0], 5);
    for (uint32_t bins : {16u, 32u}) {
      CachegenOptions o;
      o.bins = BinSchedule::Uniform(bins);
      auto enc = *Encode(l, obj, o);
      std::vector<uint8_t> gpu(obj.size()), cpu(obj.size());
      double best = 1e9;
      Status st;
      for (int r = 0; r < 5; ++r) {
        double secs = 0;
        st = DecodeOnGpu(enc, gpu, &secs);
        if (!st.ok()) break;
        best = std::min(best, secs);
      }
      const bool same = st.ok() && Decode(enc, cpu, &l).ok() && cpu == gpu;
      printf("%-40s %s: kernel %.3f ms = %.1f GB/s of raw KV (%.2f bits/value)\n",
             ("Llama-3-8B object, " + std::to_string(bins) + " bins").c_str(), same ? "ok" : "FAIL", best * 1e3,
             obj.size() / best / 1e9, 8.0 * enc.size() / (obj.size() / 2));
      ok = ok && same;
    }
  }
  printf("CODEC GPU: %s\n", ok ? "PASS" : "FAIL (the GPU decoder differs from the CPU reference; see above)");
  return ok ? 0 : 1;
}
