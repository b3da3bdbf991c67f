// The registered KV tensors, layout hints and engine groups of a worker, as layout and the
// copy engines read them. The wire decoders (wire/request_decoders.cc) fill them from
// lmcache's frames; nothing here is trusted: layout::BuildLayout and the engines check
// every field. Plain values that own their data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvd::layout {

// Kind of device memory a registered tensor lives in (the ext-1 descriptor's tag).
enum class TensorMemory : uint8_t { kCpuShm, kCuda, kCudaRaw, kCudaVmm };

// A registered KV tensor: an (untrusted) description of a strided view into memory the
// client shares with kvd. Sizes, strides and offsets are in elements of `dtype`.
struct TensorDescriptor {
  TensorMemory memory = TensorMemory::kCpuShm;
  std::string dtype;                 // torch dtype name without "torch.", e.g. "bfloat16"
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t storage_offset = 0;
  std::string device_uuid;           // "cpu" or "GPU-…"
  // kCpuShm: POSIX shared-memory name and the byte length to map.
  std::string shm_name;
  uint64_t nbytes = 0;
  // kCuda: PyTorch's _share_cuda_ tuple.
  int64_t cuda_device_index = 0;
  std::string cuda_mem_handle;       // may carry a 1-byte type prefix
  uint64_t cuda_storage_size = 0;
  uint64_t cuda_storage_offset_bytes = 0;
  std::string cuda_event_handle;
  bool cuda_event_sync_required = false;
  // kCudaRaw: raw cudaIpcMemHandle_t (64 bytes) and a byte range of the allocation.
  std::string raw_ipc_handle;
  uint64_t raw_alloc_offset = 0;
};

struct LayoutHints {
  std::optional<std::string> kv_layout;   // "NHD" | "HND" | "BLHNC" | "BLNHC" …
  std::optional<int64_t> num_kv_heads;
  std::optional<int64_t> tokens_per_block;
  std::optional<int64_t> head_dim;
  std::optional<std::string> kv_list_layout;
};

struct EngineGroupInfo {
  int64_t engine_group_id = 0;
  std::vector<int64_t> layer_indices;
  int64_t tokens_per_block = 0;      // 0: not reported by the engine
  int64_t sw_size_tokens = -1;       // -1: not sliding-window
  int64_t extra_object_group_tag = 0;
  bool recurrent_state = false;
};

}  // namespace kvd::layout
