// TierSet over a real L1 cache and in-memory tiers (with the fault decorator): store-behind
// never blocks and stays within its budget, prefetch loads byte-exact prefixes and shrinks on
// failure, the prefetch policies, skip_l1, and eviction that covers objects of earlier runs.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "l1/l1_cache.h"
#include "l2/fault_tier.h"
#include "l2/fs_tier.h"
#include "l2/memory_tier.h"
#include "l2/tier_metrics.h"
#include "l2/tier_set.h"
#include "tier_test_util.h"

namespace kvd::l2 {
namespace {

using namespace testing;

constexpr uint64_t kObj = 64 * 1024;
constexpr uint32_t kRanks = 2;

class TierSetTest : public ::testing::Test {
 protected:
  void EvictsObjectsOfEarlierRunsFirst(const std::string& policy);
  void SetUp() override {
    l1::L1CacheOptions o;
    o.capacity_bytes = 64ull << 20;
    o.clock = &clock_;
    l1_ = std::move(l1::L1Cache::Create(o)).value();
    ns_ = std::move(l1_->namespaces().Intern("m/x", kRanks, "")).value();
  }
  void TearDown() override {
    if (set_) set_->Close();
    set_.reset();
    l1_.reset();
  }

  // Builds the set over the given tiers (specs get plain configs).
  void Make(std::vector<std::shared_ptr<Tier>> tiers, TierSetOptions o = {},
            std::vector<AdapterConfig> configs = {},
            std::shared_ptr<const Serde> serde = nullptr) {
    o.clock = &clock_;
    std::vector<TierSpec> specs;
    for (size_t i = 0; i < tiers.size(); ++i) {
      TierSpec s;
      if (i < configs.size()) s.config = configs[i];
      s.config.index = static_cast<int>(i);
      if (s.config.type.empty()) s.config.type = "memory";
      s.tier = tiers[i];
      s.serde = serde ? serde : std::move(MakeSerde(nullptr)).value();
      specs.push_back(std::move(s));
    }
    auto r = TierSet::Create(o, std::move(specs), l1_.get());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    set_ = std::move(r).value();
  }

  l1::ChunkKey Chunk(int c) {
    l1::ChunkKey k;
    k.ns = ns_;  // one namespace for the model of these tests
    k.chunk_hash = Key(c).chunk_hash;
    return k;
  }
  ObjectKey Obj(int c, uint32_t r) {
    ObjectKey k = Key(c, "m/x", 0);
    k.kv_rank = KvRank(kRanks, r);
    return k;
  }
  static std::vector<uint8_t> Value(int c, uint32_t r) { return Bytes(kObj, c * 10 + r); }

  // Writes chunk c (all ranks) into L1; returns the committed objects.
  std::vector<CommittedObject> WriteL1(int c) {
    std::vector<CommittedObject> out;
    for (uint32_t r = 0; r < kRanks; ++r) {
      auto res = l1_->ReserveWrite(Chunk(c), kRanks, r, kObj);
      EXPECT_TRUE(res.ok());
      auto v = Value(c, r);
      std::memcpy(res->data(), v.data(), v.size());
      EXPECT_TRUE(res->Commit());
      out.push_back({Chunk(c), kRanks, r, Obj(c, r)});
    }
    return out;
  }
  ObjectFormat Format() { return {kObj, "", {}}; }

  PrefetchRequest Request(int first, int count) {
    PrefetchRequest p;
    for (int c = first; c < first + count; ++c) {
      p.chunks.push_back(Chunk(c));
      p.hashes.push_back(Key(c).chunk_hash);
    }
    p.model_name = "m/x";
    p.world_size = kRanks;
    p.format = Format();
    return p;
  }

  size_t PrefetchSync(PrefetchRequest p) {
    auto pr = std::make_shared<std::promise<size_t>>();
    auto f = pr->get_future();
    set_->Prefetch(std::move(p), [pr](size_t n) { pr->set_value(n); });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    return f.get();
  }

  bool L1Holds(int c) {
    for (uint32_t r = 0; r < kRanks; ++r) {
      auto pin = l1_->PinForRead(Chunk(c), r);
      if (!pin.ok()) return false;
      auto v = Value(c, r);
      if (pin->size() != v.size() || std::memcmp(pin->data(), v.data(), v.size()) != 0) return false;
    }
    return true;
  }

  FakeClock clock_;
  std::unique_ptr<l1::L1Cache> l1_;
  l1::NamespaceId ns_ = 0;
  std::unique_ptr<TierSet> set_;
};

// A serde that refuses to encode the objects listed as poison (compared by content), and
// copies every other object unchanged.
class PoisonSerde : public Serde {
 public:
  explicit PoisonSerde(std::vector<std::vector<uint8_t>> poison) : poison_(std::move(poison)) {}
  std::string_view name() const override { return "poison"; }
  uint64_t MaxStoredBytes(const ObjectLayout&) const override { return kObj; }
  Result<uint64_t> Encode(std::span<const uint8_t> raw, const ObjectLayout&,
                          std::span<uint8_t> out) const override {
    for (const auto& p : poison_) {
      if (p.size() == raw.size() && std::memcmp(p.data(), raw.data(), raw.size()) == 0) {
        return Status::InvalidArgument("poisoned object");
      }
    }
    std::memcpy(out.data(), raw.data(), raw.size());
    return raw.size();
  }
  Status Decode(std::span<const uint8_t> stored, const ObjectLayout&,
                std::span<uint8_t> raw) const override {
    std::memcpy(raw.data(), stored.data(), stored.size());
    return Status::Ok();
  }

 private:
  std::vector<std::vector<uint8_t>> poison_;
};

// Regression: an object whose encode failed was written to the tier as an empty object (and
// counted as stored). It must not be written at all, and the in-flight budget must balance.
TEST_F(TierSetTest, ObjectsThatFailToEncodeAreNotWrittenAndCountAsFailed) {
  auto a = std::make_shared<MemoryTier>();
  Make({a}, {}, {},
       std::make_shared<PoisonSerde>(std::vector<std::vector<uint8_t>>{
           Value(0, 1), Value(1, 0), Value(1, 1)}));
  set_->StoreBehind(WriteL1(0), Format());  // rank 1 fails
  set_->StoreBehind(WriteL1(1), Format());  // both ranks fail: nothing reaches the tier
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(a->size(), 1u);
  std::vector<uint8_t> out;
  ASSERT_TRUE(LoadOne(*a, Obj(0, 0), &out, kObj).status.ok());
  EXPECT_EQ(out, Value(0, 0));
  EXPECT_FALSE(LoadOne(*a, Obj(0, 1), &out, kObj).status.ok());
  auto s = set_->stats();
  EXPECT_EQ(s.tiers[0].stored_objects, 1u);
  EXPECT_EQ(s.tiers[0].store_failed_objects, 3u);
  EXPECT_EQ(s.tiers[0].inflight_store_objects, 0u);
  EXPECT_EQ(s.tiers[0].inflight_store_bytes, 0u);
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);
}

TEST_F(TierSetTest, StoreBehindWritesEveryTierAndReleasesPins) {
  auto a = std::make_shared<MemoryTier>(), b = std::make_shared<MemoryTier>();
  Make({a, b});
  for (int c = 0; c < 4; ++c) set_->StoreBehind(WriteL1(c), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(a->size(), 8u);
  EXPECT_EQ(b->size(), 8u);
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);
  std::vector<uint8_t> out;
  ASSERT_TRUE(LoadOne(*b, Obj(3, 1), &out, kObj).status.ok());
  EXPECT_EQ(out, Value(3, 1));
  auto s = set_->stats();
  EXPECT_EQ(s.tiers[0].stored_objects, 8u);
  EXPECT_EQ(s.tiers[1].stored_bytes, 8 * kObj);
}

// A tier that only loads (as P2P's peer tier): a MemoryTier behind it, stores() false.
class LoadOnlyTier final : public Tier {
 public:
  explicit LoadOnlyTier(std::shared_ptr<MemoryTier> inner) : inner_(std::move(inner)) {}
  std::string_view type() const override { return "load-only"; }
  std::string Describe() const override { return "load-only"; }
  bool stores() const override { return false; }
  void Store(std::vector<StoreItem> items, Done done) override {
    ++store_calls;
    inner_->Store(std::move(items), std::move(done));
  }
  void Exists(std::vector<ObjectKey> keys, Done done) override { inner_->Exists(std::move(keys), std::move(done)); }
  void Load(std::vector<LoadItem> items, Done done) override { inner_->Load(std::move(items), std::move(done)); }
  void Delete(std::vector<ObjectKey> keys, Done done) override { inner_->Delete(std::move(keys), std::move(done)); }
  void Scan(ScanDone done) override { inner_->Scan(std::move(done)); }
  TierHealth Health() const override { return {}; }
  void Close() override { inner_->Close(); }
  std::atomic<int> store_calls{0};

 private:
  std::shared_ptr<MemoryTier> inner_;
};

TEST_F(TierSetTest, StoreBehindPassesByATierThatOnlyLoadsWhichStillServesPrefetches) {
  auto inner = std::make_shared<MemoryTier>();
  auto load_only = std::make_shared<LoadOnlyTier>(inner);
  auto b = std::make_shared<MemoryTier>();
  Make({load_only, b});
  for (int c = 0; c < 3; ++c) set_->StoreBehind(WriteL1(c), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(load_only->store_calls.load(), 0);
  EXPECT_EQ(inner->size(), 0u);
  EXPECT_EQ(b->size(), 6u);
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);  // the pins went when b answered
  EXPECT_EQ(set_->stats().tiers[0].store_objects, 0u);
  // It still loads what it holds.
  for (uint32_t r = 0; r < kRanks; ++r) inner->Put(Obj(7, r), Value(7, r));
  EXPECT_EQ(PrefetchSync(Request(7, 1)), 1u);
  EXPECT_TRUE(L1Holds(7));
  EXPECT_EQ(set_->stats().tiers[0].loaded_objects, 2u);
}

TEST_F(TierSetTest, StoreBehindWithOnlyTiersThatOnlyLoadPinsNothing) {
  auto load_only = std::make_shared<LoadOnlyTier>(std::make_shared<MemoryTier>());
  Make({load_only});
  set_->StoreBehind(WriteL1(0), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(load_only->store_calls.load(), 0);
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);
}

TEST_F(TierSetTest, StalledTierNeverBlocksAndIsBoundedThenSkips) {
  auto fast = std::make_shared<MemoryTier>();
  auto slow = std::make_shared<FaultTier>(std::make_shared<MemoryTier>());
  slow->Stall();
  TierSetOptions o;
  o.store_max_inflight_bytes = 6 * kObj;  // three chunks of two ranks
  Make({slow, fast}, o);
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < 10; ++c) {
    set_->StoreBehind(WriteL1(c), Format());
    // The fast tier keeps up whatever the stalled one does.
    for (int i = 0; i < 2000 && fast->size() < 2u * (c + 1); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(fast->size(), 20u);
  // The stalled one holds at most its budget in flight and skipped the rest.
  auto s = set_->stats();
  EXPECT_LE(s.tiers[0].inflight_store_bytes, 6 * kObj);
  EXPECT_EQ(s.tiers[0].store_skipped_objects, 14u);
  EXPECT_LE(l1_->stats().pinned_objects, 6u);
  // L1 keeps working meanwhile: lookups, new writes, pins.
  auto more = WriteL1(50);
  EXPECT_TRUE(L1Holds(50));
  slow->Resume();
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(set_->stats().tiers[0].stored_objects, 6u);
  EXPECT_EQ(l1_->stats().pinned_objects, 0u);
}

TEST_F(TierSetTest, PrefetchLoadsFromTheFirstTierHoldingEachObject) {
  auto a = std::make_shared<MemoryTier>(), b = std::make_shared<MemoryTier>();
  Make({a, b});
  // Chunks 0-3 in b only, chunk 1 rank 0 also in a (with the same bytes).
  for (int c = 0; c < 4; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) b->Put(Obj(c, r), Value(c, r));
  }
  a->Put(Obj(1, 0), Value(1, 0));
  EXPECT_EQ(PrefetchSync(Request(0, 6)), 4u);  // chunks 4, 5 are nowhere
  for (int c = 0; c < 4; ++c) EXPECT_TRUE(L1Holds(c)) << c;
  auto s = set_->stats();
  EXPECT_EQ(s.tiers[0].loaded_objects, 1u);
  EXPECT_EQ(s.tiers[1].loaded_objects, 7u);
  EXPECT_EQ(s.prefetch_hit_chunks, 4u);
}

TEST_F(TierSetTest, FailedLoadShrinksThePrefix) {
  auto a = std::make_shared<MemoryTier>();
  Make({a});
  for (int c = 0; c < 5; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) a->Put(Obj(c, r), Value(c, r));
  }
  a->Put(Obj(2, 1), std::vector<uint8_t>(100, 1));  // truncated
  EXPECT_EQ(PrefetchSync(Request(0, 5)), 2u);
  EXPECT_TRUE(L1Holds(0));
  EXPECT_TRUE(L1Holds(1));
  EXPECT_FALSE(l1_->IsResident(Chunk(2), 0));
  EXPECT_FALSE(l1_->IsResident(Chunk(2), 1));
  EXPECT_FALSE(l1_->IsResident(Chunk(3), 0));
  EXPECT_EQ(set_->stats().tiers[0].load_corrupt_objects, 1u);
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
}

TEST_F(TierSetTest, UnreachableTierIsAMissNotAnError) {
  auto f = std::make_shared<FaultTier>(std::make_shared<MemoryTier>());
  f->FailOps(kAllTierOps, StatusCode::kUnavailable);
  Make({f});
  EXPECT_EQ(PrefetchSync(Request(0, 3)), 0u);
  set_->StoreBehind(WriteL1(0), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  auto s = set_->stats();
  EXPECT_EQ(s.tiers[0].store_failed_objects, 2u);
  EXPECT_EQ(s.tiers[0].lookup_errors, 6u);
  EXPECT_TRUE(L1Holds(0));
}

// Issue 24: a blend fingerprint leaves the matcher only when its chunk is known to be in no
// tier. PrefetchWithAnswer says so only when every tier answered "not found" for an object
// of the chunk the prefix stopped at, never when a tier failed.
TEST_F(TierSetTest, Issue24PrefetchAnswerSaysInNoTierOnlyWhenEveryTierAnsweredNotFound) {
  auto a = std::make_shared<MemoryTier>();
  auto inner = std::make_shared<MemoryTier>();
  auto b = std::make_shared<FaultTier>(inner);
  for (uint32_t r = 0; r < kRanks; ++r) a->Put(Obj(0, r), Value(0, r));  // chunk 0: tier a
  inner->Put(Obj(2, 0), Value(2, 0));  // chunk 2: rank 0 only, in tier b
  TierSetOptions o;
  o.prefetch_policy = "retain";
  Make({a, b}, o);
  auto ask = [&](int first, int count) {
    auto pr = std::make_shared<std::promise<PrefetchAnswer>>();
    auto f = pr->get_future();
    set_->PrefetchWithAnswer(Request(first, count), [pr](PrefetchAnswer x) { pr->set_value(x); });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    return f.get();
  };
  // Chunk 0 loads; chunk 1 is in neither tier.
  PrefetchAnswer x = ask(0, 2);
  EXPECT_EQ(x.chunks, 1u);
  EXPECT_TRUE(x.next_in_no_tier);
  // Chunk 2's rank 1 is in no tier either (rank 0 is in b): the chunk is in no tier whole.
  x = ask(2, 1);
  EXPECT_EQ(x.chunks, 0u);
  EXPECT_TRUE(x.next_in_no_tier);
  // The whole request arrived: nothing after it to speak of.
  x = ask(0, 1);
  EXPECT_EQ(x.chunks, 1u);
  EXPECT_FALSE(x.next_in_no_tier);
  // Tier b fails its existence checks: "not found" from a alone proves nothing.
  b->FailOps(static_cast<uint8_t>(TierOp::kExists), StatusCode::kUnavailable);
  x = ask(1, 1);
  EXPECT_EQ(x.chunks, 0u);
  EXPECT_FALSE(x.next_in_no_tier);
  b->FailOps(0);
  // A prefetch that found the chunk in a tier but could not load it is not "in no tier".
  inner->Put(Obj(3, 0), Value(3, 0));
  inner->Put(Obj(3, 1), Value(3, 1));
  b->FailOps(static_cast<uint8_t>(TierOp::kLoad), StatusCode::kUnavailable);
  x = ask(3, 1);
  EXPECT_EQ(x.chunks, 0u);
  EXPECT_FALSE(x.next_in_no_tier);
  // The size_t form answers the same count.
  EXPECT_EQ(PrefetchSync(Request(0, 2)), 1u);
}

// The tiers' families (issue 29, item 1): lmcache's sums over the tiers, kvd's per-tier
// series, the info gauges /status reads its strings from, and counters rebased by a reset.
TEST_F(TierSetTest, RegisteredFamiliesReportEveryTierAndRebaseOnReset) {
  auto a = std::make_shared<MemoryTier>(), b = std::make_shared<MemoryTier>();
  Make({a, b});
  metrics::Registry registry;
  auto handles = RegisterTierMetrics(*set_, registry);
  for (int c = 0; c < 3; ++c) set_->StoreBehind(WriteL1(c), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  auto f = registry.Collect();
  auto series = [&](const std::string& name, const std::vector<std::string>& labels) {
    const metrics::Series* s = metrics::FindSeries(f, name, labels);
    EXPECT_NE(s, nullptr) << name << ": no series with those labels";
    return s == nullptr ? -1.0 : s->value;
  };
  // 3 chunks x 2 ranks, written to each of the two tiers.
  EXPECT_EQ(series("lmcache_mp_l2_store_submitted_objects_chunks_total", {}), 12);
  EXPECT_EQ(series("lmcache_mp_l2_store_completed_objects_chunks_total", {}), 12);
  EXPECT_EQ(series("kvd_l2_stored_objects_total", {"memory#0"}), 6);
  EXPECT_EQ(series("kvd_l2_stored_objects_total", {"memory#1"}), 6);
  EXPECT_EQ(series("kvd_l2_stored_bytes_total", {"memory#1"}), 6.0 * kObj);
  EXPECT_EQ(series("kvd_l2_healthy", {"memory#0"}), 1);
  EXPECT_EQ(series("lmcache_mp_l2_store_failed_chunks_total", {"memory#0", "error"}), 0);
  const metrics::FamilySnapshot* info = metrics::FindFamily(f, "kvd_l2_tier_info");
  ASSERT_NE(info, nullptr);
  ASSERT_EQ(info->series.size(), 2u);
  EXPECT_EQ(info->series[0].label_values[0], "memory#0");
  EXPECT_EQ(info->series[0].label_values[1], "memory");
  EXPECT_EQ(series("kvd_l2_policy_info", {"default", "default"}), 1);
  // A reset rebases the counters; gauges (capacity, health) stay.
  registry.ResetCounters();
  f = registry.Collect();
  EXPECT_EQ(series("kvd_l2_stored_objects_total", {"memory#0"}), 0);
  EXPECT_EQ(series("kvd_l2_healthy", {"memory#0"}), 1);
  set_->StoreBehind(WriteL1(3), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  f = registry.Collect();
  EXPECT_EQ(series("kvd_l2_stored_objects_total", {"memory#0"}), 2);
}

// A tier that counts how often its health is asked for (TierSet::stats() asks once per tier).
class HealthCountingTier final : public Tier {
 public:
  explicit HealthCountingTier(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {}
  std::string_view type() const override { return inner_->type(); }
  std::string Describe() const override { return inner_->Describe(); }
  void Store(std::vector<StoreItem> items, Done done) override { inner_->Store(std::move(items), std::move(done)); }
  void Exists(std::vector<ObjectKey> keys, Done done) override { inner_->Exists(std::move(keys), std::move(done)); }
  void Load(std::vector<LoadItem> items, Done done) override { inner_->Load(std::move(items), std::move(done)); }
  void Delete(std::vector<ObjectKey> keys, Done done) override { inner_->Delete(std::move(keys), std::move(done)); }
  void Scan(ScanDone done) override { inner_->Scan(std::move(done)); }
  TierHealth Health() const override {
    health_calls.fetch_add(1);
    return inner_->Health();
  }
  void Close() override { inner_->Close(); }
  mutable std::atomic<int> health_calls{0};

 private:
  std::shared_ptr<Tier> inner_;
};

// The tiers' ~50 families read the TierSet's stats (its locks, each tier's health) once per
// collection, not once per family.
TEST_F(TierSetTest, RegisteredFamiliesReadTheStatsOncePerCollection) {
  auto counting = std::make_shared<HealthCountingTier>(std::make_shared<MemoryTier>());
  Make({counting});
  metrics::Registry registry;
  auto handles = RegisterTierMetrics(*set_, registry);
  const int before = counting->health_calls.load();
  auto f = registry.Collect();
  EXPECT_GT(f.size(), 40u);
  EXPECT_EQ(counting->health_calls.load() - before, 1);
  registry.Collect();
  EXPECT_EQ(counting->health_calls.load() - before, 2);
}

TEST_F(TierSetTest, StalledPrefetchTimesOutAndAnswersFromL1) {
  auto inner = std::make_shared<MemoryTier>();
  auto f = std::make_shared<FaultTier>(inner);
  for (uint32_t r = 0; r < kRanks; ++r) inner->Put(Obj(0, r), Value(0, r));
  TierSetOptions o;
  o.prefetch_timeout_s = 0.2;
  o.prefetch_policy = "retain";  // keep the late chunk (default would let it go at once)
  Make({f}, o);
  f->Stall();
  auto pr = std::make_shared<std::promise<size_t>>();
  auto fut = pr->get_future();
  set_->Prefetch(Request(0, 1), [pr](size_t n) { pr->set_value(n); });
  // The control loop uses the injected clock: move it past the deadline.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  clock_.AdvanceSeconds(1);
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(fut.get(), 0u);
  EXPECT_EQ(set_->stats().prefetch_timeouts, 1u);
  // When the tier answers at last, a prefetch nobody waits for loads nothing and ends.
  f->Resume();
  for (int i = 0; i < 2000 && set_->stats().active_prefetch_jobs > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(set_->stats().active_prefetch_jobs, 0u);
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
  EXPECT_EQ(PrefetchSync(Request(0, 1)), 1u);  // and the next lookup gets it
  EXPECT_TRUE(L1Holds(0));
}

TEST_F(TierSetTest, PrefetchMaxInFlightQueuesTheRest) {
  auto inner = std::make_shared<MemoryTier>();
  auto f = std::make_shared<FaultTier>(inner);
  for (int c = 0; c < 3; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) inner->Put(Obj(c, r), Value(c, r));
  }
  TierSetOptions o;
  o.prefetch_max_in_flight = 1;
  Make({f}, o);
  f->Stall();
  std::vector<std::shared_ptr<std::promise<size_t>>> ps;
  std::vector<std::future<size_t>> fs;
  for (int c = 0; c < 3; ++c) {
    ps.push_back(std::make_shared<std::promise<size_t>>());
    fs.push_back(ps.back()->get_future());
    auto p = ps.back();
    set_->Prefetch(Request(c, 1), [p](size_t n) { p->set_value(n); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto s = set_->stats();
  EXPECT_EQ(s.active_prefetch_jobs, 1u);
  EXPECT_EQ(s.queued_prefetch_jobs, 2u);
  EXPECT_EQ(f->calls(TierOp::kExists), 1u);
  f->Resume();
  for (auto& x : fs) {
    ASSERT_EQ(x.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_EQ(x.get(), 1u);
  }
}

TEST_F(TierSetTest, DefaultPolicyDropsPrefetchedChunksAfterTheRetrieveRetainKeeps) {
  for (const std::string policy : {"default", "retain"}) {
    SetUp();
    auto a = std::make_shared<MemoryTier>();
    TierSetOptions o;
    o.prefetch_policy = policy;
    Make({a}, o);
    for (uint32_t r = 0; r < kRanks; ++r) a->Put(Obj(0, r), Value(0, r));
    ASSERT_EQ(PrefetchSync(Request(0, 1)), 1u);
    std::vector<l1::ChunkKey> keys = {Chunk(0)};
    // A lookup's read lock holds it through the retrieve...
    ASSERT_EQ(l1_->LookupAndLock("req", 0, keys, kRanks, 1), 1u);
    set_->AfterRetrieve(keys);
    EXPECT_TRUE(L1Holds(0));
    // ...after which the default policy lets it go.
    l1_->ReleaseAllLocks("req");
    set_->AfterRetrieve(keys);
    EXPECT_EQ(l1_->IsResident(Chunk(0), 0), policy == "retain") << policy;
    set_->Close();
    set_.reset();
  }
}

// Regression: the once-a-second sweep of prefetched chunks (default policy) could remove a
// chunk between its commit and the lookup's read lock, losing the hit it was loaded for.
TEST_F(TierSetTest, PrefetchedChunkIsNotSweptBeforeItsLookupLocksIt) {
  auto a = std::make_shared<MemoryTier>();
  Make({a});
  for (uint32_t r = 0; r < kRanks; ++r) a->Put(Obj(0, r), Value(0, r));
  ASSERT_EQ(PrefetchSync(Request(0, 1)), 1u);
  clock_.AdvanceSeconds(1);  // a sweep runs now: the chunk is a second old
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(L1Holds(0));
  // One no retrieve came for goes at a later sweep.
  clock_.AdvanceSeconds(2);
  for (int i = 0; i < 2000 && l1_->IsResident(Chunk(0), 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(l1_->IsResident(Chunk(0), 0));
  EXPECT_EQ(set_->stats().temporary_chunks, 0u);
}

TEST_F(TierSetTest, SkipL1RemovesTheL1CopyOnceATierHasIt) {
  auto a = std::make_shared<MemoryTier>();
  TierSetOptions o;
  o.store_policy = "skip_l1";
  Make({a}, o);
  set_->StoreBehind(WriteL1(0), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(a->size(), 2u);
  EXPECT_FALSE(l1_->IsResident(Chunk(0), 0));
  EXPECT_EQ(set_->stats().skip_l1_removed_chunks, 1u);
  EXPECT_EQ(PrefetchSync(Request(0, 1)), 1u);  // and it comes back from the tier
  EXPECT_TRUE(L1Holds(0));
}

// Regression (skip_l1 data loss): the whole chunk's L1 entry was removed as soon as one rank's
// object of it was in a tier, losing the other ranks' only copies. Each rank stores its own
// object (one StoreBehind per worker); the chunk leaves L1 only once every rank's is stored.
TEST_F(TierSetTest, SkipL1KeepsTheChunkUntilEveryRankIsInATier) {
  auto a = std::make_shared<MemoryTier>();
  TierSetOptions o;
  o.store_policy = "skip_l1";
  Make({a}, o);
  auto objs = WriteL1(0);
  set_->StoreBehind({objs[0]}, Format());  // rank 0's worker
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(a->size(), 1u);
  EXPECT_TRUE(L1Holds(0));  // rank 1's object is only in L1
  EXPECT_EQ(set_->stats().skip_l1_removed_chunks, 0u);
  EXPECT_EQ(set_->stats().skip_l1_waiting_chunks, 1u);
  set_->StoreBehind({objs[1]}, Format());  // rank 1's worker
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(a->size(), 2u);
  EXPECT_FALSE(l1_->IsResident(Chunk(0), 0));
  EXPECT_FALSE(l1_->IsResident(Chunk(0), 1));
  EXPECT_EQ(set_->stats().skip_l1_removed_chunks, 1u);
  EXPECT_EQ(set_->stats().skip_l1_waiting_chunks, 0u);
  EXPECT_EQ(PrefetchSync(Request(0, 1)), 1u);  // every rank comes back from the tier
  EXPECT_TRUE(L1Holds(0));
}

// Regression (skip_l1 data loss): a rank whose tier write was skipped (over the in-flight
// budget) or failed keeps the chunk in L1; the others' tier copies do not count for it.
TEST_F(TierSetTest, SkipL1KeepsTheChunkWhenOneRankWasNotStored) {
  auto a = std::make_shared<MemoryTier>();
  TierSetOptions o;
  o.store_policy = "skip_l1";
  o.store_max_inflight_bytes = kObj;  // one object per batch: rank 1 is skipped
  Make({a}, o);
  set_->StoreBehind(WriteL1(0), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(a->size(), 1u);
  EXPECT_EQ(set_->stats().tiers[0].store_skipped_objects, 1u);
  EXPECT_TRUE(L1Holds(0));
  EXPECT_EQ(set_->stats().skip_l1_removed_chunks, 0u);
  EXPECT_EQ(set_->stats().skip_l1_waiting_chunks, 1u);
  // A chunk L1 lets go (evicted, cleared) is no longer waited for.
  l1_->Clear();
  clock_.AdvanceSeconds(2);
  for (int i = 0; i < 2000 && set_->stats().skip_l1_waiting_chunks > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(set_->stats().skip_l1_waiting_chunks, 0u);
}

// A chunk whose every rank is in a tier but that a lookup holds stays until its readers are
// done, then the control loop removes it.
TEST_F(TierSetTest, SkipL1RemovesABusyChunkOnceItsReadersAreDone) {
  auto a = std::make_shared<MemoryTier>();
  TierSetOptions o;
  o.store_policy = "skip_l1";
  Make({a}, o);
  auto objs = WriteL1(0);
  std::vector<l1::ChunkKey> keys = {Chunk(0)};
  ASSERT_EQ(l1_->LookupAndLock("req", 0, keys, kRanks, 1), 1u);
  set_->StoreBehind(objs, Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_TRUE(L1Holds(0));
  EXPECT_EQ(set_->stats().skip_l1_waiting_chunks, 1u);
  l1_->ReleaseAllLocks("req");
  clock_.AdvanceSeconds(2);
  for (int i = 0; i < 2000 && l1_->IsResident(Chunk(0), 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(l1_->IsResident(Chunk(0), 0));
  EXPECT_EQ(set_->stats().skip_l1_removed_chunks, 1u);
  EXPECT_EQ(set_->stats().skip_l1_waiting_chunks, 0u);
}

TEST_F(TierSetTest, SkipL1KeepsTheChunkWhenOneRankFailedToEncode) {
  auto a = std::make_shared<MemoryTier>();
  TierSetOptions o;
  o.store_policy = "skip_l1";
  Make({a}, o, {}, std::make_shared<PoisonSerde>(std::vector<std::vector<uint8_t>>{Value(0, 1)}));
  set_->StoreBehind(WriteL1(0), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(a->size(), 1u);
  EXPECT_TRUE(L1Holds(0));
  EXPECT_EQ(set_->stats().skip_l1_removed_chunks, 0u);
}

// Regression (timed-out queued prefetches stayed queued): a prefetch answered by its
// timeout while waiting for a turn stayed in the queue (counted, holding its request) until
// a running prefetch finished, which with a hung tier is never.
TEST_F(TierSetTest, TimedOutQueuedPrefetchesLeaveTheQueue) {
  auto inner = std::make_shared<MemoryTier>();
  auto f = std::make_shared<FaultTier>(inner);
  for (int c = 0; c < 3; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) inner->Put(Obj(c, r), Value(c, r));
  }
  TierSetOptions o;
  o.prefetch_max_in_flight = 1;
  o.prefetch_timeout_s = 0.2;
  Make({f}, o);
  f->Stall();
  std::vector<std::future<size_t>> fs;
  for (int c = 0; c < 3; ++c) {
    auto p = std::make_shared<std::promise<size_t>>();
    fs.push_back(p->get_future());
    set_->Prefetch(Request(c, 1), [p](size_t n) { p->set_value(n); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(set_->stats().queued_prefetch_jobs, 2u);
  clock_.AdvanceSeconds(1);
  for (auto& x : fs) {
    ASSERT_EQ(x.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_EQ(x.get(), 0u);
  }
  for (int i = 0; i < 2000 && set_->stats().queued_prefetch_jobs > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(set_->stats().queued_prefetch_jobs, 0u);  // the tier is still hung
  EXPECT_EQ(set_->stats().active_prefetch_jobs, 1u);
  f->Resume();
}

// A tier that holds Delete and Load calls until the test releases them; the rest goes
// straight to the inner tier.
class GateTier final : public Tier {
 public:
  explicit GateTier(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {}
  std::string_view type() const override { return inner_->type(); }
  std::string Describe() const override { return "gate"; }
  void Store(std::vector<StoreItem> items, Done done) override { inner_->Store(std::move(items), std::move(done)); }
  void Exists(std::vector<ObjectKey> keys, Done done) override { inner_->Exists(std::move(keys), std::move(done)); }
  void Load(std::vector<LoadItem> items, Done done) override {
    std::lock_guard<std::mutex> lock(mu_);
    loads_.push_back([this, items = std::move(items), done = std::move(done)]() mutable {
      inner_->Load(std::move(items), std::move(done));
    });
  }
  void Delete(std::vector<ObjectKey> keys, Done done) override {
    std::lock_guard<std::mutex> lock(mu_);
    deletes_.push_back([this, keys = std::move(keys), done = std::move(done)]() mutable {
      inner_->Delete(std::move(keys), std::move(done));
    });
  }
  void Scan(ScanDone done) override { inner_->Scan(std::move(done)); }
  TierHealth Health() const override { return inner_->Health(); }
  void Close() override {
    ReleaseDeletes();
    ReleaseLoads();
    inner_->Close();
  }
  size_t held_deletes() {
    std::lock_guard<std::mutex> lock(mu_);
    return deletes_.size();
  }
  size_t held_loads() {
    std::lock_guard<std::mutex> lock(mu_);
    return loads_.size();
  }
  void ReleaseDeletes() { Release(deletes_); }
  void ReleaseNewestLoad() {
    std::function<void()> run;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (loads_.empty()) return;
      run = std::move(loads_.back());
      loads_.pop_back();
    }
    run();
  }
  void ReleaseLoads() { Release(loads_); }

 private:
  void Release(std::vector<std::function<void()>>& q) {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> lock(mu_);
      run.swap(q);
    }
    for (auto& f : run) f();
  }
  std::shared_ptr<Tier> inner_;
  std::mutex mu_;
  std::vector<std::function<void()>> loads_, deletes_;  // guarded by mu_
};

// Starts a prefetch whose answer records, at the moment it is given, how many of the
// answered chunks L1 really holds (every rank resident).
struct RecordedPrefetch {
  std::shared_ptr<std::promise<std::pair<size_t, size_t>>> promise =
      std::make_shared<std::promise<std::pair<size_t, size_t>>>();
  std::future<std::pair<size_t, size_t>> future = promise->get_future();
};

// Regression (concurrent lookups of one prefix): a second lookup of chunks a first lookup's
// prefetch was still loading counted them as already in L1 and answered at once, before they
// were there; its LOOKUP then locked nothing and answered 0 hits. It must wait for them.
TEST_F(TierSetTest, ConcurrentPrefetchesOfOnePrefixBothAnswerOnceTheChunksAreInL1) {
  auto mem = std::make_shared<MemoryTier>();
  for (int c = 0; c < 4; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) mem->Put(Obj(c, r), Value(c, r));
  }
  auto gate = std::make_shared<GateTier>(mem);
  Make({gate});
  auto start = [this](int first, int count) {
    RecordedPrefetch rp;
    auto pr = rp.promise;
    set_->Prefetch(Request(first, count), [this, pr, first](size_t n) {
      size_t held = 0;
      while (held < n && l1_->IsResident(Chunk(first + static_cast<int>(held)), 0) &&
             l1_->IsResident(Chunk(first + static_cast<int>(held)), 1)) {
        held++;
      }
      pr->set_value({n, held});
    });
    return rp;
  };
  auto first = start(0, 3);
  for (int i = 0; i < 2000 && gate->held_loads() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(gate->held_loads(), 1u);
  // A second lookup of the same three chunks, and a third that wants one more, whose own
  // load of chunk 3 is let through first.
  auto second = start(0, 3);
  auto third = start(0, 4);
  for (int i = 0; i < 2000 && gate->held_loads() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(gate->held_loads(), 2u);
  gate->ReleaseNewestLoad();
  EXPECT_EQ(second.future.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "answered while the chunks it counts were still being loaded by the first";
  EXPECT_EQ(third.future.wait_for(std::chrono::milliseconds(1)), std::future_status::timeout);
  gate->ReleaseLoads();
  for (auto* rp : {&first, &second, &third}) {
    ASSERT_EQ(rp->future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  }
  EXPECT_EQ(first.future.get(), (std::pair<size_t, size_t>{3, 3}));
  EXPECT_EQ(second.future.get(), (std::pair<size_t, size_t>{3, 3}));
  EXPECT_EQ(third.future.get(), (std::pair<size_t, size_t>{4, 4}));
  for (int c = 0; c < 4; ++c) EXPECT_TRUE(L1Holds(c)) << c;
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
}

// The chunks a second lookup waits for end its prefix where the first lookup's load failed.
TEST_F(TierSetTest, ConcurrentPrefetchEndsWhereTheLoadItWaitedForFailed) {
  auto mem = std::make_shared<MemoryTier>();
  for (int c = 0; c < 3; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) mem->Put(Obj(c, r), Value(c, r));
  }
  mem->Put(Obj(1, 1), std::vector<uint8_t>(100, 1));  // truncated: chunk 1 cannot arrive
  auto gate = std::make_shared<GateTier>(mem);
  Make({gate});
  auto p1 = std::make_shared<std::promise<size_t>>();
  auto f1 = p1->get_future();
  set_->Prefetch(Request(0, 3), [p1](size_t n) { p1->set_value(n); });
  for (int i = 0; i < 2000 && gate->held_loads() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto p2 = std::make_shared<std::promise<size_t>>();
  auto f2 = p2->get_future();
  set_->Prefetch(Request(0, 3), [p2](size_t n) { p2->set_value(n); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  gate->ReleaseLoads();
  ASSERT_EQ(f1.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  ASSERT_EQ(f2.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(f1.get(), 1u);
  EXPECT_EQ(f2.get(), 1u);
  EXPECT_TRUE(L1Holds(0));
  EXPECT_FALSE(l1_->IsResident(Chunk(1), 1));
  EXPECT_EQ(l1_->stats().staging_objects, 0u);
}

// Regression (busy deleted objects stayed indexed): an object the eviction round deleted
// while a prefetch was loading it stayed in the index, so the tier's usage and object count
// kept it forever (and eviction planned it again).
TEST_F(TierSetTest, EvictedObjectBeingLoadedLeavesTheIndex) {
  auto mem = std::make_shared<MemoryTier>();
  for (int c = 100; c < 102; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) mem->Put(Obj(c, r), Value(c, r));
  }
  auto gate = std::make_shared<GateTier>(mem);
  AdapterConfig cfg;
  cfg.type = "memory";
  cfg.max_capacity_gb = 4.0 * kObj / (1ull << 30);  // full
  cfg.eviction = TierEvictionConfig{"LRU", 0.8, 1.0};  // evict everything
  Make({gate}, {}, {cfg});
  for (int i = 0; i < 2000 && !set_->stats().tiers[0].scanned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(set_->stats().tiers[0].objects, 4u);
  clock_.AdvanceSeconds(2);
  for (int i = 0; i < 2000 && gate->held_deletes() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(gate->held_deletes(), 1u);
  // A lookup loads chunk 100 while its objects' delete is on its way.
  auto pr = std::make_shared<std::promise<size_t>>();
  auto fut = pr->get_future();
  set_->Prefetch(Request(100, 1), [pr](size_t n) { pr->set_value(n); });
  for (int i = 0; i < 2000 && gate->held_loads() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(gate->held_loads(), 1u);
  gate->ReleaseDeletes();
  gate->ReleaseLoads();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(fut.get(), 0u);  // deleted before the load read it
  ASSERT_TRUE(set_->WaitIdle(10));
  auto s = set_->stats().tiers[0];
  EXPECT_EQ(mem->size(), 0u);
  EXPECT_EQ(s.evicted_objects, 4u);
  EXPECT_EQ(s.objects, 0u);
  EXPECT_EQ(s.usage_bytes, 0u);
}

// An earlier run left 8 objects; this run stores 4 more into a 12-object tier whose eviction
// block names `policy`: the round frees 6 objects, all of the earlier run's.
void TierSetTest::EvictsObjectsOfEarlierRunsFirst(const std::string& policy) {
  auto a = std::make_shared<MemoryTier>();
  // An earlier run left 8 objects (chunks 100-103).
  for (int c = 100; c < 104; ++c) {
    for (uint32_t r = 0; r < kRanks; ++r) a->Put(Obj(c, r), Value(c, r));
  }
  AdapterConfig cfg;
  cfg.type = "memory";
  cfg.max_capacity_gb = 12.0 * kObj / (1ull << 30);  // room for 12 objects
  cfg.eviction = TierEvictionConfig{policy, 0.8, 0.5};
  Make({a}, {}, {cfg});
  for (int i = 0; i < 2000 && !set_->stats().tiers[0].scanned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(set_->stats().tiers[0].scanned);
  EXPECT_EQ(set_->stats().tiers[0].usage_bytes, 8 * kObj);
  // This run stores 2 chunks: 12 objects = 100% >= 80%: evict 50% = 6 objects, oldest first.
  for (int c = 0; c < 2; ++c) set_->StoreBehind(WriteL1(c), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(set_->stats().tiers[0].usage_bytes, 12 * kObj);
  clock_.AdvanceSeconds(2);
  for (int i = 0; i < 2000 && set_->stats().tiers[0].evicted_objects == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(set_->WaitIdle(10));
  auto s = set_->stats().tiers[0];
  EXPECT_EQ(s.evicted_objects, 6u);
  EXPECT_EQ(s.usage_bytes, 6 * kObj);
  EXPECT_EQ(a->size(), 6u);
  // The objects of this run survived; six of the earlier run's went.
  auto e = ExistsSync(*a, {Obj(0, 0), Obj(0, 1), Obj(1, 0), Obj(1, 1)});
  for (const auto& x : e) EXPECT_TRUE(x.status.ok());
}

TEST_F(TierSetTest, EvictionCoversObjectsOfEarlierRunsOldestFirst) { EvictsObjectsOfEarlierRunsFirst("LRU"); }

// lmcache's ARC tier policy: the eviction module's ARC orders the tier (tier_index.h).
TEST_F(TierSetTest, ArcEvictionCoversObjectsOfEarlierRunsFirst) { EvictsObjectsOfEarlierRunsFirst("ARC"); }

}  // namespace
}  // namespace kvd::l2

namespace kvd::l2 {
namespace {

// The same on a real directory: files an earlier run left are found by the startup scan,
// count towards max_capacity_gb and are evicted first, oldest first.
TEST_F(TierSetTest, FsTierEvictsFilesOfEarlierRuns) {
  char tmpl[] = "/tmp/kvd-evict-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  FsTierOptions fo;
  fo.base_path = dir;
  {
    auto earlier = std::move(FsTier::Create(fo)).value();
    for (int c = 200; c < 204; ++c) {
      for (uint32_t r = 0; r < kRanks; ++r) ASSERT_TRUE(StoreOne(*earlier, Obj(c, r), Value(c, r)).status.ok());
    }
  }
  auto tier = std::shared_ptr<Tier>(std::move(FsTier::Create(fo)).value());
  AdapterConfig cfg;
  cfg.type = "fs";
  cfg.max_capacity_gb = 10.0 * kObj / (1ull << 30);
  cfg.eviction = TierEvictionConfig{"LRU", 0.8, 0.4};
  Make({tier}, {}, {cfg});
  for (int i = 0; i < 200 && !set_->stats().tiers[0].scanned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(set_->stats().tiers[0].usage_bytes, 8 * kObj);
  set_->StoreBehind(WriteL1(0), Format());  // 10 objects = 100%: free 40% = 4 objects
  ASSERT_TRUE(set_->WaitIdle(10));
  clock_.AdvanceSeconds(2);
  for (int i = 0; i < 2000 && set_->stats().tiers[0].evicted_objects < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_EQ(set_->stats().tiers[0].evicted_objects, 4u);
  auto left = ScanSync(*tier);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 6u);
  auto e = ExistsSync(*tier, {Obj(0, 0), Obj(0, 1)});
  for (const auto& x : e) EXPECT_TRUE(x.status.ok());
  set_->Close();
  set_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kvd::l2

namespace kvd::l2 {
namespace {

// Issue 27, finding 3: a store flood never takes a capacity tier over max_capacity_gb (an fs
// tier grew to 26x its capacity: eviction frees a ratio per round, nothing held writes back).
TEST_F(TierSetTest, Finding3CapacityIsABoundUnderAStoreFlood) {
  char tmpl[] = "/tmp/kvd-admit-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  FsTierOptions fo;
  fo.base_path = dir;
  auto tier = std::shared_ptr<Tier>(std::move(FsTier::Create(fo)).value());
  AdapterConfig cfg;
  cfg.type = "fs";
  cfg.max_capacity_gb = 6.0 * kObj / (1ull << 30);  // room for 6 objects, no eviction
  Make({tier}, {}, {cfg});
  for (int i = 0; i < 200 && !set_->stats().tiers[0].scanned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (int c = 0; c < 10; ++c) set_->StoreBehind(WriteL1(c), Format());  // 20 objects
  ASSERT_TRUE(set_->WaitIdle(10));
  const auto st = set_->stats().tiers[0];
  EXPECT_LE(st.usage_bytes, 6 * kObj);
  EXPECT_EQ(st.stored_objects, 6u);
  EXPECT_EQ(st.store_full_objects, 14u);
  auto on_disk = ScanSync(*tier);
  ASSERT_TRUE(on_disk.ok());
  EXPECT_EQ(on_disk->size(), 6u);
  set_->Close();
  set_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kvd::l2

namespace kvd::l2 {
namespace {

// A tier whose back-end says it is healthy while every operation fails (a Redis that refuses
// writes with NOAUTH still connects).
class HealthyButFailing final : public Tier {
 public:
  explicit HealthyButFailing(std::shared_ptr<FaultTier> f) : f_(std::move(f)) {}
  std::string_view type() const override { return "memory"; }
  std::string Describe() const override { return "healthy-but-failing"; }
  void Store(std::vector<StoreItem> items, Done done) override { f_->Store(std::move(items), std::move(done)); }
  void Exists(std::vector<ObjectKey> keys, Done done) override { f_->Exists(std::move(keys), std::move(done)); }
  void Load(std::vector<LoadItem> items, Done done) override { f_->Load(std::move(items), std::move(done)); }
  void Delete(std::vector<ObjectKey> keys, Done done) override { f_->Delete(std::move(keys), std::move(done)); }
  void Scan(ScanDone done) override { f_->Scan(std::move(done)); }
  TierHealth Health() const override { return {true, "connected"}; }
  void Close() override { f_->Close(); }

 private:
  std::shared_ptr<FaultTier> f_;
};

// Issue 27, finding 11: health follows what writes and reads actually do, with the reason.
TEST_F(TierSetTest, Finding11HealthFollowsFailingWritesAndRecovers) {
  auto fault = std::make_shared<FaultTier>(std::make_shared<MemoryTier>());
  fault->FailOps(static_cast<uint8_t>(TierOp::kStore), StatusCode::kUnavailable);
  Make({std::make_shared<HealthyButFailing>(fault)});
  for (int c = 0; c < 3; ++c) set_->StoreBehind(WriteL1(c), Format());  // 6 failed writes
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_TRUE(set_->stats().tiers[0].health.healthy) << "fewer failures than the bound";
  for (int c = 3; c < 6; ++c) set_->StoreBehind(WriteL1(c), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  auto h = set_->stats().tiers[0].health;
  EXPECT_FALSE(h.healthy);
  EXPECT_NE(h.detail.find("operations failed"), std::string::npos) << h.detail;
  fault->FailOps(0);
  set_->StoreBehind(WriteL1(6), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_TRUE(set_->stats().tiers[0].health.healthy) << "a write went through again";
}

}  // namespace
}  // namespace kvd::l2

namespace kvd::l2 {
namespace {

// Issue 24 (synchronous fingerprint removal): with every tier indexed, the set says which
// chunk slots no tier holds, and tells on_chunk_slots_gone when a delete takes the last copy.
class TierSetChunkSlotsTest : public TierSetTest {
 protected:
  static AdapterConfig Capacity(std::optional<TierEvictionConfig> eviction = std::nullopt) {
    AdapterConfig cfg;
    cfg.type = "memory";
    cfg.max_capacity_gb = 64.0 * kObj / (1ull << 30);
    cfg.eviction = eviction;
    return cfg;
  }
  TierSetOptions Listening() {
    TierSetOptions o;
    o.on_chunk_slots_gone = [this](std::span<const ChunkSlot> slots) {
      std::lock_guard<std::mutex> lock(mu_);
      gone_.insert(gone_.end(), slots.begin(), slots.end());
    };
    return o;
  }
  std::vector<ChunkSlot> Gone() {
    std::lock_guard<std::mutex> lock(mu_);
    return gone_;
  }
  std::vector<ItemResult> DeleteSync(size_t tier, std::vector<ObjectKey> keys) {
    auto pr = std::make_shared<std::promise<std::vector<ItemResult>>>();
    auto f = pr->get_future();
    set_->DeleteObjects(tier, std::move(keys), [pr](std::vector<ItemResult> r) { pr->set_value(std::move(r)); });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    return f.get();
  }
  void WaitScanned() {
    for (size_t t = 0; t < set_->size(); ++t) {
      if (set_->stats().tiers[t].capacity_bytes == 0) continue;  // no index, no scan
      for (int i = 0; i < 2000 && !set_->stats().tiers[t].scanned; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  std::mutex mu_;
  std::vector<ChunkSlot> gone_;
};

TEST_F(TierSetChunkSlotsTest, Issue24TheLastCopysDeleteIsReportedOnceNoIndexedTierHoldsTheSlot) {
  Make({std::make_shared<MemoryTier>(), std::make_shared<MemoryTier>()}, Listening(), {Capacity(), Capacity()});
  WaitScanned();
  const auto objects = WriteL1(0);
  set_->StoreBehind(objects, Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_FALSE(set_->ChunkInNoTier(Chunk(0), kRanks));
  EXPECT_TRUE(set_->ChunkInNoTier(Chunk(1), kRanks)) << "never written";
  // Tier 0 drops rank 0's object: tier 1 still holds it.
  ASSERT_TRUE(DeleteSync(0, {Obj(0, 0)})[0].status.ok());
  EXPECT_TRUE(Gone().empty());
  EXPECT_FALSE(set_->ChunkInNoTier(Chunk(0), kRanks));
  // Tier 1 drops it too: the last copy of slot 0 went; slot 1 is untouched.
  ASSERT_TRUE(DeleteSync(1, {Obj(0, 0)})[0].status.ok());
  ASSERT_EQ(Gone().size(), 1u);
  EXPECT_EQ(Gone()[0], (ChunkSlot{Chunk(0), 0}));
  EXPECT_TRUE(set_->ChunkInNoTier(Chunk(0), kRanks));
  EXPECT_FALSE(set_->ChunkInNoTier(Chunk(0), 0)) << "no slot asked about";
  // Written again: held again, with its slots.
  set_->StoreBehind(objects, Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_FALSE(set_->ChunkInNoTier(Chunk(0), kRanks));
}

TEST_F(TierSetChunkSlotsTest, Issue24AnEvictionRoundReportsTheSlotsItTookTheLastCopyOf) {
  Make({std::make_shared<MemoryTier>()}, Listening(), {Capacity(TierEvictionConfig{"LRU", 0.0, 1.0})});
  WaitScanned();
  set_->StoreBehind(WriteL1(0), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  clock_.AdvanceSeconds(2);
  for (int i = 0; i < 2000 && Gone().size() < kRanks; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(set_->WaitIdle(10));
  auto gone = Gone();
  ASSERT_EQ(gone.size(), kRanks);
  std::sort(gone.begin(), gone.end(), [](const ChunkSlot& a, const ChunkSlot& b) { return a.slot < b.slot; });
  EXPECT_EQ(gone[0], (ChunkSlot{Chunk(0), 0}));
  EXPECT_EQ(gone[1], (ChunkSlot{Chunk(0), 1}));
  EXPECT_TRUE(set_->ChunkInNoTier(Chunk(0), kRanks));
}

// A tier without a capacity keeps no index, so nothing can be known: never "in no tier",
// never reported (the lookup's existence check decides instead).
TEST_F(TierSetChunkSlotsTest, Issue24ATierWithoutAnIndexMakesEveryAnswerUnknown) {
  Make({std::make_shared<MemoryTier>(), std::make_shared<MemoryTier>()}, Listening(), {Capacity(), {}});
  WaitScanned();
  set_->StoreBehind(WriteL1(0), Format());
  ASSERT_TRUE(set_->WaitIdle(10));
  EXPECT_FALSE(set_->ChunkInNoTier(Chunk(1), kRanks));
  ASSERT_TRUE(DeleteSync(0, {Obj(0, 0)})[0].status.ok());
  ASSERT_TRUE(DeleteSync(1, {Obj(0, 0)})[0].status.ok());
  EXPECT_FALSE(set_->ChunkInNoTier(Chunk(0), kRanks));
  EXPECT_TRUE(Gone().empty());
}

}  // namespace
}  // namespace kvd::l2
