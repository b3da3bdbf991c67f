// Helpers shared by the layout and transfer tests: descriptors for the KV layouts kvd
// must handle, host buffers standing in for shared-memory segments, and a reference
// model of the canonical object that is written from each test's own knowledge of the
// layout (which dim is K/V, block, token), independent of the plan under test.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "layout/layout.h"
#include "wire/messages.h"

namespace kvd::layout::test_util {

inline std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

inline int64_t NumElems(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Strides of a logical view whose physical (contiguous) order is `physical`:
// physical[i] is the logical dim stored at physical position i. This is how vLLM
// hands out an HND cache: logical [2, NB, BS, NH, HS], physical [2, NB, NH, BS, HS].
inline std::vector<int64_t> PermutedStrides(const std::vector<int64_t>& logical_shape,
                                            const std::vector<int>& physical) {
  std::vector<int64_t> pshape;
  for (int d : physical) pshape.push_back(logical_shape[d]);
  std::vector<int64_t> pstride = ContiguousStrides(pshape);
  std::vector<int64_t> out(logical_shape.size());
  for (size_t i = 0; i < physical.size(); ++i) out[physical[i]] = pstride[i];
  return out;
}

inline wire::TensorDescriptor Desc(const std::string& shm, const std::string& dtype,
                                   std::vector<int64_t> shape, std::vector<int64_t> stride = {},
                                   int64_t offset = 0, uint64_t nbytes = 0) {
  wire::TensorDescriptor d;
  d.memory = wire::TensorMemory::kCpuShm;
  d.dtype = dtype;
  if (stride.empty()) stride = ContiguousStrides(shape);
  d.shape = std::move(shape);
  d.stride = std::move(stride);
  d.storage_offset = offset;
  d.device_uuid = "cpu";
  d.shm_name = shm;
  if (nbytes == 0) {
    int64_t last = offset;
    for (size_t i = 0; i < d.shape.size(); ++i) last += (d.shape[i] - 1) * d.stride[i];
    nbytes = static_cast<uint64_t>((last + 1) * DtypeSize(dtype));
  }
  d.nbytes = nbytes;
  return d;
}

inline wire::EngineGroupInfo Info(int64_t id, std::vector<int64_t> layers, int64_t tpb) {
  wire::EngineGroupInfo g;
  g.engine_group_id = id;
  g.layer_indices = std::move(layers);
  g.tokens_per_block = tpb;
  return g;
}

inline wire::LayoutHints Hint(const char* kv_layout) {
  wire::LayoutHints h;
  if (kv_layout) h.kv_layout = kv_layout;
  return h;
}

// A registered tensor plus the test's own statement of its logical dims.
struct TestTensor {
  wire::TensorDescriptor desc;
  int kv_dim = -1;      // -1: one plane
  int block_dim = 0;
  int token_dim = 1;
  bool dsa = false;     // DeepSeek-V3.2 indexer page: [BS x 128 values][BS x 4 scales]
  // vLLM's CPU attention cache [NB, NH, BS, 2*HS] with VEC kernels: per (block, head)
  // K as [HS][BS] (dimension d of token t at d*BS + t), then V as [BS][HS]. head_dim is
  // the NH dimension; kv_dim stays -1 because there is no K/V dimension in the shape.
  bool vllm_cpu = false;
  int head_dim = 1;
};

// Expected kernel group: tensors in object order, and which block list they use.
struct ExpectedGroup {
  std::vector<size_t> tensors;
  size_t block_list = 0;
};

// A worker's registration: tensors over host buffers standing in for shm segments.
struct TestModel {
  std::vector<TestTensor> tensors;
  wire::LayoutHints hints;
  std::vector<wire::EngineGroupInfo> infos;
  LayoutOptions options{VllmCpuKernels::kVec};  // tests do not depend on the host's CPU
  std::vector<ExpectedGroup> groups;     // object order
  std::map<std::string, uint64_t> segment_bytes;

  void Add(TestTensor t) {
    uint64_t& n = segment_bytes[t.desc.shm_name];
    n = std::max<uint64_t>(n, t.desc.nbytes);
    tensors.push_back(std::move(t));
  }
  // The tensor index of each layer access the plan of group `g` must have: a vLLM CPU
  // tensor (VEC) is read twice, its K halves for every layer, then its V halves.
  std::vector<size_t> ExpectedAccesses(size_t g) const {
    std::vector<size_t> out = groups[g].tensors;
    if (!out.empty() && tensors[out[0]].vllm_cpu && options.vllm_cpu == VllmCpuKernels::kVec) {
      out.insert(out.end(), groups[g].tensors.begin(), groups[g].tensors.end());
    }
    return out;
  }
  std::vector<wire::TensorDescriptor> Descriptors() const {
    std::vector<wire::TensorDescriptor> out;
    for (const auto& t : tensors) out.push_back(t.desc);
    return out;
  }
};

// Host memory for every segment of a model.
struct Buffers {
  std::map<std::string, std::vector<uint8_t>> seg;

  static Buffers Zeroed(const TestModel& m) {
    Buffers b;
    for (const auto& [name, n] : m.segment_bytes) b.seg[name].assign(n, 0);
    return b;
  }
  static Buffers Random(const TestModel& m, uint64_t seed) {
    Buffers b;
    std::mt19937_64 rng(seed);
    for (const auto& [name, n] : m.segment_bytes) {
      auto& v = b.seg[name];
      v.resize(n);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        uint64_t x = rng();
        std::memcpy(v.data() + i, &x, 8);
      }
      for (; i < n; ++i) v[i] = static_cast<uint8_t>(rng());
    }
    return b;
  }
  std::vector<uint8_t*> Bases(const TestModel& m) {
    std::vector<uint8_t*> out;
    for (const auto& t : m.tensors) out.push_back(seg.at(t.desc.shm_name).data());
    return out;
  }
};

inline int64_t ElemOffset(const wire::TensorDescriptor& d, const std::vector<int64_t>& idx) {
  int64_t e = d.storage_offset;
  for (size_t i = 0; i < idx.size(); ++i) e += idx[i] * d.stride[i];
  return e * DtypeSize(d.dtype);
}

// Byte pieces (segment offset, length) of token `t` of block `b`, plane `kv`, in the
// order they appear in the object row: hidden dims in logical order.
inline std::vector<std::pair<int64_t, int64_t>> TokenRow(const TestTensor& tt, int64_t kv,
                                                         int64_t b, int64_t t) {
  const auto& d = tt.desc;
  const int64_t item = DtypeSize(d.dtype);
  std::vector<int64_t> idx(d.shape.size(), 0);
  if (tt.kv_dim >= 0) idx[tt.kv_dim] = kv;
  idx[tt.block_dim] = b;
  std::vector<std::pair<int64_t, int64_t>> out;
  if (tt.dsa) {
    const int64_t bs = d.shape[tt.token_dim];
    const int64_t start = ElemOffset(d, idx);  // token 0, hidden 0
    out.push_back({start + t * 128, 128});
    out.push_back({start + bs * 128 + t * 4, 4});
    return out;
  }
  if (tt.vllm_cpu) {  // VEC kernels: K as [HS][BS], then V as [BS][HS]
    const int64_t bs = d.shape[tt.token_dim];
    const int64_t hs = d.shape[3] / 2;
    for (int64_t h = 0; h < d.shape[tt.head_dim]; ++h) {
      idx[tt.head_dim] = h;
      const int64_t start = ElemOffset(d, idx);
      if (kv == 0) {
        for (int64_t e = 0; e < hs; ++e) out.push_back({start + (e * bs + t) * item, item});
      } else {
        out.push_back({start + (bs * hs + t * hs) * item, hs * item});
      }
    }
    return out;
  }
  idx[tt.token_dim] = t;
  std::vector<int> hidden;
  for (int i = 0; i < static_cast<int>(d.shape.size()); ++i) {
    if (i != tt.kv_dim && i != tt.block_dim && i != tt.token_dim) hidden.push_back(i);
  }
  while (true) {
    int64_t off = ElemOffset(d, idx);
    if (!out.empty() && out.back().first + out.back().second == off) {
      out.back().second += item;  // adjacent elements: one piece
    } else {
      out.push_back({off, item});
    }
    int k = static_cast<int>(hidden.size()) - 1;
    for (; k >= 0; --k) {
      if (++idx[hidden[k]] < d.shape[hidden[k]]) break;
      idx[hidden[k]] = 0;
    }
    if (k < 0) break;
  }
  return out;
}

inline int64_t TokensPerBlock(const TestTensor& tt) { return tt.desc.shape[tt.token_dim]; }

// The canonical object of chunk `chunk`, built from the test's own view of the model.
inline std::vector<uint8_t> ReferenceObject(const TestModel& m, Buffers& src,
                                            const std::vector<std::vector<int64_t>>& ids,
                                            int64_t chunk, int64_t chunk_tokens) {
  std::vector<uint8_t> obj;
  for (const auto& g : m.groups) {
    const TestTensor& first = m.tensors[g.tensors[0]];
    const int64_t kv_size = first.kv_dim >= 0 || first.vllm_cpu ? 2 : 1;
    const int64_t tpb = TokensPerBlock(first);
    const int64_t bpc = chunk_tokens / tpb;
    for (int64_t kv = 0; kv < kv_size; ++kv) {
      for (size_t ti : g.tensors) {
        const auto& tt = m.tensors[ti];
        const uint8_t* base = src.seg.at(tt.desc.shm_name).data();
        for (int64_t tok = 0; tok < chunk_tokens; ++tok) {
          int64_t b = ids[g.block_list][chunk * bpc + tok / tpb];
          for (auto [off, len] : TokenRow(tt, kv, b, tok % tpb)) {
            obj.insert(obj.end(), base + off, base + off + len);
          }
        }
      }
    }
  }
  return obj;
}

// What the destination buffers must hold after scattering chunk `chunk` of `src` (read
// at src_ids) into `dst_ids`, skipping the first `skip` tokens of the chunk.
inline void ApplyExpectedScatter(const TestModel& m, Buffers& src, Buffers* expected,
                                 const std::vector<std::vector<int64_t>>& src_ids,
                                 const std::vector<std::vector<int64_t>>& dst_ids, int64_t chunk,
                                 int64_t chunk_tokens, int64_t skip) {
  for (const auto& g : m.groups) {
    for (size_t ti : g.tensors) {
      const auto& tt = m.tensors[ti];
      const int64_t kv_size = tt.kv_dim >= 0 || tt.vllm_cpu ? 2 : 1;
      const int64_t tpb = TokensPerBlock(tt);
      const int64_t bpc = chunk_tokens / tpb;
      const uint8_t* s = src.seg.at(tt.desc.shm_name).data();
      uint8_t* e = expected->seg.at(tt.desc.shm_name).data();
      for (int64_t tok = std::max<int64_t>(skip, 0); tok < chunk_tokens; ++tok) {
        int64_t sb = src_ids[g.block_list][chunk * bpc + tok / tpb];
        int64_t db = dst_ids[g.block_list][chunk * bpc + tok / tpb];
        for (int64_t kv = 0; kv < kv_size; ++kv) {
          auto from = TokenRow(tt, kv, sb, tok % tpb);
          auto to = TokenRow(tt, kv, db, tok % tpb);
          for (size_t i = 0; i < from.size(); ++i) {
            std::memcpy(e + to[i].first, s + from[i].first, from[i].second);
          }
        }
      }
    }
  }
}


// ---- Models: the layouts kvd supports, one builder each ------------------------------

enum class Order { kNhd, kHndPhysical, kHndView };

// vLLM FlashAttention: per layer [2, NB, BS, NH, HS]. kHndPhysical registers the
// physical HND order [2, NB, NH, BS, HS]; kHndView registers the logical NHD shape with
// HND strides (what vLLM's permuted view looks like). One segment per layer.
inline TestModel FlashAttention(int layers, int64_t nb, int64_t bs, int64_t nh, int64_t hs,
                                Order order, const std::string& dtype = "bfloat16",
                                const std::string& prefix = "fa") {
  TestModel m;
  m.hints = Hint(order == Order::kNhd ? "NHD" : "HND");
  ExpectedGroup g;
  for (int l = 0; l < layers; ++l) {
    TestTensor t;
    std::string shm = "/" + prefix + std::to_string(l);
    t.kv_dim = 0;
    t.block_dim = 1;
    if (order == Order::kHndPhysical) {
      t.desc = Desc(shm, dtype, {2, nb, nh, bs, hs});
      t.token_dim = 3;
    } else if (order == Order::kHndView) {
      t.desc = Desc(shm, dtype, {2, nb, bs, nh, hs},
                    PermutedStrides({2, nb, bs, nh, hs}, {0, 1, 3, 2, 4}));
      t.token_dim = 2;
    } else {
      t.desc = Desc(shm, dtype, {2, nb, bs, nh, hs});
      t.token_dim = 2;
    }
    g.tensors.push_back(m.tensors.size());
    m.Add(t);
  }
  m.groups.push_back(g);
  return m;
}

// vLLM FlashInfer / Triton: per layer [NB, 2, BS, NH, HS] (HND physical [NB, 2, NH, BS, HS]).
inline TestModel FlashInfer(int layers, int64_t nb, int64_t bs, int64_t nh, int64_t hs,
                            Order order, const std::string& dtype = "bfloat16") {
  TestModel m;
  m.hints = Hint(order == Order::kNhd ? "NHD" : "HND");
  ExpectedGroup g;
  for (int l = 0; l < layers; ++l) {
    TestTensor t;
    std::string shm = "/fi" + std::to_string(l);
    t.block_dim = 0;
    t.kv_dim = 1;
    if (order == Order::kHndPhysical) {
      t.desc = Desc(shm, dtype, {nb, 2, nh, bs, hs});
      t.token_dim = 3;
    } else if (order == Order::kHndView) {
      t.desc = Desc(shm, dtype, {nb, 2, bs, nh, hs},
                    PermutedStrides({nb, 2, bs, nh, hs}, {0, 1, 3, 2, 4}));
      t.token_dim = 2;
    } else {
      t.desc = Desc(shm, dtype, {nb, 2, bs, nh, hs});
      t.token_dim = 2;
    }
    g.tensors.push_back(m.tensors.size());
    m.Add(t);
  }
  m.groups.push_back(g);
  return m;
}

// Marks a descriptor as a GPU tensor (CUDA IPC) while the test keeps using its host
// buffer: the copy plan does not depend on where the memory is, except that a packed
// HND tensor in CPU memory is vLLM's CPU cache (VllmCpu below).
inline wire::TensorDescriptor OnGpu(wire::TensorDescriptor d) {
  d.memory = wire::TensorMemory::kCuda;
  d.device_uuid = "GPU-00000000-0000-0000-0000-000000000000";
  d.cuda_mem_handle = d.shm_name;  // distinct per segment, as real IPC handles are
  return d;
}

// vLLM packed K/V on GPUs (#44455): per layer [NB, NH, BS, 2*HS] (HND, "LBHNC") or
// [NB, BS, NH, 2*HS] (NHD, "LBNHC"), each token's K then V in the last dimension.
// One plane; hidden = NH * 2*HS.
inline TestModel PackedKv(int layers, int64_t nb, int64_t bs, int64_t nh, int64_t hs, bool hnd,
                          const std::string& dtype = "bfloat16") {
  TestModel m;
  m.hints = Hint(hnd ? "HND" : "NHD");
  ExpectedGroup g;
  for (int l = 0; l < layers; ++l) {
    TestTensor t;
    std::string shm = "/pk" + std::to_string(l);
    t.block_dim = 0;
    if (hnd) {
      t.desc = OnGpu(Desc(shm, dtype, {nb, nh, bs, 2 * hs}));
      t.token_dim = 2;
    } else {
      t.desc = OnGpu(Desc(shm, dtype, {nb, bs, nh, 2 * hs}));
      t.token_dim = 1;
    }
    g.tensors.push_back(m.tensors.size());
    m.Add(t);
  }
  m.groups.push_back(g);
  return m;
}

// vLLM's CPU attention backend (vllm-cpu 0.32, v1/attention/backends/cpu_attn.py): per
// layer [NB, NH, BS, 2*HS] in CPU shared memory, layout LBHNC, which the kernels view
// as [NB, NH, 2*BS, HS] and split into a K half and a V half per (block, head); the VEC
// kernels (csrc/cpu/cpu_attn_vec.hpp) keep K as [HS][BS] and V as [BS][HS]. The
// canonical object is that of FlashAttention with the same K/V: [2][layers][tokens]
// [NH*HS], whatever BS is. One engine group with tokens_per_block.
inline TestModel VllmCpu(int layers, int64_t nb, int64_t bs, int64_t nh, int64_t hs,
                         const std::string& dtype = "bfloat16",
                         const std::string& prefix = "cpu") {
  TestModel m;
  m.hints = Hint("LBHNC");
  m.hints.tokens_per_block = bs;
  ExpectedGroup g;
  std::vector<int64_t> all;
  for (int l = 0; l < layers; ++l) {
    TestTensor t;
    t.desc = Desc("/" + prefix + std::to_string(l), dtype, {nb, nh, bs, 2 * hs});
    t.block_dim = 0;
    t.head_dim = 1;
    t.token_dim = 2;
    t.vllm_cpu = true;
    all.push_back(static_cast<int64_t>(m.tensors.size()));
    g.tensors.push_back(m.tensors.size());
    m.Add(t);
  }
  m.infos = {Info(0, all, bs)};
  m.groups.push_back(g);
  return m;
}

// MLA latent cache: per layer [NB, BS, 576] (DeepSeek V2/V3: 512 + 64 rope).
inline TestModel Mla(int layers, int64_t nb, int64_t bs, int64_t width = 576,
                     const std::string& dtype = "bfloat16") {
  TestModel m;
  ExpectedGroup g;
  for (int l = 0; l < layers; ++l) {
    TestTensor t;
    t.desc = Desc("/mla" + std::to_string(l), dtype, {nb, bs, width});
    g.tensors.push_back(m.tensors.size());
    m.Add(t);
  }
  m.groups.push_back(g);
  return m;
}

// DeepSeek-V3.2: per layer an fp8_ds_mla page [NB, 64, 656] uint8 and a DSA indexer
// page [NB, 64, 132] uint8, registered interleaved (attn, indexer, attn, ...), one
// engine group. Two kernel groups sharing the block ids.
inline TestModel DeepSeekV32(int layers, int64_t nb, bool with_info = true) {
  TestModel m;
  ExpectedGroup main, indexer;
  for (int l = 0; l < layers; ++l) {
    TestTensor a;
    a.desc = Desc("/dsa_attn" + std::to_string(l), "uint8", {nb, 64, 656});
    main.tensors.push_back(m.tensors.size());
    m.Add(a);
    TestTensor x;
    x.desc = Desc("/dsa_idx" + std::to_string(l), "uint8", {nb, 64, 132});
    x.dsa = true;
    indexer.tensors.push_back(m.tensors.size());
    m.Add(x);
  }
  m.groups = {main, indexer};
  if (with_info) {
    std::vector<int64_t> all;
    for (size_t i = 0; i < m.tensors.size(); ++i) all.push_back(static_cast<int64_t>(i));
    m.infos = {Info(0, all, 64)};
  }
  return m;
}

enum class M3Main { kPackedHnd, kPackedNhd, kRank5 };

// MiniMax-M3 on one TP=8 rank, block size 128 (vllm_side.md §3.4): 60 decoder layers
// with a GQA K/V cache (one KV head per rank) and, on layers 3..59, a key-only indexer
// cache [NB, 128, 128] bf16, registered in layer order (attn, then index_cache), all in
// one vLLM engine group. Main cache forms:
//   kPackedHnd  [NB, 1, 128, 256]   vLLM >= 0.26 packed K/V, heads before tokens
//   kPackedNhd  [NB, 128, 1, 256]   the same with tokens before heads (LBNHC)
//   kRank5      [NB, 2, 128, 1, 128] vLLM <= 0.24 FlashInfer-style form
// split_infos: engine_group_infos as lmcache 0.5.6 sends them (one info per kernel
// identity, both naming engine group 0; the request then carries two copies of the
// block list). Otherwise one info holding all 117 tensors.
inline TestModel MiniMaxM3(int64_t nb, M3Main form, const std::string& main_dtype,
                           bool split_infos, int layers = 60, int first_sparse = 3) {
  TestModel m;
  m.hints = Hint(form == M3Main::kPackedNhd ? "NHD" : "HND");
  ExpectedGroup main, indexer;
  for (int l = 0; l < layers; ++l) {
    TestTensor a;
    std::string shm = "/m3_attn" + std::to_string(l);
    a.block_dim = 0;
    if (form == M3Main::kPackedHnd) {
      a.desc = OnGpu(Desc(shm, main_dtype, {nb, 1, 128, 256}));
      a.token_dim = 2;
    } else if (form == M3Main::kPackedNhd) {
      a.desc = OnGpu(Desc(shm, main_dtype, {nb, 128, 1, 256}));
      a.token_dim = 1;
    } else {
      a.desc = OnGpu(Desc(shm, main_dtype, {nb, 2, 128, 1, 128}));
      a.kv_dim = 1;
      a.token_dim = 2;
    }
    main.tensors.push_back(m.tensors.size());
    m.Add(a);
    if (l >= first_sparse) {
      TestTensor x;
      x.desc = OnGpu(Desc("/m3_index" + std::to_string(l), "bfloat16", {nb, 128, 128}));
      indexer.tensors.push_back(m.tensors.size());
      m.Add(x);
    }
  }
  std::vector<int64_t> mi(main.tensors.begin(), main.tensors.end());
  std::vector<int64_t> xi(indexer.tensors.begin(), indexer.tensors.end());
  if (split_infos) {
    m.infos = {Info(0, mi, 128), Info(0, xi, 128)};
    indexer.block_list = 1;
  } else {
    std::vector<int64_t> all;
    for (size_t i = 0; i < m.tensors.size(); ++i) all.push_back(static_cast<int64_t>(i));
    m.infos = {Info(0, all, 128)};
  }
  m.groups = {main, indexer};
  return m;
}

}  // namespace kvd::layout::test_util
