// kvd-blend-gpu-check: CacheBlend's CUDA scatter + re-RoPE (src/blend/cuda/) on a GPU,
// against the CPU scatter (blend::ExecuteScatter) byte for byte, and timed against a pinned
// cudaMemcpy H2D of the same bytes. Run by scripts/gpu-check.sh.
//
// For each layout (FlashAttention NHD/HND, FlashInfer, packed [K|V], MLA, fp8, fp32 GPT-J,
// MiniMax-M3 main + indexer) it registers random paged caches on the device and a host
// mirror, stores random chunk objects in pinned host memory (as kvd's L1 is for GPU
// instances), puts them at random request positions (not block-aligned, shifted, one left
// at its own position), runs the CPU scatter on the mirror and the kernel on the device,
// and compares every byte of every registered tensor. Two ways of feeding the kernel:
//   staged     the objects copied H2D into device staging first, then one launch;
//   zero-copy  one launch reading the pinned host objects over the bus.
// Each is timed as kvd would run a request (median of 5): staged, the objects' copies
// enqueued first and the plan built on the host while they run; then the plan's blob
// uploaded and one launch; the stream's time is compared with one cudaMemcpyAsync H2D of
// the same bytes from pinned memory. The host's plan build time is printed too.
// PASS: every byte equal in both modes, and on the large layouts the better mode reaches
// >= 0.8x of the H2D copy (issue 24's goal). Exit status 0 on PASS.
#include <cuda_runtime.h>  // the typed cudaMalloc / cudaHostAlloc overloads

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "blend/cuda/blend_device_plan.h"
#include "blend/cuda/blend_kernels.h"
#include "blend/rope.h"
#include "blend/scatter.h"
#include "layout/layout_test_util.h"

namespace {

using namespace kvd;                     // NOLINT
using namespace kvd::layout::test_util;  // NOLINT
using kvd::blend::GroupRope;
using kvd::blend::RopeStyle;

bool g_failed = false;
// --emulate: no CUDA call at all; "device" memory is host memory and the kernel is the host
// emulator, so the check's own harness (layouts, matches, plans, comparison) runs on a CPU.
bool g_emulate = false;

#define CUDA_OK(x)                                                                            \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

void* DevAlloc(size_t n) {
  void* p = nullptr;
  if (g_emulate) return std::aligned_alloc(256, (n + 255) / 256 * 256);
  CUDA_OK(cudaMalloc(&p, n));
  return p;
}
void DevFree(void* p) {
  if (g_emulate) return std::free(p);
  CUDA_OK(cudaFree(p));
}
// Pinned and mapped host memory, as kvd's L1 is for GPU instances.
void* PinnedAlloc(size_t n) {
  void* p = nullptr;
  if (g_emulate) return std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  CUDA_OK(cudaHostAlloc(&p, n, cudaHostAllocMapped));
  return p;
}
void PinnedFree(void* p) {
  if (g_emulate) return std::free(p);
  CUDA_OK(cudaFreeHost(p));
}
void* MappedAddress(void* host) {
  if (g_emulate) return host;
  void* d = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(&d, host, 0));
  return d;
}
void CopyAsync(void* dst, const void* src, size_t n, cudaStream_t s) {
  if (g_emulate) {
    std::memcpy(dst, src, n);
    return;
  }
  CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s));
}
void CopySync(void* dst, const void* src, size_t n) {
  if (g_emulate) {
    std::memcpy(dst, src, n);
    return;
  }
  CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
}

// Milliseconds of what `work` enqueues on `s` (CUDA events; host time when emulating).
template <typename F>
float TimeMs(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, F work) {
  if (g_emulate) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  CUDA_OK(cudaEventRecord(e0, s));
  work();
  CUDA_OK(cudaEventRecord(e1, s));
  CUDA_OK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  return ms;
}

// A fp32 cos/sin cache [positions, rot] as an engine registers it.
blend::RopeTable MakeTable(int64_t positions, int64_t rot) {
  std::vector<float> v(static_cast<size_t>(positions * rot));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t j = 0; j < rot; ++j) {
      const int64_t i = j % (rot / 2);
      const double a = static_cast<double>(p) * std::pow(500000.0, -2.0 * i / rot);
      v[p * rot + j] = static_cast<float>(j < rot / 2 ? std::cos(a) : std::sin(a));
    }
  }
  const int64_t shape[2] = {positions, rot};
  auto t = blend::RopeTable::FromCosSinCache(
      {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4}, "float32", shape);
  if (!t.ok()) {
    std::fprintf(stderr, "rope table: %s\n", t.status().ToString().c_str());
    std::exit(2);
  }
  return std::move(t).value();
}

void FillRandom(uint8_t* p, uint64_t n, std::mt19937_64& rng) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

struct Case {
  std::string name;
  TestModel model;
  int64_t chunk = 256;
  int64_t tpb = 16;
  int64_t matches = 4;
  std::vector<GroupRope> ropes;  // per kernel group
  bool timed = false;            // large enough for the throughput goal
};

GroupRope Rope(const blend::RopeTable* t, int64_t head, RopeStyle s, int64_t offset = 0,
               blend::KvQuant q = blend::KvQuant::kNone) {
  GroupRope r;
  r.table = t;
  r.rot_offset = offset;
  r.rot_width = t->rot_dim();
  r.head_size = head;
  r.style = s;
  r.kv_quant = q;
  return r;
}

float MedianMs(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string name;
  uint64_t bytes = 0;
  double plan_us = 0, h2d_gbs = 0, staged_gbs = 0, zero_gbs = 0;
  bool staged_ok = false, zero_ok = false, timed = false;
};

Row RunCase(Case& c, uint64_t seed) {
  Row row;
  row.name = c.name;
  row.timed = c.timed;
  auto built = layout::BuildLayout(c.model.Descriptors(), c.model.hints, c.model.infos, c.chunk,
                                   c.model.options);
  if (!built.ok()) {
    std::printf("  %s: layout refused: %s\n", c.name.c_str(), built.status().ToString().c_str());
    g_failed = true;
    return row;
  }
  const layout::KvLayout& l = *built;
  std::mt19937_64 rng(seed);

  // Registered tensors: device buffers and their host mirror, the same random bytes.
  std::map<std::string, std::vector<uint8_t>> mirror;
  std::map<std::string, uint8_t*> dev;
  for (const auto& [name, n] : c.model.segment_bytes) {
    auto& m = mirror[name];
    m.resize(n);
    FillRandom(m.data(), n, rng);
    dev[name] = static_cast<uint8_t*>(DevAlloc(n));
  }
  auto reset_device = [&] {
    for (const auto& [name, m] : mirror) CopySync(dev[name], m.data(), m.size());
  };
  std::vector<uint8_t*> host_bases, dev_bases;
  std::vector<uint64_t> sizes;
  for (const auto& t : c.model.tensors) {
    host_bases.push_back(mirror[t.desc.shm_name].data());
    dev_bases.push_back(dev[t.desc.shm_name]);
    sizes.push_back(mirror[t.desc.shm_name].size());
  }

  // Matches: old positions whole chunks, new positions not block-aligned; the last match
  // partial and the second at its own position.
  const int64_t nm = c.matches;
  const uint64_t all_objects = static_cast<uint64_t>(nm) * l.object_bytes;
  std::vector<blend::BlendMatch> host_m, staged_m, zero_m;
  auto* pinned = static_cast<uint8_t*>(PinnedAlloc(all_objects));  // objects back to back
  FillRandom(pinned, all_objects, rng);
  auto* staging = static_cast<uint8_t*>(DevAlloc(all_objects));
  int64_t cur = 3 + static_cast<int64_t>(rng() % c.tpb);
  for (int64_t i = 0; i < nm; ++i) {
    blend::BlendMatch m;
    m.n_tokens = i == nm - 1 ? c.chunk - 7 : c.chunk;
    m.old_st = i == 1 ? cur : static_cast<int64_t>(rng() % 8) * c.chunk;
    m.cur_st = cur;
    m.object = pinned + i * l.object_bytes;
    m.object_bytes = l.object_bytes;
    host_m.push_back(m);
    m.object = staging + i * l.object_bytes;
    staged_m.push_back(m);
    m.object = static_cast<uint8_t*>(MappedAddress(pinned + i * l.object_bytes));
    zero_m.push_back(m);
    cur += m.n_tokens + static_cast<int64_t>(rng() % 5);
  }
  // Block tables: distinct shuffled ids (block 0 left out), one per block-id list.
  std::vector<std::vector<int64_t>> ids(l.num_engine_groups);
  int64_t nb = 0;
  for (const auto& g : l.groups) nb = std::max(nb, g.num_blocks);
  for (auto& list : ids) {
    std::vector<int64_t> all;
    for (int64_t b = 1; b < nb; ++b) all.push_back(b);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(static_cast<size_t>((cur + c.tpb - 1) / c.tpb));
    list = all;
  }

  blend::ScatterRequest req;
  req.layout = &l;
  req.tensor_sizes = sizes;
  req.block_ids = ids;
  req.rope = c.ropes;

  // The CPU reference on the mirror.
  req.tensor_bases = host_bases;
  req.matches = host_m;
  auto cpu = blend::PlanScatter(req);
  if (!cpu.ok() || !cpu->ready()) {
    std::printf("  %s: CPU plan: %s\n", c.name.c_str(),
                cpu.ok() ? "not ready" : cpu.status().ToString().c_str());
    g_failed = true;
    return row;
  }
  row.bytes = cpu->bytes();

  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (!g_emulate) {
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
  }
  reset_device();
  blend::ExecuteScatter(*cpu);

  // The baseline: the same bytes from pinned memory in one H2D copy.
  auto* sink = static_cast<uint8_t*>(DevAlloc(row.bytes));
  std::vector<float> h2d;
  for (int it = 0; it < 6; ++it) {
    const float ms = TimeMs(stream, e0, e1, [&] { CopyAsync(sink, pinned, row.bytes, stream); });
    if (it > 0) h2d.push_back(ms);
  }
  row.h2d_gbs = row.bytes / (MedianMs(h2d) * 1e6);

  // One request as kvd would run it: (staged) the objects' H2D copies enqueued first, the
  // plan built on the host while they run, its blob uploaded, one launch. The events time
  // the stream, so a plan that outlasts the copies (or, zero-copy, the plan itself) counts.
  auto run_mode = [&](bool staged, double* gbs, bool* ok) {
    *ok = false;
    req.tensor_bases = dev_bases;
    req.matches = staged ? staged_m : zero_m;
    auto sizing = blend::cuda::BuildBlendDevicePlan(req);
    if (!sizing.ok() || sizing->reason != blend::RetrieveReason::kOk) {
      std::printf("  %s: device plan: %s\n", c.name.c_str(),
                  sizing.ok() ? "not ready" : sizing.status().ToString().c_str());
      return;
    }
    const size_t blob_bytes = sizing->blob.size();
    auto* blob_host = static_cast<uint8_t*>(PinnedAlloc(blob_bytes));
    auto* blob_dev = static_cast<uint8_t*>(DevAlloc(blob_bytes));
    reset_device();
    std::vector<float> times, plan_us;
    bool built = true;
    for (int it = 0; it < 6 && built; ++it) {
      const float ms = TimeMs(stream, e0, e1, [&] {
        if (staged) {
          for (int64_t i = 0; i < nm; ++i) {
            CopyAsync(staging + i * l.object_bytes, pinned + i * l.object_bytes, l.object_bytes,
                      stream);
          }
        }
        const auto t0 = std::chrono::steady_clock::now();
        auto plan = blend::cuda::BuildBlendDevicePlan(req);
        plan_us.push_back(
            std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
        if (!plan.ok() || plan->blob.size() != blob_bytes) {
          built = false;
          return;
        }
        std::memcpy(blob_host, plan->blob.data(), blob_bytes);
        CopyAsync(blob_dev, blob_host, blob_bytes, stream);
        if (g_emulate) {
          blend::cuda::EmulateBlendScatter(*plan);  // reads its own blob: the same bytes
        } else {
          CUDA_OK(blend::cuda::LaunchBlendScatter(
              blend::cuda::BlendArgsAt(*plan, reinterpret_cast<uintptr_t>(blob_dev)), stream));
        }
      });
      if (it > 0) times.push_back(ms);
    }
    PinnedFree(blob_host);
    DevFree(blob_dev);
    if (!built) {
      std::printf("  %s: the device plan changed between builds\n", c.name.c_str());
      return;
    }
    *gbs = row.bytes / (MedianMs(times) * 1e6);
    row.plan_us = MedianMs(plan_us);
    // Every byte of every registered tensor against the CPU scatter's mirror.
    *ok = true;
    std::vector<uint8_t> got;
    for (const auto& [name, m] : mirror) {
      got.resize(m.size());
      CopySync(got.data(), dev[name], m.size());
      if (got != m) {
        size_t first = 0, diff = 0;
        for (size_t i = 0; i < m.size(); ++i) {
          if (got[i] != m[i] && diff++ == 0) first = i;
        }
        std::printf("  %s (%s): %s: %zu byte(s) differ, first at %zu\n", c.name.c_str(),
                    staged ? "staged" : "zero-copy", name.c_str(), diff, first);
        *ok = false;
      }
    }
  };
  run_mode(true, &row.staged_gbs, &row.staged_ok);
  run_mode(false, &row.zero_gbs, &row.zero_ok);

  DevFree(sink);
  DevFree(staging);
  PinnedFree(pinned);
  for (auto& [name, p] : dev) DevFree(p);
  if (!g_emulate) {
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    CUDA_OK(cudaStreamDestroy(stream));
  }
  return row;
}

Case NewCase(std::string name, TestModel model) {
  Case c;
  c.name = std::move(name);
  c.model = std::move(model);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--emulate") {
      g_emulate = true;
    } else {
      std::printf("usage: kvd-blend-gpu-check [--emulate]\n");
      return 2;
    }
  }
  if (g_emulate) {
    std::printf("kvd-blend-gpu-check --emulate: the host emulator, no GPU (timings meaningless)\n");
  } else {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      std::printf("kvd-blend-gpu-check: no CUDA device\nBLEND GPU CHECK: FAIL\n");
      return 1;
    }
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    std::printf("kvd-blend-gpu-check on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  }

  const blend::RopeTable rot128 = MakeTable(8192, 128);
  const blend::RopeTable rot64 = MakeTable(8192, 64);
  std::vector<Case> cases;
  {  // Llama-3-8B per rank: 32 layers, 8 KV heads x 128, blocks of 16, bf16, NeoX.
    Case c = NewCase("llama8b fa NHD bf16 neox", FlashAttention(32, 160, 16, 8, 128, Order::kNhd));
    c.matches = 8;
    c.ropes = {Rope(&rot128, 128, RopeStyle::kNeox)};
    c.timed = true;
    cases.push_back(std::move(c));
  }
  {
    Case c = NewCase("llama8b fa HND fp16 gptj",
                     FlashAttention(32, 160, 16, 8, 128, Order::kHndPhysical, "float16"));
    c.matches = 8;
    c.ropes = {Rope(&rot128, 128, RopeStyle::kGptj)};
    c.timed = true;
    cases.push_back(std::move(c));
  }
  {
    Case c = NewCase("flashinfer NHD bf16", FlashInfer(8, 96, 16, 4, 128, Order::kNhd));
    c.ropes = {Rope(&rot128, 128, RopeStyle::kNeox)};
    cases.push_back(std::move(c));
  }
  {
    Case c = NewCase("flashinfer HND-view bf16", FlashInfer(8, 96, 16, 4, 128, Order::kHndView));
    c.ropes = {Rope(&rot128, 128, RopeStyle::kNeox)};
    cases.push_back(std::move(c));
  }
  {
    Case c = NewCase("fa NHD fp32 gptj", FlashAttention(8, 96, 16, 2, 64, Order::kNhd, "float32"));
    c.ropes = {Rope(&rot64, 64, RopeStyle::kGptj)};
    cases.push_back(std::move(c));
  }
  {
    Case c =
        NewCase("fa NHD fp8e4m3 neox", FlashAttention(8, 96, 16, 8, 128, Order::kNhd, "uint8"));
    c.ropes = {Rope(&rot128, 128, RopeStyle::kNeox, 0, blend::KvQuant::kFp8E4m3)};
    cases.push_back(std::move(c));
  }
  {
    Case c = NewCase("packed [K|V] HND bf16", PackedKv(8, 96, 16, 2, 128, true));
    c.ropes = {Rope(&rot128, 128, RopeStyle::kNeox)};
    cases.push_back(std::move(c));
  }
  {  // DeepSeek-style MLA latent: 512 + 64 rope dims (GPT-J pairs), blocks of 64.
    Case c = NewCase("mla 576 bf16 gptj", Mla(16, 40, 64));
    c.tpb = 64;
    c.ropes = {Rope(&rot64, 0, RopeStyle::kGptj, 512)};
    cases.push_back(std::move(c));
  }
  {  // MiniMax-M3 per TP=8 rank: packed main (64 of 128 dims NeoX) + key-only indexer.
    Case c = NewCase("minimax-m3 main+indexer bf16",
                     MiniMaxM3(48, M3Main::kPackedHnd, "bfloat16", true));
    c.tpb = 128;
    c.matches = 8;
    c.ropes = {Rope(&rot64, 128, RopeStyle::kNeox), Rope(&rot64, 128, RopeStyle::kNeox)};
    c.timed = true;
    cases.push_back(std::move(c));
  }

  std::vector<Row> rows;
  uint64_t seed = 1;
  for (auto& c : cases) {
    std::printf("  running %s ...\n", c.name.c_str());
    std::fflush(stdout);
    rows.push_back(RunCase(c, seed++));
  }
  std::printf("\n%-30s %9s %8s %9s %16s %16s %s\n", "layout", "MiB", "plan us", "H2D GB/s",
              "staged GB/s (x)", "zero-copy (x)", "bytes");
  bool perf_ok = true;
  for (const auto& r : rows) {
    const double s = r.h2d_gbs > 0 ? r.staged_gbs / r.h2d_gbs : 0;
    const double z = r.h2d_gbs > 0 ? r.zero_gbs / r.h2d_gbs : 0;
    const bool exact = r.staged_ok && r.zero_ok;
    if (!exact) g_failed = true;
    const bool goal = std::max(s, z) >= 0.8;
    if (r.timed && !goal && !g_emulate) perf_ok = false;
    std::printf("%-30s %9.1f %8.0f %9.1f %9.1f (%.2f) %9.1f (%.2f) %s%s\n", r.name.c_str(),
                r.bytes / 1048576.0, r.plan_us, r.h2d_gbs, r.staged_gbs, s, r.zero_gbs, z,
                exact ? "equal" : "DIFFER", r.timed && !g_emulate && !goal ? "  below 0.8x" : "");
  }
  const bool pass = !g_failed && perf_ok;
  std::printf("\nBLEND GPU CHECK: %s%s\n", pass ? "PASS" : "FAIL",
              g_failed ? " (bytes differ from the CPU scatter)"
                       : (perf_ok ? "" : " (below 0.8x of a pinned H2D copy)"));
  return pass ? 0 : 1;
}
