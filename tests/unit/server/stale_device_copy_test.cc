// Issue 11, finding 2 (stale device copies): a GPU copy runs when the client's event fires,
// so it may land long after the write TTL. The memory it writes must still be its own: held
// past every TTL until the engine reports completion, and the instance whose copy never
// completes is cancelled before that memory is reused.
//
// A threaded, gated host engine stands in for the CUDA engine: Submit queues the copy; the
// copy runs on the engine's own thread only when the test opens the gate (the client's
// event fires), then reports completion — failed once the engine was cancelled, as the CUDA
// engine does. Under ThreadSanitizer (make test-tsan) a late copy into reused memory is
// also a data race with the new owner's writes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "server/kv_service.h"
#include "transfer/copy_engine.h"

namespace kvd::server {
namespace {

constexpr int64_t kChunk = 256, kBlock = 16, kBlocks = 64, kHeads = 2, kHead = 8, kLayers = 2;
constexpr int64_t kPlane = kBlocks * kBlock * kHeads * kHead;
constexpr uint64_t kLayerBytes = 2 * kPlane * 2;
constexpr uint64_t kSegment = kLayerBytes * kLayers;
// One chunk object: 2 layers x K/V x 256 tokens x 16 elements x 2 bytes.
constexpr uint64_t kObject = kLayers * 2 * kChunk * kHeads * kHead * 2;

class Segment {
 public:
  explicit Segment(const std::string& name) : name_(name + "_" + std::to_string(getpid())) {
    shm_unlink(name_.c_str());
    int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kSegment), 0);
    data_ = static_cast<uint8_t*>(mmap(nullptr, kSegment, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~Segment() {
    munmap(data_, kSegment);
    shm_unlink(name_.c_str());
  }
  wire::RegisterKvCacheRequest Registration(int64_t id, wire::TensorMemory memory) const {
    wire::RegisterKvCacheRequest r;
    r.instance_id = id;
    r.model_name = "llama";
    r.world_size = 1;
    r.engine_type = "vllm";
    for (int64_t l = 0; l < kLayers; ++l) {
      wire::TensorDescriptor t;
      t.memory = memory;
      t.dtype = "bfloat16";
      t.shape = {2, kBlocks, kBlock, kHeads, kHead};
      t.stride = {kPlane, kBlock * kHeads * kHead, kHeads * kHead, kHead, 1};
      t.storage_offset = l * 2 * kPlane;
      t.shm_name = name_;
      t.nbytes = kSegment;
      t.cuda_storage_size = kSegment;
      t.device_uuid = memory == wire::TensorMemory::kCpuShm ? "cpu" : "GPU-5f3e2a10-9b7c-4d21-8e0f-0123456789ab";
      r.tensors.push_back(t);
    }
    return r;
  }
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    for (uint64_t i = 0; i < kSegment; ++i) data_[i] = static_cast<uint8_t>(rng());
  }
  void Zero() { std::memset(data_, 0, kSegment); }
  std::vector<uint8_t> Bytes() const { return {data_, data_ + kSegment}; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  uint8_t* data_ = nullptr;
};

// The stand-in device engine: copies run on its thread once the gate opens.
class ThreadedGatedEngine final : public transfer::CopyEngine {
 public:
  ThreadedGatedEngine(const layout::KvLayout& l, transfer::ShmMapping map)
      : layout_(l), map_(std::move(map)), bases_(layout_.groups.empty() ? 0 : 2, map_.data()) {
    caps_.name = "threaded-gated";
    caps_.asynchronous = true;
    caps_.device_memory = true;
    caps_.exports_events = true;
    thread_ = std::thread([this] { Loop(); });
  }
  ~ThreadedGatedEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      gate_open_ = true;  // a real engine drains before it goes
    }
    cv_.notify_all();
    thread_.join();
  }
  const transfer::EngineCaps& caps() const override { return caps_; }
  Result<transfer::Submitted> Submit(transfer::CopyPlan plan) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return Status::Unavailable("cancelled");
    queue_.push_back(std::move(plan));
    transfer::Submitted s;
    s.ticket = ++issued_;
    s.event_handle = "gated-event-" + std::to_string(s.ticket);
    cv_.notify_all();
    return s;
  }
  Result<bool> Poll(transfer::Ticket t) override {
    std::lock_guard<std::mutex> lock(mu_);
    return t <= done_;
  }
  Status Wait(transfer::Ticket t, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done_ >= t; }) ? Status::Ok()
                                                                   : Status::Unavailable("timeout");
  }
  std::string Describe() const override { return "threaded gated host engine"; }
  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }

  // The client's event fires: queued copies run (late), and complete.
  void OpenGate() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      gate_open_ = true;
    }
    cv_.notify_all();
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && done_ == issued_; });
  }
  // Issue 26, item 2: the device work of a copy (and the event the client waits on) can be
  // over before the completion thread runs its completion (the commit). While held, copies
  // still run when the gate is open, but their completions wait for ReleaseCompletions.
  void HoldCompletions() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_completions_ = true;
  }
  void ReleaseCompletions() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_completions_ = false;
    }
    cv_.notify_all();
  }
  // Waits until ticket t's bytes have landed: the client's view of "the event completed".
  void WaitCopied(transfer::Ticket t) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return copied_ >= t; });
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (gate_open_ && !queue_.empty()); });
      if (queue_.empty()) return;
      transfer::CopyPlan p = std::move(queue_.front());
      queue_.pop_front();
      const bool cancelled = cancelled_;
      lock.unlock();
      // The device copy cannot be stopped once its event fired: it lands either way.
      if (p.direction == transfer::CopyDirection::kGather) {
        transfer::GatherChunks(layout_, bases_, p.block_ids, p.tasks, 1);
      } else {
        transfer::ScatterChunks(layout_, bases_, p.block_ids, p.tasks, 1);
      }
      lock.lock();
      ++copied_;  // the event the client waits on has fired
      cv_.notify_all();
      cv_.wait(lock, [&] { return stop_ || !hold_completions_; });
      lock.unlock();
      if (p.on_complete) {
        p.on_complete(cancelled ? Status::Unavailable("engine cancelled") : Status::Ok());
      }
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }

  layout::KvLayout layout_;
  transfer::ShmMapping map_;
  std::vector<uint8_t*> bases_;
  transfer::EngineCaps caps_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<transfer::CopyPlan> queue_;  // guarded by mu_
  transfer::Ticket issued_ = 0, done_ = 0, copied_ = 0;  // guarded by mu_
  bool gate_open_ = false, cancelled_ = false, stop_ = false;  // guarded by mu_
  bool hold_completions_ = false;                              // guarded by mu_
  std::thread thread_;
};

wire::CacheKey Key(std::optional<int64_t> worker, const std::string& rid, int64_t seed) {
  wire::CacheKey k;
  k.model_name = "llama";
  k.world_size = 1;
  k.worker_id = worker;
  for (int64_t i = 0; i < 2 * kChunk; ++i) k.token_ids.push_back((i * 31 + seed) % 32000);
  k.start = 0;
  k.end = 2 * kChunk;
  k.request_id = rid;
  k.num_kv_readers = 1;
  return k;
}

std::vector<std::vector<int64_t>> Blocks() {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * kChunk / kBlock; ++i) ids.push_back(i);
  return {ids};
}

class StaleDeviceCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transfer::SetDeviceEngineFactoryForTesting(
        [this](const std::vector<wire::TensorDescriptor>& tensors, const layout::KvLayout& l,
               const transfer::HostPool&, int64_t) -> Result<std::unique_ptr<transfer::CopyEngine>> {
          auto m = transfer::ShmMapping::Open(tensors[0].shm_name, tensors[0].nbytes);
          if (!m.ok()) return m.status();
          auto e = std::make_unique<ThreadedGatedEngine>(l, std::move(m).value());
          engine_ = e.get();
          return std::unique_ptr<transfer::CopyEngine>(std::move(e));
        });
    cfg_.l1_size_gb = static_cast<double>(L1Objects() * kObject) / (1ull << 30);
    cfg_.eviction_policy = "LRU";
    cfg_.shm_name = "kvd_test_stale_" + std::to_string(getpid());
    cfg_.l1_write_ttl_seconds = 1;  // short: the late copy outlives it
    cfg_.l1_read_ttl_seconds = 1;
    cfg_.worker_reap_timeout_seconds = 0;
    auto s = KvService::Create(cfg_, &clock_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    svc_ = std::move(s).value();
    ASSERT_EQ(svc_->l1_stats().capacity_bytes, L1Objects() * kObject);
  }
  // Objects L1 has room for (2: the late copies of finding 2 fill it).
  virtual uint64_t L1Objects() const { return 2; }
  void TearDown() override {
    svc_.reset();
    transfer::SetDeviceEngineFactoryForTesting(nullptr);
  }
  int64_t Hits(const std::string& rid, int64_t seed) {
    wire::LookupRequest lr{Key(std::nullopt, rid, seed), 1};
    EXPECT_TRUE(svc_->Lookup(lr).ok());
    return svc_->QueryPrefetchStatus(rid).value_or(-1);
  }

  ServerConfig cfg_;
  FakeClock clock_;
  std::unique_ptr<KvService> svc_;
  ThreadedGatedEngine* engine_ = nullptr;
};

TEST_F(StaleDeviceCopyTest, Finding2LateStoreCopyNeverLandsInAnotherObject) {
  Segment gpu("/kvd_test_stale_gpu"), cpu("/kvd_test_stale_cpu");
  gpu.Fill(1);
  cpu.Fill(2);
  ASSERT_TRUE(svc_->RegisterKvCache(gpu.Registration(1, wire::TensorMemory::kCuda)).ok());
  ThreadedGatedEngine* gated = engine_;
  ASSERT_NE(gated, nullptr);
  ASSERT_TRUE(svc_->RegisterKvCache(cpu.Registration(2, wire::TensorMemory::kCpuShm)).ok());

  // The GPU worker stores a prompt: both objects of L1 are reserved, the copy waits for
  // the client's event.
  std::string event;
  ASSERT_TRUE(svc_->Store(wire::TransferRequest{Key(0, "gpu", 11), 1, Blocks(), "", 0}, &event).ok());
  EXPECT_EQ(event, "gated-event-1");
  EXPECT_EQ(svc_->l1_stats().staging_objects, 2u);

  // Past the write TTL, the CPU worker stores another prompt. The staging memory is still
  // the GPU copy's: it must not be handed out.
  clock_.AdvanceSeconds(5);
  Status st = svc_->Store(wire::TransferRequest{Key(0, "cpu", 22), 2, Blocks(), "", 0});
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_EQ(svc_->l1_stats().staging_objects, 2u);

  // Maintenance cancels the instance whose copy is overdue; the memory stays held.
  svc_->Maintain();
  EXPECT_TRUE(gated->cancelled());
  EXPECT_EQ(svc_->num_instances(), 1u);  // only the CPU worker is left
  EXPECT_EQ(svc_->counters().cancelled_instances.load(), 1u);
  EXPECT_EQ(svc_->l1_stats().staging_objects, 2u);
  EXPECT_EQ(svc_->StatusSnapshot().device_copies_in_flight, 1u);
  EXPECT_EQ(svc_->Store(wire::TransferRequest{Key(0, "gpu2", 11), 1, Blocks(), "", 0}).code(),
            StatusCode::kNotFound);  // cancelled: the worker must register again

  // The client's event fires at last: the copy lands in its own (still held) memory while
  // the CPU worker keeps storing; the cancelled copy commits nothing.
  std::thread cpu_stores([&] {
    for (int i = 0; i < 50; ++i) {
      (void)svc_->Store(wire::TransferRequest{Key(0, "cpu-" + std::to_string(i), 22), 2, Blocks(), "", 0});
    }
  });
  gated->OpenGate();
  gated->WaitIdle();
  cpu_stores.join();
  EXPECT_EQ(svc_->StatusSnapshot().device_copies_in_flight, 0u);
  EXPECT_EQ(Hits("probe-gpu", 11), 0);  // the cancelled copy was not committed

  // Now the memory is free; the CPU worker's prompt is stored (if none of the stores above
  // got it in) and reads back intact: no byte of it came from the late device copy.
  EXPECT_TRUE(svc_->Store(wire::TransferRequest{Key(0, "cpu-final", 22), 2, Blocks(), "", 0}).ok());
  ASSERT_EQ(Hits("probe-cpu", 22), 2);
  const auto want = cpu.Bytes();
  cpu.Zero();
  ASSERT_TRUE(svc_->Retrieve(wire::TransferRequest{Key(0, "probe-cpu", 22), 2, Blocks(), "", 0}).ok());
  const auto got = cpu.Bytes();
  // Blocks 0..31 of every plane came back from L1; compare those.
  const size_t plane = kPlane * 2, stored = 2 * kChunk * kHeads * kHead * 2;
  for (size_t p = 0; p < 2 * kLayers; ++p) {
    ASSERT_EQ(std::memcmp(got.data() + p * plane, want.data() + p * plane, stored), 0)
        << "plane " << p << " was overwritten by the late device copy";
  }
}

TEST_F(StaleDeviceCopyTest, Finding2RetrievePinsHoldUntilTheLateCopyCompletes) {
  Segment gpu("/kvd_test_stale_gpu_r"), cpu("/kvd_test_stale_cpu_r");
  cpu.Fill(3);
  ASSERT_TRUE(svc_->RegisterKvCache(cpu.Registration(2, wire::TensorMemory::kCpuShm)).ok());
  ASSERT_TRUE(svc_->Store(wire::TransferRequest{Key(0, "s", 33), 2, Blocks(), "", 0}).ok());
  ASSERT_TRUE(svc_->RegisterKvCache(gpu.Registration(1, wire::TensorMemory::kCuda)).ok());
  ThreadedGatedEngine* gated = engine_;
  ASSERT_EQ(Hits("r", 33), 2);
  ASSERT_TRUE(svc_->Retrieve(wire::TransferRequest{Key(0, "r", 33), 1, Blocks(), "", 0}).ok());
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 2u);

  // Past the read TTL the retrieve is overdue: the instance is cancelled, the pinned objects
  // are neither evicted by new stores nor freed by a clear.
  clock_.AdvanceSeconds(5);
  svc_->Maintain();
  EXPECT_TRUE(gated->cancelled());
  EXPECT_EQ(svc_->num_instances(), 1u);
  EXPECT_EQ(svc_->Store(wire::TransferRequest{Key(0, "s2", 44), 2, Blocks(), "", 0}).code(),
            StatusCode::kResourceExhausted);
  svc_->Clear();
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 2u);
  EXPECT_EQ(svc_->l1_stats().used_bytes, 2 * kObject);

  gated->OpenGate();  // the late H2D copy reads its objects, which are still intact
  gated->WaitIdle();
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u);
  EXPECT_EQ(svc_->l1_stats().used_bytes, 0u);
  const auto want = cpu.Bytes();
  const auto got = gpu.Bytes();
  const size_t plane = kPlane * 2, stored = 2 * kChunk * kHeads * kHead * 2;
  for (size_t p = 0; p < 2 * kLayers; ++p) {
    EXPECT_EQ(std::memcmp(got.data() + p * plane, want.data() + p * plane, stored), 0) << p;
  }
  EXPECT_TRUE(svc_->Store(wire::TransferRequest{Key(0, "s3", 44), 2, Blocks(), "", 0}).ok());
}

// Issue 26, item 2 (visibility): on a GPU the completion thread commits a STORE's objects
// only after the marker behind the client's event fired, so a RETRIEVE or LOOKUP sent right
// after the client saw its event complete met chunks not yet committed: false / a miss. Once
// a STORE's reply arrived and its event completed, its chunks must be found: a request that
// meets a commit still in flight waits for it (bounded).
class VisibilityTest : public StaleDeviceCopyTest {
 protected:
  uint64_t L1Objects() const override { return 8; }
};

TEST_F(VisibilityTest, Issue26VisibilityStoreThenRetrieveFindsTheChunks) {
  Segment gpu("/kvd_test_vis_gpu");
  gpu.Fill(5);
  ASSERT_TRUE(svc_->RegisterKvCache(gpu.Registration(1, wire::TensorMemory::kCuda)).ok());
  ThreadedGatedEngine* gated = engine_;
  ASSERT_NE(gated, nullptr);
  gated->HoldCompletions();
  gated->OpenGate();  // the client's event fires as soon as the copy is submitted

  // STORE: the reply and the event come back; the commit is still on its way.
  std::string event;
  ASSERT_TRUE(svc_->Store(wire::TransferRequest{Key(0, "s", 55), 1, Blocks(), "", 0}, &event).ok());
  gated->WaitCopied(1);
  std::thread completion([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    gated->ReleaseCompletions();
  });
  // RETRIEVE right after the event: it finds both chunks (before the fix: NotFound).
  Status st = svc_->Retrieve(wire::TransferRequest{Key(0, "r", 55), 1, Blocks(), "", 0}, &event);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(svc_->kvd_copy()->pending_commits()->waits(), 1u);  // it waited for the commit
  EXPECT_EQ(svc_->kvd_copy()->pending_commits()->timeouts(), 0u);
  completion.join();
  gated->WaitIdle();
  EXPECT_EQ(svc_->l1_stats().pinned_objects, 0u);
}

TEST_F(VisibilityTest, Issue26VisibilityStoreThenLookupHitsTheChunks) {
  Segment gpu("/kvd_test_vis_gpu_l");
  gpu.Fill(6);
  ASSERT_TRUE(svc_->RegisterKvCache(gpu.Registration(1, wire::TensorMemory::kCuda)).ok());
  ThreadedGatedEngine* gated = engine_;
  ASSERT_NE(gated, nullptr);
  gated->HoldCompletions();
  gated->OpenGate();
  std::string event;
  ASSERT_TRUE(svc_->Store(wire::TransferRequest{Key(0, "s", 66), 1, Blocks(), "", 0}, &event).ok());
  gated->WaitCopied(1);
  std::thread completion([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    gated->ReleaseCompletions();
  });
  // LOOKUP right after the event: both chunks hit (before the fix: 0).
  EXPECT_EQ(Hits("l", 66), 2);
  EXPECT_EQ(svc_->kvd_copy()->pending_commits()->waits(), 1u);
  completion.join();
  EXPECT_FALSE(svc_->CommitsPending());
  gated->WaitIdle();
}

}  // namespace
}  // namespace kvd::server
