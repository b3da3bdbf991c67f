// Host-only parsing of what lmcache 0.5.6 sends for GPU memory: torch shareable mem
// handles, device UUIDs, event handles (CUDA IPC and lmcache's timeline semaphores), the
// byte range of each tensor inside its allocation, and allocation dedup.
#include "transfer/cuda/ipc_handles.h"

#include "transfer/copy_engine.h"
#include "wire/messages.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace kvd::transfer::cuda {
namespace {

using ::testing::HasSubstr;

std::string Bytes64(uint8_t first) {
  std::string s(64, '\0');
  for (int i = 0; i < 64; ++i) s[i] = static_cast<char>(first + i);
  return s;
}

IpcHandle Handle(uint8_t first) {
  IpcHandle h;
  for (int i = 0; i < 64; ++i) h[i] = static_cast<uint8_t>(first + i);
  return h;
}

TEST(CudaIpcHandlesTest, TorchMemHandleForms) {
  // torch 2.15 (read off libc10_cuda's getIpcDevPtr): [version <= 3]['c'][64 bytes].
  auto v3 = ParseTorchMemHandle(std::string("\x03" "c", 2) + Bytes64(7));
  ASSERT_TRUE(v3.ok()) << v3.status().ToString();
  EXPECT_EQ(*v3, Handle(7));
  auto v1 = ParseTorchMemHandle(std::string("\x01" "c", 2) + Bytes64(9));
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(*v1, Handle(9));
  // A type tag without a version byte, and old torch's raw 64 bytes.
  auto tagged = ParseTorchMemHandle("c" + Bytes64(1));
  ASSERT_TRUE(tagged.ok());
  EXPECT_EQ(*tagged, Handle(1));
  auto raw = ParseTorchMemHandle(Bytes64(200));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, Handle(200));
}

TEST(CudaIpcHandlesTest, TorchMemHandleRefusals) {
  auto expandable = ParseTorchMemHandle(std::string("\x03" "e", 2) + Bytes64(0));
  EXPECT_EQ(expandable.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(expandable.status().message(), HasSubstr("expandable"));
  auto longer_expandable = ParseTorchMemHandle(std::string("\x03" "e", 2) + std::string(120, 'x'));
  EXPECT_THAT(longer_expandable.status().message(), HasSubstr("expandable"));
  EXPECT_FALSE(ParseTorchMemHandle(std::string("\x03" "x", 2) + Bytes64(0)).ok());
  EXPECT_FALSE(ParseTorchMemHandle(std::string("\xff" "c", 2) + Bytes64(0)).ok());  // future version
  EXPECT_FALSE(ParseTorchMemHandle("").ok());
  EXPECT_FALSE(ParseTorchMemHandle(Bytes64(0).substr(0, 63)).ok());
  EXPECT_FALSE(ParseTorchMemHandle(std::string(67, 'c')).ok());
  EXPECT_FALSE(ParseRawMemHandle(Bytes64(0) + "x").ok());
  EXPECT_TRUE(ParseRawMemHandle(Bytes64(0)).ok());
}

TEST(CudaIpcHandlesTest, DeviceUuidRoundTripAndLookup) {
  const std::string text = "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789ab";
  auto u = ParseDeviceUuid(text);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ((*u)[0], 0x5f);
  EXPECT_EQ((*u)[15], 0xab);
  EXPECT_EQ(FormatDeviceUuid(*u), text);
  // Upper case, MIG prefix and no dashes parse to the same bytes.
  EXPECT_EQ(*ParseDeviceUuid("GPU-5F3E2A10-9B7C-4D21-8E0F-0123456789AB"), *u);
  EXPECT_EQ(*ParseDeviceUuid("MIG-5f3e2a10-9b7c-4d21-8e0f-0123456789ab"), *u);
  EXPECT_EQ(*ParseDeviceUuid("5f3e2a109b7c4d218e0f0123456789ab"), *u);
  for (const char* bad : {"cpu", "GPU-", "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789a",
                          "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789abc", "GPU-zz3e2a10-9b7c-4d21-8e0f-0123456789ab"}) {
    EXPECT_FALSE(ParseDeviceUuid(bad).ok()) << bad;
  }
  DeviceUuid other = *u;
  other[3] ^= 1;
  std::vector<DeviceUuid> devices = {other, *u};
  EXPECT_EQ(FindDeviceOrdinal(*u, devices), 1);
  EXPECT_EQ(FindDeviceOrdinal(*u, std::vector<DeviceUuid>{other}), std::nullopt);
}

TEST(CudaIpcHandlesTest, EventHandles) {
  auto none = ParseEventHandle("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->kind, EventKind::kNone);
  EXPECT_EQ(EncodeEventHandle(*none), "");

  auto ipc = ParseEventHandle(Bytes64(3));
  ASSERT_TRUE(ipc.ok());
  EXPECT_EQ(ipc->kind, EventKind::kCudaIpc);
  EXPECT_EQ(ipc->handle, Handle(3));
  EXPECT_EQ(EncodeEventHandle(*ipc), Bytes64(3));

  // lmcache's timeline semaphore: struct.pack("!B64sQQ", 1, handle, 24, 0x0102030405060708).
  std::string ts = std::string(1, '\x01') + Bytes64(5) + std::string("\0\0\0\0\0\0\0\x18", 8) +
                   std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  ASSERT_EQ(ts.size(), kTimelineHandleBytes);
  auto tl = ParseEventHandle(ts);
  ASSERT_TRUE(tl.ok()) << tl.status().ToString();
  EXPECT_EQ(tl->kind, EventKind::kTimeline);
  EXPECT_EQ(tl->handle, Handle(5));
  EXPECT_EQ(tl->slot_offset, 24u);
  EXPECT_EQ(tl->sequence, 0x0102030405060708u);
  EXPECT_EQ(EncodeEventHandle(*tl), ts);

  std::string bad_version = ts;
  bad_version[0] = 2;
  EXPECT_FALSE(ParseEventHandle(bad_version).ok());
  std::string misaligned = ts;
  misaligned[1 + 64 + 7] = 0x19;
  EXPECT_FALSE(ParseEventHandle(misaligned).ok());
  EXPECT_FALSE(ParseEventHandle(Bytes64(0) + "x").ok());
  EXPECT_FALSE(ParseEventHandle("short").ok());
}

wire::TensorDescriptor CudaDesc(uint8_t handle_seed, uint64_t storage_bytes, uint64_t offset_bytes) {
  wire::TensorDescriptor d;
  d.memory = wire::TensorMemory::kCuda;
  d.dtype = "bfloat16";
  d.shape = {2, 4, 16, 2, 8};
  d.stride = {1024, 256, 16, 8, 1};
  d.device_uuid = "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789ab";
  d.cuda_mem_handle = std::string("\x03" "c", 2) + Bytes64(handle_seed);
  d.cuda_storage_size = storage_bytes;
  d.cuda_storage_offset_bytes = offset_bytes;
  d.nbytes = storage_bytes;
  d.cuda_event_handle = std::string(64, '\0');
  return d;
}

TEST(CudaIpcHandlesTest, DescribeTensorMemory) {
  auto d = CudaDesc(1, 4096, 1 << 20);
  auto m = DescribeTensorMemory(d, 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->handle, Handle(1));
  EXPECT_EQ(m->offset, 1u << 20);
  EXPECT_EQ(m->bytes, 4096u);
  EXPECT_FALSE(m->sync_event);
  EXPECT_TRUE(CheckInAllocation(*m, (1 << 20) + 4096, 0).ok());
  EXPECT_TRUE(CheckInAllocation(*m, 0, 0).ok());  // size unknown: nothing to check
  Status outside = CheckInAllocation(*m, (1 << 20) + 4095, 3);
  EXPECT_EQ(outside.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("kv_cache[3]"));

  d.cuda_event_sync_required = true;
  d.cuda_event_handle = Bytes64(9);
  m = DescribeTensorMemory(d, 0);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->sync_event);
  EXPECT_EQ(m->event, Handle(9));
  d.cuda_event_handle = "";
  EXPECT_FALSE(DescribeTensorMemory(d, 0).ok());

  wire::TensorDescriptor raw;
  raw.memory = wire::TensorMemory::kCudaRaw;
  raw.device_uuid = "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789ab";
  raw.raw_ipc_handle = Bytes64(4);
  raw.raw_alloc_offset = 512;
  raw.nbytes = 2048;
  m = DescribeTensorMemory(raw, 2);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->handle, Handle(4));
  EXPECT_EQ(m->offset, 512u);
  EXPECT_EQ(m->bytes, 2048u);
  EXPECT_FALSE(CheckInAllocation(*m, 2559, 2).ok());
  EXPECT_TRUE(CheckInAllocation(*m, 2560, 2).ok());

  // Refusals name the tensor.
  auto bad = CudaDesc(1, 4096, 0);
  bad.device_uuid = "cpu";
  EXPECT_THAT(DescribeTensorMemory(bad, 5).status().message(), HasSubstr("kv_cache[5]"));
  bad = CudaDesc(1, 0, 0);
  bad.nbytes = 0;
  EXPECT_FALSE(DescribeTensorMemory(bad, 0).ok());
  bad = CudaDesc(1, 4096, ~uint64_t{0});  // a negative int on the wire
  EXPECT_FALSE(DescribeTensorMemory(bad, 0).ok());
  bad = CudaDesc(1, 4096, 0);
  bad.memory = wire::TensorMemory::kCpuShm;
  EXPECT_THAT(DescribeTensorMemory(bad, 0).status().message(), HasSubstr("not CUDA"));
  // A tensor that is not a KV cache (a rope table: CopyEngine::ReadDeviceTensor) is named as
  // its caller says, in both checks.
  EXPECT_EQ(DescribeTensorMemory(bad, std::string("the tensor")).status().message().rfind("the tensor ", 0), 0u);
  Status named = CheckInAllocation(*m, 2559, std::string("the tensor"));
  EXPECT_EQ(named.message().rfind("the tensor: bytes [512, 2560)", 0), 0u) << named.ToString();
}

TEST(CudaIpcHandlesTest, AllocationsAreOpenedOncePerHandle) {
  // vLLM allocates one buffer per layer, or one shared buffer viewed by many layers; torch
  // sends the same handle for every storage carved from one cudaMalloc segment.
  std::vector<TensorMemory> mem;
  for (auto [seed, off] : std::vector<std::pair<uint8_t, uint64_t>>{{1, 0}, {2, 0}, {1, 8192}, {1, 4096}}) {
    auto m = DescribeTensorMemory(CudaDesc(seed, 4096, off), mem.size());
    ASSERT_TRUE(m.ok());
    mem.push_back(*m);
  }
  auto uses = GroupByAllocation(mem);
  ASSERT_EQ(uses.size(), 2u);
  EXPECT_EQ(uses[0].handle, Handle(1));
  EXPECT_EQ(uses[0].tensors, (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ(uses[0].end, 8192u + 4096u);
  EXPECT_EQ(uses[1].handle, Handle(2));
  EXPECT_EQ(uses[1].tensors, (std::vector<size_t>{1}));
}

TEST(CudaIpcHandlesTest, DeviceMemoryIdsNameEachAllocationOnce) {
  // Two tensors in allocation 1, one in allocation 2, one whose descriptor does not parse.
  auto unparsable = CudaDesc(3, 4096, 0);
  unparsable.device_uuid = "cpu";
  const auto ids = transfer::DeviceMemoryIds(
      {CudaDesc(1, 4096, 0), CudaDesc(2, 4096, 0), unparsable, CudaDesc(1, 4096, 4096)});
  auto hex = [](int first) {  // Bytes64(first), as lowercase hex
    std::string s;
    char two[3];
    for (int i = 0; i < 64; ++i) {
      std::snprintf(two, sizeof two, "%02x", first + i);
      s += two;
    }
    return s;
  };
  const std::string h1 = hex(1), h2 = hex(2);
  const std::string device = "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789ab";
  EXPECT_EQ(ids, (std::vector<std::string>{"cuda " + device + " " + h1, "cuda " + device + " " + h2}));
}

}  // namespace
}  // namespace kvd::transfer::cuda
