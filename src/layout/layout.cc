#include "layout/layout.h"

#include <map>
#include <sstream>

namespace kvd::layout {
namespace {

constexpr size_t kMaxRunsPerRow = 1 << 16;

struct DimRoles {
  int block = -1;
  int kv = -1;      // -1: single plane
  int token = -1;
  std::string form;
};

std::string TensorName(size_t i) { return "kv_cache[" + std::to_string(i) + "]"; }

std::string ShapeString(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// Chooses which of two candidate dims holds the tokens of a block: the engine's block
// size decides when exactly one matches it; otherwise the layout hint does (NHD default).
int PickTokenDim(const std::vector<int64_t>& shape, int nhd_dim, int hnd_dim, bool hint_hnd,
                 int64_t tokens_per_block) {
  if (tokens_per_block > 0) {
    bool a = shape[nhd_dim] == tokens_per_block, b = shape[hnd_dim] == tokens_per_block;
    if (a && !b) return nhd_dim;
    if (b && !a) return hnd_dim;
  }
  return hint_hnd ? hnd_dim : nhd_dim;
}

Result<DimRoles> Classify(const wire::TensorDescriptor& t, size_t index, bool hint_hnd,
                          int64_t tokens_per_block) {
  const auto& s = t.shape;
  DimRoles r;
  switch (s.size()) {
    case 5:
      if (s[0] == 2) {  // [2, NB, BS, NH, HS] or [2, NB, NH, BS, HS]
        r.kv = 0;
        r.block = 1;
        r.token = PickTokenDim(s, 2, 3, hint_hnd, tokens_per_block);
        r.form = r.token == 2 ? "kv-first NHD" : "kv-first HND";
      } else if (s[1] == 2) {  // [NB, 2, BS, NH, HS] or [NB, 2, NH, BS, HS]
        r.block = 0;
        r.kv = 1;
        r.token = PickTokenDim(s, 2, 3, hint_hnd, tokens_per_block);
        r.form = r.token == 2 ? "block-first NHD" : "block-first HND";
      } else {
        return Status::InvalidArgument(TensorName(index) + " shape " + ShapeString(s) +
                                       ": a rank-5 KV cache needs a K/V dimension of size 2 "
                                       "at position 0 or 1");
      }
      return r;
    case 4:  // [NB, BS, NH, HS] / [NB, NH, BS, HS] / packed [NB, NH, BS, 2*HS]: one plane
      r.block = 0;
      r.token = PickTokenDim(s, 1, 2, hint_hnd, tokens_per_block);
      r.form = r.token == 1 ? "single-plane NHD" : "single-plane HND";
      return r;
    case 3:  // MLA latent [NB, BS, D], key-only indexer caches, opaque byte pages
      r.block = 0;
      r.token = 1;
      r.form = "single-plane [blocks, tokens, hidden]";
      return r;
    default:
      return Status::InvalidArgument(TensorName(index) + " shape " + ShapeString(s) +
                                     ": rank " + std::to_string(s.size()) +
                                     " is not a KV cache layout kvd supports (rank 3, 4 or 5)");
  }
}

// Enumerates the byte offsets of one row's hidden elements and merges adjacent ones.
void CollectRuns(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                 size_t dim, int64_t offset, int64_t itemsize, std::vector<ByteRun>* runs) {
  if (dim == sizes.size()) {
    if (!runs->empty() && runs->back().offset + runs->back().length == offset) {
      runs->back().length += itemsize;
    } else {
      runs->push_back({offset, itemsize});
    }
    return;
  }
  for (int64_t i = 0; i < sizes[dim]; ++i) {
    CollectRuns(sizes, strides, dim + 1, offset + i * strides[dim], itemsize, runs);
    if (runs->size() > kMaxRunsPerRow) return;
  }
}

std::string AliasKey(const wire::TensorDescriptor& t) {
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
  os << groups.size() << " kernel group(s), " << object_bytes << " bytes per chunk object";
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& k = groups[g];
    os << "; group " << g << ": " << k.layers.size() << " x " << ShapeString(k.shape) << " "
       << k.dtype << " (" << k.form << ", engine group " << k.engine_group << ", "
       << k.tokens_per_block << " tokens/block)";
  }
  return os.str();
}

Result<KvLayout> BuildLayout(const std::vector<wire::TensorDescriptor>& tensors,
                             const wire::LayoutHints& hints,
                             const std::vector<wire::EngineGroupInfo>& group_infos,
                             int64_t chunk_tokens) {
  if (tensors.empty()) return Status::InvalidArgument("register_kv_cache: no KV tensors");
  if (chunk_tokens <= 0) return Status::InvalidArgument("chunk size must be positive");
  bool hint_hnd = hints.kv_layout && (*hints.kv_layout == "HND" || *hints.kv_layout == "LBHNC");
  if (hints.kv_layout && !(*hints.kv_layout == "NHD" || *hints.kv_layout == "HND" ||
                           *hints.kv_layout == "LBNHC" || *hints.kv_layout == "LBHNC")) {
    return Status::InvalidArgument("layout_hints.kv_layout '" + *hints.kv_layout +
                                   "' is not supported (NHD, HND, LBNHC, LBHNC)");
  }

  // Engine groups: which tensors use which block-id list.
  std::vector<std::vector<size_t>> members;
  std::vector<int64_t> group_tpb;
  if (group_infos.empty()) {
    members.emplace_back();
    for (size_t i = 0; i < tensors.size(); ++i) members[0].push_back(i);
    group_tpb.push_back(hints.tokens_per_block.value_or(0));
  } else {
    std::vector<int> owner(tensors.size(), -1);
    for (size_t g = 0; g < group_infos.size(); ++g) {
      members.emplace_back();
      group_tpb.push_back(group_infos[g].tokens_per_block);
      for (int64_t li : group_infos[g].layer_indices) {
        if (li < 0 || static_cast<size_t>(li) >= tensors.size()) {
          return Status::InvalidArgument("engine_group_infos[" + std::to_string(g) +
                                         "] names layer " + std::to_string(li) + " but only " +
                                         std::to_string(tensors.size()) + " tensors were registered");
        }
        if (owner[li] != -1) {
          return Status::InvalidArgument(TensorName(li) + " is listed in engine groups " +
                                         std::to_string(owner[li]) + " and " + std::to_string(g));
        }
        owner[li] = static_cast<int>(g);
        members[g].push_back(static_cast<size_t>(li));
      }
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (owner[i] == -1) {
        return Status::InvalidArgument(TensorName(i) + " belongs to no engine group");
      }
    }
  }

  KvLayout out;
  out.chunk_tokens = chunk_tokens;
  out.num_engine_groups = members.size();
  std::map<std::string, bool> seen_alias;
  for (size_t eg = 0; eg < members.size(); ++eg) {
    std::map<std::string, size_t> by_signature;  // signature → index in out.groups
    for (size_t ti : members[eg]) {
      const auto& t = tensors[ti];
      int64_t itemsize = DtypeSize(t.dtype);
      if (itemsize == 0) {
        return Status::InvalidArgument(TensorName(ti) + ": unsupported dtype '" + t.dtype + "'");
      }
      for (int64_t d : t.shape) {
        if (d <= 0) {
          return Status::InvalidArgument(TensorName(ti) + " shape " + ShapeString(t.shape) +
                                         ": every dimension must be positive");
        }
      }
      // Highest element touched, then bytes; overflow-safe within int64 for sane inputs.
      __int128 last = t.storage_offset;
      for (size_t d = 0; d < t.shape.size(); ++d) last += static_cast<__int128>(t.shape[d] - 1) * t.stride[d];
      __int128 span = (last + 1) * itemsize;
      if (t.nbytes == 0 || span > static_cast<__int128>(t.nbytes)) {
        return Status::InvalidArgument(
            TensorName(ti) + " shape " + ShapeString(t.shape) + " stride " + ShapeString(t.stride) +
            " offset " + std::to_string(t.storage_offset) + " " + t.dtype + " needs " +
            std::to_string(static_cast<int64_t>(span)) + " bytes but its memory is " +
            std::to_string(t.nbytes) + " bytes");
      }
      auto roles = Classify(t, ti, hint_hnd, group_tpb[eg]);
      if (!roles.ok()) return roles.status();
      std::string alias = AliasKey(t);
      if (seen_alias.count(alias)) continue;  // same memory and view: stored once
      seen_alias[alias] = true;

      std::string sig = t.dtype + ShapeString(t.shape) + ShapeString(t.stride) + roles->form;
      auto it = by_signature.find(sig);
      if (it == by_signature.end()) {
        KernelGroup k;
        k.engine_group = eg;
        k.dtype = t.dtype;
        k.itemsize = itemsize;
        k.kv_size = roles->kv >= 0 ? 2 : 1;
        k.num_blocks = t.shape[roles->block];
        k.tokens_per_block = t.shape[roles->token];
        k.block_stride = t.stride[roles->block] * itemsize;
        k.kv_stride = roles->kv >= 0 ? t.stride[roles->kv] * itemsize : 0;
        k.token_stride = t.stride[roles->token] * itemsize;
        k.shape = t.shape;
        k.form = roles->form;
        std::vector<int64_t> hs, hst;
        for (int d = 0; d < static_cast<int>(t.shape.size()); ++d) {
          if (d == roles->block || d == roles->kv || d == roles->token) continue;
          hs.push_back(t.shape[d]);
          hst.push_back(t.stride[d] * itemsize);
        }
        k.hidden_elems = 1;
        for (int64_t h : hs) k.hidden_elems *= h;
        k.row_bytes = k.hidden_elems * itemsize;
        CollectRuns(hs, hst, 0, 0, itemsize, &k.row_runs);
        if (k.row_runs.size() > kMaxRunsPerRow) {
          return Status::InvalidArgument(TensorName(ti) + ": hidden dimensions are too fragmented");
        }
        k.block_is_contiguous = k.row_runs.size() == 1 && k.row_runs[0].offset == 0 &&
                                k.token_stride == k.row_bytes;
        if (group_tpb[eg] > 0 && k.tokens_per_block != group_tpb[eg]) {
          return Status::InvalidArgument(
              TensorName(ti) + " shape " + ShapeString(t.shape) + ": engine group " +
              std::to_string(eg) + " declares " + std::to_string(group_tpb[eg]) +
              " tokens per block, but the tensor's token dimension is " +
              std::to_string(k.tokens_per_block));
        }
        if (chunk_tokens % k.tokens_per_block != 0) {
          return Status::InvalidArgument(
              "chunk size " + std::to_string(chunk_tokens) + " is not a multiple of block size " +
              std::to_string(k.tokens_per_block) + " of engine group " + std::to_string(eg) +
              " (" + TensorName(ti) + " shape " + ShapeString(t.shape) +
              "); start kvd with a --chunk-size that is a multiple of every group's block size");
        }
        by_signature[sig] = out.groups.size();
        out.groups.push_back(std::move(k));
        it = by_signature.find(sig);
      }
      out.groups[it->second].layers.push_back(
          TensorAccess{ti, t.storage_offset * itemsize, static_cast<uint64_t>(span)});
    }
  }
  for (const auto& k : out.groups) out.object_bytes += k.BytesPerChunk(chunk_tokens);
  return out;
}

}  // namespace kvd::layout
