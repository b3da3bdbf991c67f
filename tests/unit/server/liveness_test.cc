// Worker liveness as the lmcache 0.5.6 client expects it, on a FakeClock: a worker that
// pings and then goes silent for --worker-reap-timeout-seconds is reaped; one that
// registered but never pinged (the client starts its heartbeat at its first transfer)
// gets --worker-registration-grace-seconds; reaping releases the worker's mappings, its
// half-done engine-driven reservations and pins; the worker can register again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "server/kv_service.h"
#include "server/metrics.h"

namespace kvd::server {
namespace {

constexpr int64_t kChunk = 256, kBlock = 16, kBlocks = 32, kHeads = 2, kHead = 8;
constexpr int64_t kPlane = kBlocks * kBlock * kHeads * kHead;  // elements per K or V
constexpr uint64_t kBytes = 2 * kPlane * 2;                    // one bf16 layer [2, ...]

// A worker's KV cache: one layer [2, NB, BS, NH, HS] bf16 in its own shm segment.
class Worker {
 public:
  explicit Worker(std::string name) : name_(std::move(name)) {
    shm_unlink(name_.c_str());
    int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kBytes), 0);
    data_ = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    std::memset(data_, 7, kBytes);
  }
  ~Worker() {
    munmap(data_, kBytes);
    shm_unlink(name_.c_str());
  }
  wire::RegisterKvCacheRequest Registration(int64_t id) const {
    wire::RegisterKvCacheRequest r;
    r.instance_id = id;
    r.model_name = "m";
    r.world_size = 1;
    r.engine_type = "vllm";
    wire::TensorDescriptor t;
    t.dtype = "bfloat16";
    t.shape = {2, kBlocks, kBlock, kHeads, kHead};
    t.stride = {kPlane, kBlock * kHeads * kHead, kHeads * kHead, kHead, 1};
    t.shm_name = name_;
    t.nbytes = kBytes;
    t.device_uuid = "cpu";
    r.tensors.push_back(t);
    return r;
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  void* data_ = nullptr;
};

// How many mappings of /dev/shm/<name> this process has.
int MappingsOf(const std::string& shm_name) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  const std::string needle = "/dev/shm" + shm_name;  // shm_name starts with '/'
  for (std::string line; std::getline(maps, line);) {
    if (line.size() >= needle.size() &&
        line.compare(line.size() - needle.size(), needle.size(), needle) == 0) {
      ++n;
    }
  }
  return n;
}

wire::CacheKey Key(std::optional<int64_t> worker, const std::string& rid, int64_t seed = 1) {
  wire::CacheKey k;
  k.model_name = "m";
  k.world_size = 1;
  k.worker_id = worker;
  for (int64_t i = 0; i < 2 * kChunk; ++i) k.token_ids.push_back((i * 13 + seed) % 30000);
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

class LivenessTest : public ::testing::Test {
 protected:
  void Make(double reap = 120, double grace = 3600) {
    cfg_.l1_size_gb = 16.0 / 1024;
    cfg_.eviction_policy = "LRU";
    cfg_.shm_name = "kvd_liveness_test_" + std::to_string(getpid());
    cfg_.worker_reap_timeout_seconds = reap;
    cfg_.worker_registration_grace_seconds = grace;
    svc_.reset();
    svc_ = std::move(KvService::Create(cfg_, &clock_)).value();
  }
  void SetUp() override { Make(); }
  Status StoreFrom(int64_t id, const std::string& rid, int64_t seed = 1) {
    return svc_->Store(wire::TransferRequest{Key(0, rid, seed), id, Blocks(), "", 0});
  }
  void Tick(double seconds) {
    clock_.AdvanceSeconds(seconds);
    svc_->Maintain();
  }

  ServerConfig cfg_;
  FakeClock clock_;
  std::unique_ptr<KvService> svc_;
};

TEST_F(LivenessTest, PingingWorkerSilentPastTheTimeoutIsReapedAndUnmapped) {
  Worker w("/kvd_live_w1");
  ASSERT_EQ(MappingsOf(w.name()), 1);  // the test's own view
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(5)).ok());
  EXPECT_EQ(MappingsOf(w.name()), 2);  // + kvd's
  svc_->Ping(5);
  Tick(119);
  EXPECT_EQ(svc_->num_instances(), 1u);
  Tick(2);
  EXPECT_EQ(svc_->num_instances(), 0u);
  EXPECT_EQ(MappingsOf(w.name()), 1);  // kvd let go of the worker's segment
  EXPECT_EQ(StoreFrom(5, "r").code(), StatusCode::kNotFound);
}

TEST_F(LivenessTest, PingsAndTransfersKeepAWorkerAlive) {
  Worker w("/kvd_live_w2");
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(5)).ok());
  svc_->Ping(5);
  for (int i = 0; i < 10; ++i) {
    Tick(100);
    if (i % 2) {
      svc_->Ping(5);
    } else {
      ASSERT_TRUE(StoreFrom(5, "r" + std::to_string(i), i).ok());
    }
  }
  EXPECT_EQ(svc_->num_instances(), 1u);
  auto st = svc_->StatusSnapshot();
  ASSERT_EQ(st.instances.size(), 1u);
  EXPECT_TRUE(st.instances[0].pinged);
  EXPECT_EQ(st.instances[0].num_mappings, 1u);
  EXPECT_DOUBLE_EQ(st.instances[0].idle_seconds, 0.0);
}

TEST_F(LivenessTest, WorkerThatNeverPingedGetsTheRegistrationGrace) {
  // The 0.5.6 worker starts its heartbeat at its first store/retrieve: an idle vLLM
  // instance must not lose its registration after only the reap timeout.
  Worker w("/kvd_live_w3");
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(5)).ok());
  Tick(600);
  EXPECT_EQ(svc_->num_instances(), 1u);
  EXPECT_FALSE(svc_->StatusSnapshot().instances[0].pinged);
  Tick(3001);
  EXPECT_EQ(svc_->num_instances(), 0u);
}

TEST_F(LivenessTest, ZeroTimeoutNeverReaps) {
  Make(/*reap=*/0, /*grace=*/0);
  Worker w("/kvd_live_w4");
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(5)).ok());
  svc_->Ping(5);
  Tick(1e6);
  EXPECT_EQ(svc_->num_instances(), 1u);
}

TEST_F(LivenessTest, AReapedWorkerCanRegisterAgainAndItsDataIsStillThere) {
  Worker w("/kvd_live_w5");
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(5)).ok());
  ASSERT_TRUE(StoreFrom(5, "r").ok());
  svc_->Ping(5);
  Tick(121);
  ASSERT_EQ(svc_->num_instances(), 0u);
  // The heartbeat recovers: the client re-registers, then works as before.
  ASSERT_TRUE(svc_->RegisterKvCache(w.Registration(5)).ok());
  EXPECT_FALSE(svc_->StatusSnapshot().instances[0].pinged);  // a fresh registration
  wire::LookupRequest lr{Key(std::nullopt, "l"), 1};
  ASSERT_TRUE(svc_->Lookup(lr).ok());
  EXPECT_EQ(svc_->QueryPrefetchStatus("l").value_or(-1), 2);
  EXPECT_TRUE(svc_->Retrieve(wire::TransferRequest{Key(0, "l"), 5, Blocks(), "", 0}).ok());
}

TEST_F(LivenessTest, ReapingReleasesEngineDrivenReservationsAndPins) {
  wire::RegisterEngineDrivenRequest reg;
  reg.instance_id = 9;
  reg.model_name = "m";
  reg.world_size = 1;
  reg.block_size = 16;
  reg.num_layers = 1;
  reg.hidden_dim_size = 16;
  reg.dtype_str = "bfloat16";
  ASSERT_TRUE(svc_->RegisterEngineDriven(reg).ok());
  svc_->Ping(9);
  // A committed pair of chunks, then a retrieve prepared (pins) and a store of other
  // chunks prepared (staging reservations); the worker dies before committing either.
  wire::EngineDrivenRequest done{Key(0, "a", 1), 9, ""};
  ASSERT_TRUE(svc_->PrepareStore(done).ok());
  ASSERT_TRUE(svc_->CommitStore(done).ok());
  wire::LookupRequest lr{Key(std::nullopt, "b", 1), 1};
  ASSERT_TRUE(svc_->Lookup(lr).ok());
  ASSERT_TRUE(svc_->PrepareRetrieve(wire::EngineDrivenRequest{Key(0, "b", 1), 9, ""}).ok());
  ASSERT_TRUE(svc_->PrepareStore(wire::EngineDrivenRequest{Key(0, "c", 2), 9, ""}).ok());
  auto l1 = svc_->l1_stats();
  EXPECT_EQ(l1.pinned_objects, 2u);
  EXPECT_EQ(l1.staging_objects, 2u);
  auto st = svc_->StatusSnapshot();
  EXPECT_EQ(st.pending_engine_stores, 1u);
  EXPECT_EQ(st.pending_engine_retrieves, 1u);

  Tick(121);
  ASSERT_EQ(svc_->num_instances(), 0u);
  l1 = svc_->l1_stats();
  EXPECT_EQ(l1.pinned_objects, 0u);
  EXPECT_EQ(l1.staging_objects, 0u);
  EXPECT_EQ(l1.entries, 2u);  // the committed chunks stay cached for the next worker
  st = svc_->StatusSnapshot();
  EXPECT_EQ(st.pending_engine_stores, 0u);
  EXPECT_EQ(st.pending_engine_retrieves, 0u);
  // The lookup's read locks went with the prepared retrieve that would have released them
  // at its commit (dropped after --engine-driven-hold-timeout-seconds, before the reap):
  // nothing of the dead worker holds memory (issue 27, finding 2).
  EXPECT_EQ(svc_->l1_stats().locked_entries, 0u);
}

TEST(RequestMetrics, CountsRequestsInFlightAndLatencyBuckets) {
  RequestMetrics m;
  EXPECT_TRUE(m.Snapshot().empty());
  int64_t t = m.Begin(wire::Op::kStore);
  auto s = m.Snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].name, "store");
  EXPECT_EQ(s[0].in_flight, 1u);
  EXPECT_EQ(s[0].requests, 0u);
  m.End(wire::Op::kStore, t);
  m.Record(wire::Op::kStore, 0.003);  // lands in the (0.0025, 0.005] bucket
  m.Record(wire::Op::kLookup, 100.0); // beyond the last bound: +Inf
  m.CountUnknownOp();
  s = m.Snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "store");  // op-table order
  EXPECT_EQ(s[0].requests, 2u);
  EXPECT_EQ(s[0].in_flight, 0u);
  ASSERT_EQ(s[0].buckets.size(), RequestMetrics::kLatencyBounds.size() + 1);
  size_t b = 0;
  while (RequestMetrics::kLatencyBounds[b] < 0.003) ++b;
  EXPECT_EQ(s[0].buckets[b], 1u);
  EXPECT_NEAR(s[0].latency_sum_seconds, 0.003, 0.001);
  EXPECT_EQ(s[1].name, "lookup");
  EXPECT_EQ(s[1].buckets.back(), 1u);
  EXPECT_EQ(m.unknown_ops(), 1u);
}

}  // namespace
}  // namespace kvd::server
