#include "transfer/cuda/ipc_handles.h"

#include "common/hex.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace kvd::transfer::cuda {
namespace {

constexpr char kShareableCudaMalloc = 'c';
constexpr char kShareableExpandable = 'e';
constexpr uint8_t kMaxShareableVersion = 16;  // torch 2.15 writes <= 3; leave headroom

IpcHandle Copy64(std::string_view bytes) {
  IpcHandle h{};
  std::memcpy(h.data(), bytes.data(), kIpcHandleBytes);
  return h;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

uint64_t ReadBigEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

void WriteBigEndian64(uint64_t v, uint8_t* p) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<uint8_t>(v & 0xff);
    v >>= 8;
  }
}

Status ExpandableError(std::string_view what) {
  return Status::InvalidArgument(
      std::string(what) +
      " names an expandable-segment allocation (PYTORCH_CUDA_ALLOC_CONF="
      "expandable_segments:True or vLLM sleep mode); it cannot be opened with CUDA IPC: "
      "turn expandable segments off in the vLLM worker");
}

}  // namespace

Result<IpcHandle> ParseTorchMemHandle(std::string_view b) {
  constexpr std::string_view what = "mem handle";
  if (b.size() == kIpcHandleBytes) return Copy64(b);  // torch < ~2.2: the raw handle
  if (b.size() == kIpcHandleBytes + 1) {               // [type][handle]
    if (b[0] == kShareableExpandable) return ExpandableError(what);
    if (b[0] == kShareableCudaMalloc) return Copy64(b.substr(1));
  } else if (b.size() == kIpcHandleBytes + 2) {        // [version][type][handle]
    if (static_cast<uint8_t>(b[0]) > kMaxShareableVersion) {
      return Status::InvalidArgument("mem handle: shareable-handle version " +
                                     std::to_string(static_cast<uint8_t>(b[0])) +
                                     " is newer than kvd understands");
    }
    if (b[1] == kShareableExpandable) return ExpandableError(what);
    if (b[1] == kShareableCudaMalloc) return Copy64(b.substr(2));
  } else if (b.size() > 2 && (b[0] == kShareableExpandable || b[1] == kShareableExpandable)) {
    return ExpandableError(what);
  }
  return Status::InvalidArgument(
      "mem handle: " + std::to_string(b.size()) +
      " bytes is not a CUDA IPC handle (expected 64 raw bytes, or torch's [version]['c'] + 64)");
}

Result<IpcHandle> ParseRawMemHandle(std::string_view b) {
  if (b.size() != kIpcHandleBytes) {
    return Status::InvalidArgument("ipc_handle: " + std::to_string(b.size()) +
                                   " bytes, a cudaIpcMemHandle_t has 64");
  }
  return Copy64(b);
}

Result<DeviceUuid> ParseDeviceUuid(std::string_view text) {
  std::string_view s = text;
  if (s.size() > 4 && (s.substr(0, 4) == "GPU-" || s.substr(0, 4) == "MIG-")) s.remove_prefix(4);
  DeviceUuid out{};
  size_t nibbles = 0;
  for (char c : s) {
    if (c == '-') continue;
    int v = HexValue(c);
    if (v < 0 || nibbles >= 32) {
      nibbles = 33;  // malformed
      break;
    }
    out[nibbles / 2] = static_cast<uint8_t>(out[nibbles / 2] | (nibbles % 2 ? v : v << 4));
    ++nibbles;
  }
  if (nibbles != 32) {
    return Status::InvalidArgument("device_uuid '" + std::string(text.substr(0, 64)) +
                                   "' is not a GPU UUID (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
                                   "xxxxxxxxxxxx)");
  }
  return out;
}

std::string FormatDeviceUuid(const DeviceUuid& u) {
  std::string s = "GPU-";
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    AppendHex(s, &u[i], 1);
  }
  return s;
}

std::optional<int> FindDeviceOrdinal(const DeviceUuid& uuid, std::span<const DeviceUuid> devices) {
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] == uuid) return static_cast<int>(i);
  }
  return std::nullopt;
}

Result<EventHandle> ParseEventHandle(std::string_view b) {
  EventHandle e;
  if (b.empty()) return e;
  if (b.size() == kIpcHandleBytes) {
    e.kind = EventKind::kCudaIpc;
    e.handle = Copy64(b);
    return e;
  }
  if (b.size() == kTimelineHandleBytes) {
    const auto* p = reinterpret_cast<const uint8_t*>(b.data());
    if (p[0] != kTimelineHandleVersion) {
      return Status::InvalidArgument("event handle: timeline-semaphore version " +
                                     std::to_string(p[0]) + " is not supported");
    }
    e.kind = EventKind::kTimeline;
    e.handle = Copy64(b.substr(1, kIpcHandleBytes));
    e.slot_offset = ReadBigEndian64(p + 1 + kIpcHandleBytes);
    e.sequence = ReadBigEndian64(p + 1 + kIpcHandleBytes + 8);
    if (e.slot_offset % kTimelineSlotBytes != 0 || e.slot_offset > (uint64_t{1} << 32)) {
      return Status::InvalidArgument("event handle: timeline slot offset " +
                                     std::to_string(e.slot_offset) + " is not a valid slot");
    }
    return e;
  }
  return Status::InvalidArgument("event handle: " + std::to_string(b.size()) +
                                 " bytes (expected 0, a 64-byte cudaIpcEventHandle_t, or an "
                                 "81-byte timeline-semaphore handle)");
}

std::string EncodeEventHandle(const EventHandle& e) {
  switch (e.kind) {
    case EventKind::kNone:
      return {};
    case EventKind::kCudaIpc:
      return std::string(reinterpret_cast<const char*>(e.handle.data()), kIpcHandleBytes);
    case EventKind::kTimeline: {
      std::string out(kTimelineHandleBytes, '\0');
      auto* p = reinterpret_cast<uint8_t*>(out.data());
      p[0] = kTimelineHandleVersion;
      std::memcpy(p + 1, e.handle.data(), kIpcHandleBytes);
      WriteBigEndian64(e.slot_offset, p + 1 + kIpcHandleBytes);
      WriteBigEndian64(e.sequence, p + 1 + kIpcHandleBytes + 8);
      return out;
    }
  }
  return {};
}

Result<TensorMemory> DescribeTensorMemory(const layout::TensorDescriptor& d, size_t index) {
  return DescribeTensorMemory(d, "kv_cache[" + std::to_string(index) + "]");
}

Result<TensorMemory> DescribeTensorMemory(const layout::TensorDescriptor& d, const std::string& name) {
  TensorMemory m;
  auto uuid = ParseDeviceUuid(d.device_uuid);
  if (!uuid.ok()) return Status::InvalidArgument(name + ": " + uuid.status().message());
  m.device = *uuid;
  switch (d.memory) {
    case layout::TensorMemory::kCuda: {
      auto h = ParseTorchMemHandle(d.cuda_mem_handle);
      if (!h.ok()) return Status::InvalidArgument(name + ": " + h.status().message());
      m.handle = *h;
      m.offset = d.cuda_storage_offset_bytes;
      m.bytes = d.cuda_storage_size;
      if (d.cuda_event_sync_required) {
        if (d.cuda_event_handle.size() != kIpcHandleBytes) {
          return Status::InvalidArgument(name + ": event_sync_required with a " +
                                         std::to_string(d.cuda_event_handle.size()) +
                                         "-byte event handle (expected 64)");
        }
        m.sync_event = true;
        std::memcpy(m.event.data(), d.cuda_event_handle.data(), kIpcHandleBytes);
      }
      break;
    }
    case layout::TensorMemory::kCudaRaw: {
      auto h = ParseRawMemHandle(d.raw_ipc_handle);
      if (!h.ok()) return Status::InvalidArgument(name + ": " + h.status().message());
      m.handle = *h;
      m.offset = d.raw_alloc_offset;
      m.bytes = d.nbytes;
      break;
    }
    default:
      return Status::InvalidArgument(name + " is not CUDA IPC memory");
  }
  if (m.bytes == 0) return Status::InvalidArgument(name + ": its memory is 0 bytes");
  if (m.offset > (uint64_t{1} << 60) || m.bytes > (uint64_t{1} << 60)) {
    return Status::InvalidArgument(name + ": offset " + std::to_string(m.offset) + " / size " +
                                   std::to_string(m.bytes) + " out of range");
  }
  if (m.bytes < d.nbytes) {  // the layout checked the view against d.nbytes
    return Status::InvalidArgument(name + ": mapping of " + std::to_string(m.bytes) +
                                   " bytes is smaller than the " + std::to_string(d.nbytes) +
                                   " the layout was checked against");
  }
  return m;
}

Status CheckInAllocation(const TensorMemory& m, uint64_t allocation_bytes, size_t index) {
  return CheckInAllocation(m, allocation_bytes, "kv_cache[" + std::to_string(index) + "]");
}

Status CheckInAllocation(const TensorMemory& m, uint64_t allocation_bytes, const std::string& name) {
  if (allocation_bytes == 0) return Status::Ok();
  if (m.offset > allocation_bytes || m.bytes > allocation_bytes - m.offset) {
    return Status::InvalidArgument(
        name + ": bytes [" + std::to_string(m.offset) + ", " +
        std::to_string(m.offset + m.bytes) + ") lie outside its " +
        std::to_string(allocation_bytes) + "-byte GPU allocation");
  }
  return Status::Ok();
}

std::vector<AllocationUse> GroupByAllocation(std::span<const TensorMemory> tensors) {
  std::vector<AllocationUse> out;
  std::map<IpcHandle, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto [it, inserted] = index.emplace(tensors[i].handle, out.size());
    if (inserted) {
      out.emplace_back();
      out.back().handle = tensors[i].handle;
    }
    auto& use = out[it->second];
    use.tensors.push_back(i);
    use.end = std::max(use.end, tensors[i].offset + tensors[i].bytes);
  }
  return out;
}

}  // namespace kvd::transfer::cuda
