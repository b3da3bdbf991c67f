// kvd-blend-bench scatter: CPU throughput of CacheBlend's per-token scatter with re-RoPE
// (blend::PlanScatter + ExecuteScatter), against a memcpy of the same number of bytes in
// the same run. One request = --matches stored chunks of 256 tokens put at positions
// shifted by a non-block-aligned offset, so every K row is turned (bf16, NeoX, real
// 500000-base frequencies) and every V row copied; "copy only" is the same request with
// old == cur positions (no rotation). Single-threaded, best of --reps; GB/s = destination
// bytes written / time (plan included: it is part of every retrieve).
//
// Layouts: Llama-3-8B-like (32 layers of [2, NB, BS, 8, 128] bf16, block size 16 and
// 128; full rotary 128) and MiniMax-M3-like (one TP=8 rank: 60 packed [NB, 1, 128, 256]
// layers with 64 of 128 dims rotary, plus 57 key-only indexer layers [NB, 128, 128], both
// turned by one table).
//
// Usage: kvd-blend-bench scatter [--matches N] [--reps N] [--layout llama16|llama128|m3]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "blend/scatter.h"
#include "layout/layout.h"
#include "suites.h"
#include "wire/messages.h"

namespace kvd::bench::blend {
namespace {

using Clock = std::chrono::steady_clock;
using kvd::blend::BlendMatch;
using kvd::blend::GroupRope;
using kvd::blend::RopeTable;

constexpr int64_t kChunk = 256;

template <typename Fn>
double BestSeconds(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

wire::TensorDescriptor Tensor(const std::string& name, std::vector<int64_t> shape) {
  wire::TensorDescriptor d;
  d.memory = wire::TensorMemory::kCpuShm;
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

// A cos/sin cache as vLLM builds it, in fp32.
std::unique_ptr<RopeTable> Table(int64_t positions, int64_t rot) {
  std::vector<float> v(static_cast<size_t>(positions * rot));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t j = 0; j < rot; ++j) {
      const int64_t i = j % (rot / 2);
      const double a = static_cast<double>(p) * std::pow(500000.0, -2.0 * i / rot);
      v[p * rot + j] = static_cast<float>(j < rot / 2 ? std::cos(a) : std::sin(a));
    }
  }
  const int64_t shape[2] = {positions, rot};
  auto t = RopeTable::FromCosSinCache(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4), "float32",
      shape);
  if (!t.ok()) {
    std::fprintf(stderr, "scatter bench: %s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  return std::make_unique<RopeTable>(std::move(t).value());
}

struct Model {
  std::string name;
  layout::KvLayout layout;
  std::vector<std::vector<uint8_t>> tensors;  // one buffer per registered tensor
  int64_t tokens_per_block = 0;
  std::vector<GroupRope> ropes;
};

Model Build(const std::string& name, const std::vector<wire::TensorDescriptor>& descs,
            const wire::LayoutHints& hints, const std::vector<wire::EngineGroupInfo>& infos,
            int64_t tpb, std::vector<GroupRope> ropes) {
  Model m;
  m.name = name;
  auto l = layout::BuildLayout(descs, hints, infos, kChunk);
  if (!l.ok()) {
    std::fprintf(stderr, "scatter bench: %s: %s\n", name.c_str(), l.status().ToString().c_str());
    std::exit(1);
  }
  m.layout = std::move(l).value();
  for (const auto& d : descs) m.tensors.emplace_back(d.nbytes, uint8_t{0x3c});  // touched
  m.tokens_per_block = tpb;
  m.ropes = std::move(ropes);
  return m;
}

GroupRope Rope(const RopeTable& t, int64_t head_size) {
  GroupRope r;
  r.table = &t;
  r.rot_width = t.rot_dim();
  r.head_size = head_size;
  return r;
}

// Llama-3-8B: 32 layers of [2, NB, BS, 8, 128] (FlashAttention NHD), bf16.
Model Llama(int64_t bs, int64_t tokens, const RopeTable& rot128) {
  const int64_t nb = tokens / bs + 1;
  std::vector<wire::TensorDescriptor> descs;
  for (int l = 0; l < 32; ++l)
    descs.push_back(Tensor("/llama" + std::to_string(l), {2, nb, bs, 8, 128}));
  wire::LayoutHints hints;
  hints.kv_layout = "NHD";
  hints.tokens_per_block = bs;
  return Build("Llama-8B, block " + std::to_string(bs), descs, hints, {}, bs, {Rope(rot128, 128)});
}

// MiniMax-M3, one TP=8 rank: 60 packed main layers and 57 indexer layers, block 128.
Model M3(int64_t tokens, const RopeTable& rot64) {
  const int64_t nb = tokens / 128 + 1;
  std::vector<wire::TensorDescriptor> descs;
  wire::EngineGroupInfo info;
  info.engine_group_id = 0;
  info.tokens_per_block = 128;
  for (int l = 0; l < 60; ++l) {
    auto d = Tensor("/m3_attn" + std::to_string(l), {nb, 1, 128, 256});
    d.memory = wire::TensorMemory::kCuda;  // the packed GPU form (on CPU memory it is vLLM CPU's)
    d.cuda_mem_handle = d.shm_name;
    info.layer_indices.push_back(static_cast<int64_t>(descs.size()));
    descs.push_back(d);
    if (l >= 3) {
      auto x = Tensor("/m3_index" + std::to_string(l), {nb, 128, 128});
      x.memory = wire::TensorMemory::kCuda;
      x.cuda_mem_handle = x.shm_name;
      info.layer_indices.push_back(static_cast<int64_t>(descs.size()));
      descs.push_back(x);
    }
  }
  wire::LayoutHints hints;
  hints.kv_layout = "HND";
  return Build("MiniMax-M3 rank (TP8)", descs, hints, {info}, 128,
               {Rope(rot64, 128), Rope(rot64, 128)});
}

struct Row {
  std::string name;
  uint64_t bytes = 0;
  double turned_gbs = 0, copy_gbs = 0, memcpy_gbs = 0;
};

Row Measure(Model& m, int matches, int reps) {
  const auto& l = m.layout;
  std::mt19937_64 rng(1);
  // Objects: random bytes are fine for the copy; keys get finite bf16 values.
  std::vector<std::vector<uint8_t>> objects(matches, std::vector<uint8_t>(l.object_bytes));
  for (auto& o : objects) {
    for (size_t i = 0; i + 1 < o.size(); i += 2) {
      const uint16_t h = static_cast<uint16_t>(0x3c00 | (rng() & 0x83ff));  // finite, |x| < 2
      std::memcpy(o.data() + i, &h, 2);
    }
  }
  std::vector<uint8_t*> bases;
  std::vector<uint64_t> sizes;
  for (auto& t : m.tensors) {
    bases.push_back(t.data());
    sizes.push_back(t.size());
  }
  const int64_t tokens = matches * kChunk + 37;
  std::vector<int64_t> ids;
  for (int64_t b = 0; b * m.tokens_per_block < tokens; ++b) ids.push_back(b);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<int64_t>> tables(l.num_engine_groups, ids);

  auto request = [&](bool shifted) {
    std::vector<BlendMatch> ms;
    for (int i = 0; i < matches; ++i) {
      const int64_t cur = 37 + i * kChunk;
      ms.push_back(
          {shifted ? 1000 + i * kChunk : cur, cur, kChunk, objects[i].data(), l.object_bytes});
    }
    return ms;
  };
  const std::vector<BlendMatch> shifted = request(true), in_place = request(false);
  uint64_t bytes = 0;
  auto scatter = [&](const std::vector<BlendMatch>& ms, bool turns) {
    kvd::blend::ScatterRequest req;
    req.layout = &l;
    req.tensor_bases = bases;
    req.tensor_sizes = sizes;
    req.block_ids = tables;
    req.matches = ms;
    req.rope = m.ropes;
    auto plan = kvd::blend::PlanScatter(req);
    if (!plan.ok() || !plan->ready()) {
      std::fprintf(stderr, "scatter bench: %s\n", plan.status().ToString().c_str());
      std::exit(1);
    }
    if (plan->num_rotated_matches() != (turns ? static_cast<size_t>(matches) : 0u)) {
      std::fprintf(stderr, "scatter bench: %s: unexpected rotation count\n", m.name.c_str());
      std::exit(1);
    }
    kvd::blend::ExecuteScatter(*plan);
    bytes = plan->bytes();
  };
  // memcpy of the same bytes: each object into a destination as large, touched.
  std::vector<uint8_t> dst(l.object_bytes * matches, 1);
  auto copy = [&] {
    for (int i = 0; i < matches; ++i) {
      std::memcpy(dst.data() + i * l.object_bytes, objects[i].data(), l.object_bytes);
    }
  };
  // Interleaved, so that a change in the machine's load hits all three alike.
  double turned_s = 1e30, copy_s = 1e30, mem_s = 1e30;
  for (int r = 0; r < reps; ++r) {
    turned_s = std::min(turned_s, BestSeconds(1, [&] { scatter(shifted, true); }));
    copy_s = std::min(copy_s, BestSeconds(1, [&] { scatter(in_place, false); }));
    mem_s = std::min(mem_s, BestSeconds(1, copy));
  }
  Row row;
  row.name = m.name;
  row.bytes = bytes;
  row.turned_gbs = bytes / turned_s / 1e9;
  row.copy_gbs = bytes / copy_s / 1e9;
  row.memcpy_gbs = static_cast<double>(l.object_bytes) * matches / mem_s / 1e9;
  return row;
}

void Usage() {
  std::printf(
      "kvd-blend-bench scatter [--matches N] [--reps N] [--layout llama16|llama128|m3]\n"
      "  CPU scatter + re-RoPE of N stored 256-token chunks (default 4) into paged KV,\n"
      "  best of --reps (default 8), against memcpy of the same bytes.\n");
}

}  // namespace

int RunScatterSuite(int argc, char** argv) {
  int matches = 4, reps = 8;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "scatter: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--matches") {
      matches = std::atoi(value());
    } else if (a == "--reps") {
      reps = std::atoi(value());
    } else if (a == "--layout") {
      only = value();
    } else if (a == "--help" || a == "-h") {
      Usage();
      return 0;
    } else {
      std::fprintf(stderr, "scatter: unknown flag %s\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (matches < 1 || matches > 64 || reps < 1 || reps > 1000) {
    std::fprintf(stderr, "scatter: --matches in [1, 64], --reps in [1, 1000]\n");
    return 2;
  }
  const int64_t tokens = 1000 + (matches + 1) * kChunk;
  const auto rot128 = Table(tokens, 128);
  const auto rot64 = Table(tokens, 64);
  std::vector<Row> rows;
  for (const char* which : {"llama16", "llama128", "m3"}) {
    if (!only.empty() && only != which) continue;
    Model m = std::string(which) == "m3"        ? M3(tokens, *rot64)
              : std::string(which) == "llama16" ? Llama(16, tokens, *rot128)
                                                : Llama(128, tokens, *rot128);
    rows.push_back(Measure(m, matches, reps));
  }
  if (rows.empty()) {
    std::fprintf(stderr, "scatter: unknown --layout %s\n", only.c_str());
    return 2;
  }
  std::printf(
      "\n### CacheBlend CPU scatter + re-RoPE (%d chunks of %lld tokens, 1 thread, best of %d)\n\n",
      matches, static_cast<long long>(kChunk), reps);
  std::printf(
      "| layout | bytes per request | scatter + re-RoPE GB/s | copy-only scatter GB/s | memcpy "
      "GB/s | ratio (re-RoPE / memcpy) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    std::printf("| %s | %llu | %.2f | %.2f | %.2f | %.2fx |\n", r.name.c_str(),
                static_cast<unsigned long long>(r.bytes), r.turned_gbs, r.copy_gbs, r.memcpy_gbs,
                r.turned_gbs / r.memcpy_gbs);
  }
  return 0;
}

}  // namespace kvd::bench::blend
