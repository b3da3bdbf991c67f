// The CopyEngine contract on the machine CI has (no GPU): the CPU engine executes plans
// byte-exactly and runs on_complete once before its ticket reads done; OpenDeviceEngine
// refuses GPU tensors with a clear FailedPrecondition when this build has no CUDA or this
// machine no usable driver/device, and does not disturb anything else.
#include "transfer/copy_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>

#include "../layout/layout_test_util.h"

namespace kvd::transfer {
namespace {

using ::testing::HasSubstr;
using namespace kvd::layout::test_util;  // NOLINT

TEST(CopyEngineTest, CpuEngineGathersAndScattersLikeCpuCopy) {
  TestModel m = FlashAttention(3, 24, 16, 4, 32, Order::kHndView);
  auto l = layout::BuildLayout(m.Descriptors(), m.hints, m.infos, 64);
  ASSERT_TRUE(l.ok());
  Buffers src = Buffers::Random(m, 3);
  auto engine = MakeCpuCopyEngine(*l, src.Bases(m), 2);
  EXPECT_STREQ(engine->caps().name, "cpu");
  EXPECT_FALSE(engine->caps().asynchronous);
  EXPECT_FALSE(engine->caps().exports_events);

  std::vector<std::vector<int64_t>> ids = {std::vector<int64_t>(8)};
  std::iota(ids[0].begin(), ids[0].end(), 4);
  std::vector<uint8_t> a(l->object_bytes), b(l->object_bytes), want(l->object_bytes);
  int completions = 0;
  CopyPlan plan;
  plan.direction = CopyDirection::kGather;
  plan.block_ids = ids;
  plan.tasks = {{0, a.data(), 0}, {1, b.data(), 0}};
  plan.on_complete = [&](const Status& st) {
    EXPECT_TRUE(st.ok());
    ++completions;
  };
  auto sub = engine->Submit(std::move(plan));
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  EXPECT_TRUE(sub->status.ok());
  EXPECT_EQ(sub->event_handle, "");
  EXPECT_EQ(completions, 1);
  EXPECT_EQ(*engine->Poll(sub->ticket), true);
  EXPECT_TRUE(engine->Wait(sub->ticket, std::chrono::milliseconds(0)).ok());
  EXPECT_FALSE(engine->Poll(sub->ticket + 1).ok());
  GatherChunk(*l, src.Bases(m), ids, 1, want.data());
  EXPECT_TRUE(b == want);

  Buffers dst = Buffers::Zeroed(m), ref = Buffers::Zeroed(m);
  auto scatter = MakeCpuCopyEngine(*l, dst.Bases(m), 1);
  CopyPlan back;
  back.direction = CopyDirection::kScatter;
  back.block_ids = ids;
  back.tasks = {{1, b.data(), 9}};
  ASSERT_TRUE(scatter->Submit(std::move(back)).ok());
  ScatterChunk(*l, ref.Bases(m), ids, 1, b.data(), 9);
  EXPECT_TRUE(dst.seg == ref.seg);
}

TEST(CopyEngineTest, CpuEngineRefusesBadPlansWithoutRunningThem) {
  TestModel m = Mla(1, 8, 64);
  auto l = layout::BuildLayout(m.Descriptors(), m.hints, m.infos, 64);
  ASSERT_TRUE(l.ok());
  Buffers src = Buffers::Random(m, 1);
  auto engine = MakeCpuCopyEngine(*l, src.Bases(m), 1);
  std::vector<uint8_t> obj(l->object_bytes);
  bool ran = false;
  CopyPlan plan;
  plan.block_ids = {{99}};  // out of range
  plan.tasks = {{0, obj.data(), 0}};
  plan.on_complete = [&](const Status&) { ran = true; };
  EXPECT_EQ(engine->Submit(std::move(plan)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ran);
}

// A registration as lmcache 0.5.6 sends it for a GPU worker (CudaIPCWrapper descriptors).
std::vector<wire::TensorDescriptor> GpuTensors() {
  TestModel m = FlashAttention(2, 16, 16, 2, 64, Order::kNhd);
  std::vector<wire::TensorDescriptor> out = m.Descriptors();
  for (auto& d : out) {
    d.memory = wire::TensorMemory::kCuda;
    d.device_uuid = "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789ab";
    d.cuda_mem_handle = std::string("\x03" "c", 2) + std::string(64, '\x5a');
    d.cuda_storage_size = d.nbytes;
    d.cuda_event_handle = std::string(64, '\0');
    d.shm_name.clear();
  }
  return out;
}

TEST(CopyEngineTest, DeviceEngineFailsCleanlyWithoutCudaDriverOrDevice) {
  auto tensors = GpuTensors();
  auto l = layout::BuildLayout(tensors, Hint("NHD"), {}, 64);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::vector<uint8_t> pool(1 << 16);
  auto engine = OpenDeviceEngine(tensors, *l, {pool.data(), pool.size()}, 42);
#if defined(KVD_WITH_CUDA)
  // Built with CUDA: fine on a GPU machine (this fake handle then fails to open), else the
  // runtime says CUDA is not usable here.
  if (!engine.ok() && engine.status().code() == StatusCode::kFailedPrecondition) {
    EXPECT_THAT(engine.status().message(), HasSubstr("CUDA"));
  } else {
    EXPECT_FALSE(engine.ok());  // the fake IPC handle cannot be opened
  }
#else
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(engine.status().message(), HasSubstr("no CUDA support"));
  EXPECT_THAT(engine.status().message(), HasSubstr("kv_cache[0]"));
#endif
  // And again: a failed first attempt leaves nothing behind that breaks a second one.
  auto again = OpenDeviceEngine(tensors, *l, {pool.data(), pool.size()}, 43);
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), engine.ok() ? StatusCode::kOk : engine.status().code());
}

}  // namespace
}  // namespace kvd::transfer
