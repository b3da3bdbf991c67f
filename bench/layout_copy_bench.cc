// Copy throughput of the layout plans on the CPU path (src/transfer/cpu_copy): a
// request's chunks gathered into objects (store) and scattered back (load), for vLLM's
// CPU cache with the VEC kernels (K transposed [HS][BS], V rows [BS][HS] per block and
// head), side by side with the same K transposed copy done one element at a time (the
// plan with TensorAccess::transposed_element cleared, the generic run-by-run path),
// a FlashAttention-style cache of the same K/V (contiguous token rows) and memcpy of the
// same number of bytes. Single-threaded, best of --reps; GB/s = object bytes / time.
//
// Usage: kvd-layout-bench [--layers N] [--kv-heads N] [--head-size N] [--block-size N]
//                         [--tokens N] [--reps N]
// Defaults: the bench-e2e model (8 layers, 4 KV heads, head size 64, bf16), block size
// 128, 4096 tokens (16 chunks of 256). Owns all its buffers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "layout/layout.h"
#include "transfer/cpu_copy.h"
#include "wire/messages.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvd::layout::KvLayout;
using kvd::transfer::ChunkTask;

template <typename Fn>
double BestSeconds(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

kvd::wire::TensorDescriptor Contiguous(const std::string& name, std::vector<int64_t> shape) {
  kvd::wire::TensorDescriptor d;
  d.memory = kvd::wire::TensorMemory::kCpuShm;
  d.dtype = "bfloat16";
  d.device_uuid = "cpu";
  d.shm_name = name;
  d.stride.assign(shape.size(), 1);
  for (size_t i = shape.size() - 1; i-- > 0;) d.stride[i] = d.stride[i + 1] * shape[i + 1];
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  d.nbytes = static_cast<uint64_t>(n) * 2;
  d.shape = std::move(shape);
  return d;
}

struct Case {
  std::string name;
  KvLayout layout;
  std::vector<std::vector<uint8_t>> tensors;
  std::vector<std::vector<int64_t>> ids;
};

Case Make(const std::string& name, std::vector<kvd::wire::TensorDescriptor> descs,
          kvd::wire::LayoutHints hints, int64_t bs, int64_t nb, int64_t tokens) {
  std::vector<kvd::wire::EngineGroupInfo> infos(1);
  infos[0].engine_group_id = 0;
  infos[0].tokens_per_block = bs;
  for (size_t i = 0; i < descs.size(); ++i) infos[0].layer_indices.push_back(static_cast<int64_t>(i));
  kvd::layout::LayoutOptions opts{kvd::layout::VllmCpuKernels::kVec};
  auto l = kvd::layout::BuildLayout(descs, hints, infos, 256, opts);
  if (!l.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), l.status().ToString().c_str());
    std::exit(1);
  }
  Case c{name, std::move(l).value(), {}, {}};
  std::mt19937_64 rng(7);
  for (const auto& d : descs) {
    std::vector<uint8_t> buf(d.nbytes);
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    c.tensors.push_back(std::move(buf));
  }
  std::vector<int64_t> perm(nb);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(tokens / bs);
  c.ids = {perm};
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 8, nh = 4, hs = 64, bs = 128, tokens = 4096;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int64_t v = std::strtoll(argv[i + 1], nullptr, 10);
    if (a == "--layers") layers = v;
    else if (a == "--kv-heads") nh = v;
    else if (a == "--head-size") hs = v;
    else if (a == "--block-size") bs = v;
    else if (a == "--tokens") tokens = v;
    else if (a == "--reps") reps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  tokens = tokens / 256 * 256;
  if (tokens <= 0 || bs <= 0 || 256 % bs != 0) {
    std::fprintf(stderr, "need --tokens >= 256 and a block size dividing 256\n");
    return 2;
  }
  const int64_t nb = tokens / bs * 2;
  const int64_t chunks = tokens / 256;

  std::vector<kvd::wire::TensorDescriptor> cpu, fa;
  for (int64_t l = 0; l < layers; ++l) {
    cpu.push_back(Contiguous("/cpu" + std::to_string(l), {nb, nh, bs, 2 * hs}));
    fa.push_back(Contiguous("/fa" + std::to_string(l), {2, nb, bs, nh, hs}));
  }
  kvd::wire::LayoutHints cpu_hints, fa_hints;
  cpu_hints.kv_layout = "LBHNC";
  cpu_hints.tokens_per_block = bs;
  fa_hints.kv_layout = "NHD";
  std::vector<Case> cases;
  cases.push_back(Make("vLLM CPU (VEC), K by tiles", cpu, cpu_hints, bs, nb, tokens));
  cases.push_back(Make("vLLM CPU (VEC), K element by element", cpu, cpu_hints, bs, nb, tokens));
  for (auto& g : cases.back().layout.groups) {
    for (auto& a : g.layers) a.transposed_element = 0;
  }
  cases.push_back(Make("FlashAttention NHD (contiguous rows)", fa, fa_hints, bs, nb, tokens));

  const uint64_t obj_bytes = cases[0].layout.object_bytes;
  const uint64_t total = obj_bytes * chunks;
  std::vector<std::vector<uint8_t>> objects(chunks, std::vector<uint8_t>(obj_bytes));
  std::vector<uint8_t> flat_src(total, 1), flat_dst(total);
  std::printf("model: %lld layers, %lld KV heads x %lld, bf16, block size %lld, %lld tokens "
              "(%lld chunks of 256, %.1f MiB of K/V); single thread, best of %d\n",
              (long long)layers, (long long)nh, (long long)hs, (long long)bs, (long long)tokens,
              (long long)chunks, total / 1048576.0, reps);
  double t_memcpy = BestSeconds(reps, [&] { std::memcpy(flat_dst.data(), flat_src.data(), total); });
  std::printf("%-40s %10s %10s %12s %12s\n", "", "store GB/s", "load GB/s", "store/memcpy",
              "load/memcpy");
  std::printf("%-40s %10.2f %10.2f %12.2f %12.2f\n", "memcpy of the same bytes",
              total / t_memcpy / 1e9, total / t_memcpy / 1e9, 1.0, 1.0);
  for (auto& c : cases) {
    std::vector<uint8_t*> bases;
    for (auto& t : c.tensors) bases.push_back(t.data());
    std::vector<ChunkTask> tasks;
    for (int64_t k = 0; k < chunks; ++k) tasks.push_back({k, objects[k].data(), 0});
    double store = BestSeconds(reps, [&] {
      (void)kvd::transfer::GatherChunks(c.layout, bases, c.ids, tasks, 1);
    });
    double load = BestSeconds(reps, [&] {
      (void)kvd::transfer::ScatterChunks(c.layout, bases, c.ids, tasks, 1);
    });
    std::printf("%-40s %10.2f %10.2f %12.2f %12.2f\n", c.name.c_str(), total / store / 1e9,
                total / load / 1e9, t_memcpy / store, t_memcpy / load);
  }
  return 0;
}
