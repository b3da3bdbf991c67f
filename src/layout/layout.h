// Layout: turns the untrusted descriptions of a worker's registered KV tensors into a
// validated copy plan between vLLM's paged blocks and kvd's canonical stored object.
//
// Canonical object (one per chunk, per KV rank): the kernel groups back to back; a
// kernel group holds [kv_size][layers][chunk_tokens][hidden] in the tensors' dtype
// (hidden = every non-block, non-kv, non-token element of a token, in the tensor's
// logical order, e.g. heads × head_size). Objects therefore do not depend on whether
// the engine used NHD or HND, or on strides and padding.
//
// A kernel group is the set of tensors of one engine group (one block-id space) that
// share shape and dtype. Tensors of one engine group with different shapes (MiniMax-M3's
// K/V cache and its key-only indexer cache) become separate kernel groups that use the
// same block ids. Tensors that alias the same memory and view are stored once.
//
// Plans are immutable once built; share them freely across threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "wire/messages.h"

namespace kvd::layout {

// One (kv-plane, block, token) row of a tensor is `hidden_elems` elements, read as
// runs of contiguous bytes at fixed offsets from the row's first byte.
struct ByteRun {
  int64_t offset;   // bytes from the row start
  int64_t length;   // bytes
};

struct TensorAccess {
  size_t tensor_index;       // index into the registered tensor list
  int64_t base_offset;       // bytes from the start of the tensor's mapping to element 0
  uint64_t span_bytes;       // highest byte touched + 1, relative to the mapping
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
  // Byte strides shared by every tensor of the group.
  int64_t block_stride = 0;
  int64_t kv_stride = 0;
  int64_t token_stride = 0;
  std::vector<ByteRun> row_runs;   // how one token row is laid out in the tensor
  bool block_is_contiguous = false;  // a block's tokens of one plane are one run
  std::vector<TensorAccess> layers;  // in registration order
  std::vector<int64_t> shape;        // the common tensor shape (for messages)
  std::string form;                  // e.g. "kv-first NHD", "block-first HND", "single-plane"
  // Bytes of this group inside one chunk object.
  uint64_t BytesPerChunk(int64_t chunk_tokens) const {
    return static_cast<uint64_t>(kv_size) * layers.size() * chunk_tokens * row_bytes;
  }
};

struct KvLayout {
  int64_t chunk_tokens = 0;
  std::vector<KernelGroup> groups;
  size_t num_engine_groups = 1;
  uint64_t object_bytes = 0;       // sum over groups of BytesPerChunk
  std::string Describe() const;    // one line for logs and /status
};

// Bytes per element of a torch dtype name ("bfloat16" → 2); 0 if unknown.
int64_t DtypeSize(const std::string& dtype);

// Builds and validates the plan. Every tensor must have a positive mapping size, a
// view that fits inside it, and a shape kvd recognises; chunk_tokens must be a multiple
// of every group's tokens_per_block. Errors name the tensor and what did not fit.
Result<KvLayout> BuildLayout(const std::vector<wire::TensorDescriptor>& tensors,
                             const wire::LayoutHints& hints,
                             const std::vector<wire::EngineGroupInfo>& group_infos,
                             int64_t chunk_tokens);

}  // namespace kvd::layout
