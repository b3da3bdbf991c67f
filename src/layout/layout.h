// Layout: turns the untrusted descriptions of a worker's registered KV tensors into a
// validated copy plan between vLLM's paged blocks and kvd's canonical stored object.
//
// Canonical object (one per chunk, per KV rank): the kernel groups back to back; a
// kernel group holds [kv_size][layers][chunk_tokens][hidden] in the tensors' dtype
// (hidden = every non-block, non-kv, non-token element of a token, in the tensor's
// logical dimension order, e.g. heads × head_size). Objects therefore do not depend on
// whether the engine used NHD or HND, on strides, padding or storage offsets.
//
// Terms. A *block-id list* is one entry of the request's block_ids, and one entry of
// the registration's engine_group_infos (lmcache 0.5.6 sends one info, and one list,
// per LMCache group; several infos may name the same vLLM engine group and then carry
// copies of its block ids). kvd calls the index of that entry `engine_group`.
// A *kernel group* is the set of tensors of one block-id list that share dtype,
// kv_size, tokens per block, block count and hidden size; tensors of one list with
// different shapes (MiniMax-M3's K/V cache and its key-only indexer cache) become
// separate kernel groups that use the same block ids.
//
// How a tensor is read (descriptor-driven): its dimensions are put in physical order
// (by stride; size-1 dimensions stay next to their logical neighbour); the rank and the
// position of a size-2 dimension give the K/V plane; the token dimension is the one
// whose size equals the group's tokens_per_block (engine_group_infos, else
// layout_hints when there is one list), and the layout hint (NHD/HND/BL*/LB*) only
// breaks a tie (heads == block size). Every copy then follows the tensor's own strides
// and storage offset. Anything that does not fit is refused at BuildLayout, naming the
// tensor; a layout is never guessed into a silently wrong copy.
//
// Tensors that alias the same memory and view inside one block-id list are stored once.
// Tensors that no engine_group_info names are excluded (never copied), as lmcache 0.5.6
// does for cross-layer KV-sharing layers and scratch (non-prefix-cacheable) groups.
//
// Plans are immutable once built; share them freely across threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "layout/tensor_spec.h"

namespace kvd::layout {

// Part of one token row of one tensor: token t's bytes of this run start at
// `offset + t * token_stride` from the block's first byte (of the K or V plane), and
// are the next `length` bytes of the token's row in the object.
struct ByteRun {
  int64_t offset;        // bytes from the block (plane) start to token 0's run
  int64_t length;        // bytes
  int64_t token_stride;  // bytes between consecutive tokens' runs
};

// How one registered tensor (one layer) of a kernel group is addressed. Byte units.
struct TensorAccess {
  size_t tensor_index;       // index into the registered tensor list
  int64_t base_offset;       // bytes from the start of the tensor's mapping to element 0
  uint64_t span_bytes;       // highest byte touched + 1, relative to the mapping
  int64_t block_stride = 0;  // bytes between blocks
  int64_t kv_stride = 0;     // bytes between the K and V planes (0: one plane)
  std::vector<ByteRun> row_runs;     // one token row, in object (hidden) order
  bool block_is_contiguous = false;  // a block's tokens of one plane are one run of
                                     // tokens_per_block * row_bytes bytes at offset 0
  // > 0 (the element size, 1, 2, 4 or 8 bytes): the block holds this plane transposed.
  // Every run is one element, and token t's element r is at row_runs[r].offset + t *
  // element bytes (token_stride == length == element size), so each element of the row
  // is a column of tokens_per_block adjacent elements (vLLM CPU keys, [HS][BS]). The copy
  // then moves tiles of columns × tokens instead of one element at a time; the bytes
  // moved are those the runs describe.
  int64_t transposed_element = 0;
};

struct KernelGroup {
  size_t engine_group;             // index into the request's block_ids lists
  std::string dtype;
  int64_t itemsize = 0;
  int64_t kv_size = 2;             // 2: separate K and V planes; 1: MLA / key-only / packed
  int64_t num_blocks = 0;          // blocks in every tensor of the group
  int64_t tokens_per_block = 0;
  int64_t hidden_elems = 0;
  int64_t row_bytes = 0;           // hidden_elems * itemsize
  uint64_t object_offset = 0;      // where this group starts inside a chunk object
  // Carried from the group's engine_group_info for the caller; the copy itself moves
  // every block of the chunk whatever these say (see docs/layouts.md).
  int64_t sw_size_tokens = -1;     // -1: not sliding-window
  bool recurrent_state = false;    // pages hold recurrent (Mamba/GDN) state snapshots
  std::vector<TensorAccess> layers;  // in registration order
  std::vector<int64_t> shape;        // the first tensor's shape (for messages)
  std::string form;                  // e.g. "kv-first NHD", "blocks-first HND", "single-plane"
  // Bytes of this group inside one chunk object.
  uint64_t BytesPerChunk(int64_t chunk_tokens) const {
    return static_cast<uint64_t>(kv_size) * layers.size() * chunk_tokens * row_bytes;
  }
};

// vLLM's CPU cache [NB, NH, BS, 2*HS]: the layout of each (block, head) depends on the
// attention kernels vLLM picked for the host, the dtype and the head size
// (docs/layouts.md, "vLLM's CPU cache").
enum class VllmCpuKernels {
  kDetect,   // as vLLM decides on this host
  kVec,      // VEC / VEC16: K as [HS][BS] (dimension-major), then V as [BS][HS]
  kUnknown,  // AMX, NEON, fp8, ...: blocks copied as they are, objects per block size
};

struct LayoutOptions {
  VllmCpuKernels vllm_cpu = VllmCpuKernels::kDetect;
};

struct KvLayout {
  int64_t chunk_tokens = 0;
  std::vector<KernelGroup> groups;
  size_t num_engine_groups = 1;    // block-id lists a request must carry
  uint64_t object_bytes = 0;       // sum over groups of BytesPerChunk
  std::vector<size_t> aliased_tensors;   // same memory and view as an earlier tensor
  std::vector<size_t> excluded_tensors;  // named by no engine_group_info: never copied
  // > 0: the objects are only meaningful to workers with this many tokens per block
  // (a vLLM CPU cache whose kernel layout kvd does not know); the server keeps them apart.
  int64_t block_size_dependent = 0;
  std::string Describe() const;    // one line for logs and /status
};

// Bytes per element of a torch dtype name ("bfloat16" → 2); 0 if unknown.
int64_t DtypeSize(const std::string& dtype);

// Builds and validates the plan. Every tensor that is copied must have a known dtype,
// rank 3, 4 or 5, positive dimensions, a non-self-overlapping view that fits inside its
// mapping, and a shape kvd recognises; chunk_tokens must be a multiple of every
// group's tokens_per_block. Errors name the tensor and what did not fit.
Result<KvLayout> BuildLayout(const std::vector<TensorDescriptor>& tensors,
                             const LayoutHints& hints,
                             const std::vector<EngineGroupInfo>& group_infos,
                             int64_t chunk_tokens, const LayoutOptions& options = {});

}  // namespace kvd::layout
