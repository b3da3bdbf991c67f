// Host-only parsing for the CUDA data path: the untrusted bytes a client sends to name GPU
// memory, devices and events, turned into checked values. Plain C++ (no CUDA headers), so
// it is built and unit-tested on every machine; the CUDA engine only consumes the results.
//
// What lmcache 0.5.6 sends (ext-1 descriptors, see wire/codec.cc):
//   "cuda"      PyTorch's UntypedStorage._share_cuda_() 8-tuple. Its mem handle is torch's
//               "shareable handle": [version byte (<= 3 in torch 2.15)]['c'][64-byte
//               cudaIpcMemHandle_t] for cudaMalloc'd segments, 'e' for expandable segments
//               (not importable with cudaIpcOpenMemHandle). Torch before ~2.2 sent the raw
//               64 bytes. The handle maps the whole cudaMalloc segment; the storage starts
//               storage_offset_bytes into it and is storage_size_bytes long.
//   "cuda_raw"  a raw 64-byte cudaIpcMemHandle_t of the allocation, alloc_offset and nbytes.
//   device_uuid str(torch.cuda.get_device_properties(i).uuid): "GPU-xxxxxxxx-xxxx-xxxx-xxxx-
//               xxxxxxxxxxxx" (MIG instances: "MIG-…"), the same 16 bytes as cudaDeviceProp::uuid.
// Event handles on STORE/RETRIEVE (the client's, and the one kvd returns):
//   64 bytes    cudaIpcEventHandle_t (torch.cuda.Event(interprocess=True).ipc_handle()).
//   81 bytes    lmcache's timeline-semaphore event (isolated IPC mode): struct "!B64sQQ" =
//               version 1, the cudaIpcMemHandle_t of a buffer of 8-byte slots, the byte offset
//               of the slot, and the sequence number the slot reaches when the event fires.
//   empty       no device work to wait for.
//
// Thread-safe: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "layout/tensor_spec.h"

namespace kvd::transfer::cuda {

inline constexpr size_t kIpcHandleBytes = 64;       // cudaIpcMemHandle_t / cudaIpcEventHandle_t
inline constexpr size_t kTimelineHandleBytes = 81;  // 1 + 64 + 8 + 8
inline constexpr uint8_t kTimelineHandleVersion = 1;
inline constexpr uint64_t kTimelineSlotBytes = 8;

using IpcHandle = std::array<uint8_t, kIpcHandleBytes>;
using DeviceUuid = std::array<uint8_t, 16>;

// The 64-byte cudaIpcMemHandle_t inside a torch shareable handle (any of the forms above).
// InvalidArgument for other lengths, unknown type tags, and expandable segments (with a
// hint: PYTORCH_CUDA_ALLOC_CONF=expandable_segments cannot be shared this way).
Result<IpcHandle> ParseTorchMemHandle(std::string_view bytes);

// A raw 64-byte handle ("cuda_raw" descriptors).
Result<IpcHandle> ParseRawMemHandle(std::string_view bytes);

// "GPU-8-4-4-4-12" (or "MIG-…", or the bare 32 hex digits with or without dashes) → 16 bytes.
Result<DeviceUuid> ParseDeviceUuid(std::string_view text);
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase (torch's form).
std::string FormatDeviceUuid(const DeviceUuid& uuid);
// Index of `uuid` in `devices` (the local ordinals' UUIDs), if present.
std::optional<int> FindDeviceOrdinal(const DeviceUuid& uuid, std::span<const DeviceUuid> devices);

enum class EventKind : uint8_t { kNone, kCudaIpc, kTimeline };

struct EventHandle {
  EventKind kind = EventKind::kNone;
  IpcHandle handle{};        // kCudaIpc: the event; kTimeline: the semaphore buffer's memory
  uint64_t slot_offset = 0;  // kTimeline: byte offset of the 8-byte slot (8-aligned)
  uint64_t sequence = 0;     // kTimeline: fired when the slot's value >= this (0: already)
};

Result<EventHandle> ParseEventHandle(std::string_view bytes);
std::string EncodeEventHandle(const EventHandle& handle);  // inverse of ParseEventHandle

// Where one registered tensor's mapping lies inside the IPC allocation its handle opens.
// The tensor's elements start at allocation base + offset + storage_offset * itemsize, and
// the layout's span check guarantees the view stays inside [offset, offset + bytes).
struct TensorMemory {
  IpcHandle handle{};
  uint64_t offset = 0;  // bytes from the allocation base to the mapping's first byte
  uint64_t bytes = 0;   // length of the mapping
  DeviceUuid device{};
  bool sync_event = false;  // "cuda": wait once on `event` before first use
  IpcHandle event{};
};

// Checks and extracts a "cuda" or "cuda_raw" descriptor; names tensor `index` in errors
// ("kv_cache[i]"), or `name` for the second form.
Result<TensorMemory> DescribeTensorMemory(const layout::TensorDescriptor& desc, size_t index);
Result<TensorMemory> DescribeTensorMemory(const layout::TensorDescriptor& desc, const std::string& name);

// The allocation a handle opened is `allocation_bytes` long (0: unknown, nothing to check):
// every tensor's [offset, offset + bytes) must fit in it.
Status CheckInAllocation(const TensorMemory& mem, uint64_t allocation_bytes, size_t index);
Status CheckInAllocation(const TensorMemory& mem, uint64_t allocation_bytes, const std::string& name);

// Tensors grouped by allocation (equal handle bytes): each allocation is opened once.
struct AllocationUse {
  IpcHandle handle{};
  std::vector<size_t> tensors;  // registration indices, ascending
  uint64_t end = 0;             // max over its tensors of offset + bytes
};
std::vector<AllocationUse> GroupByAllocation(std::span<const TensorMemory> tensors);

}  // namespace kvd::transfer::cuda
