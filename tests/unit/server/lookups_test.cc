// Lookups with tiers: a lookup whose prefix continues in a tier, and a later lookup of the
// same request that supersedes it while the first one's prefetch completes. The tier is a
// fake that answers inline (inside the call) or from its own thread after a short random
// spin, to force the orders in which a prefetch's completion and a new lookup meet.
#include "server/lookups.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <algorithm>
#include <functional>
#include <thread>

#include "common/clock.h"
#include "l2/serde.h"
#include "server/chunk_keys.h"

namespace kvd::server {
namespace {

constexpr uint64_t kObj = 4096;
constexpr int64_t kChunk = 256;

// Holds every object but those of `absent` chunk hashes; Load fills the destination with a
// pattern. Exists always answers inside the call. Loads too when inline; otherwise a thread
// answers each Load once `gate()` is true.
class InstantTier final : public l2::Tier {
 public:
  InstantTier(bool inline_answers, std::vector<keys::Hash32> absent, std::function<bool()> gate)
      : inline_(inline_answers), absent_(std::move(absent)), gate_(std::move(gate)) {
    if (!inline_) thread_ = std::thread([this] { Run(); });
  }
  ~InstantTier() override { Close(); }
  std::string_view type() const override { return "instant"; }
  std::string Describe() const override { return "instant (test)"; }
  void Store(std::vector<l2::StoreItem> items, Done done) override {
    Answer(std::vector<l2::ItemResult>(items.size(), {Status::Ok(), 0}), std::move(done));
  }
  void Exists(std::vector<l2::ObjectKey> keys, Done done) override {
    std::vector<l2::ItemResult> r;
    for (const auto& k : keys) {
      const bool gone = std::find(absent_.begin(), absent_.end(), k.chunk_hash) != absent_.end();
      r.push_back(gone ? l2::ItemResult{Status::NotFound("absent"), 0} : l2::ItemResult{Status::Ok(), kObj});
    }
    done(std::move(r));
  }
  void Load(std::vector<l2::LoadItem> items, Done done) override {
    ++loads_;
    std::vector<l2::ItemResult> r;
    for (auto& it : items) {
      std::memset(it.dst, 0x5a, it.size);
      r.push_back({Status::Ok(), it.size});
    }
    Answer(std::move(r), std::move(done));
  }
  void Delete(std::vector<l2::ObjectKey> keys, Done done) override {
    Answer(std::vector<l2::ItemResult>(keys.size(), {Status::Ok(), 0}), std::move(done));
  }
  void Scan(ScanDone done) override { done(std::vector<l2::ScannedObject>{}); }
  l2::TierHealth Health() const override { return {}; }
  // Load calls so far.
  int loads() const { return loads_.load(); }
  void Close() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Answer(std::vector<l2::ItemResult> r, Done done) {
    if (inline_) {
      done(std::move(r));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(r), std::move(done)});
  }
  void Run() {
    while (!stop_) {
      std::pair<std::vector<l2::ItemResult>, Done> call;
      bool got = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!queue_.empty()) {
          call = std::move(queue_.front());
          queue_.pop_front();
          got = true;
        }
      }
      if (!got) {
        std::this_thread::yield();
        continue;
      }
      while (!stop_ && gate_ && !gate_()) std::this_thread::yield();
      call.second(std::move(call.first));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : queue_) c.second(std::move(c.first));
    queue_.clear();
  }

  const bool inline_;
  const std::vector<keys::Hash32> absent_;
  const std::function<bool()> gate_;
  std::atomic<bool> stop_{false};
  std::atomic<int> loads_{0};
  std::mutex mu_;
  std::deque<std::pair<std::vector<l2::ItemResult>, Done>> queue_;  // guarded by mu_
  std::thread thread_;
};

class LookupsTest : public ::testing::Test {
 protected:
  // `pad` more instances of other models make the registry slow to search (a long LOOKUP).
  void Make(bool inline_answers, std::vector<keys::Hash32> absent = {},
            std::function<bool()> gate = nullptr, int pad = 0) {
    l1::L1CacheOptions o;
    o.capacity_bytes = 16ull << 20;
    o.clock = &clock_;
    l1_ = std::move(l1::L1Cache::Create(o)).value();
    sessions_ = std::make_unique<SessionTable>(&clock_, static_cast<uint32_t>(kChunk), 600.0);
    registry_ = std::make_unique<InstanceRegistry>(&clock_);
    auto inst = std::make_shared<Instance>();
    inst->id = 1;
    inst->model_name = "m";
    inst->world_size = 1;
    inst->object_bytes = kObj;
    inst->tier_format = {kObj, "", {}};
    registry_->Put(inst);
    for (int i = 0; i < pad; ++i) {
      auto other = std::make_shared<Instance>(*inst);
      other->id = 1000 + i;
      other->model_name = "other" + std::to_string(i);
      registry_->Put(other);
    }
    l2::TierSpec spec;
    spec.config.type = "instant";
    tier_ = std::make_shared<InstantTier>(inline_answers, std::move(absent), std::move(gate));
    spec.tier = tier_;
    spec.serde = std::move(l2::MakeSerde(nullptr)).value();
    l2::TierSetOptions to;
    to.clock = &clock_;
    to.prefetch_policy = "retain";
    std::vector<l2::TierSpec> specs;
    specs.push_back(std::move(spec));
    tiers_ = std::move(l2::TierSet::Create(to, std::move(specs), l1_.get())).value();
    ServiceContext context;
    context.config = &config_;
    context.clock = &clock_;
    context.l1 = l1_.get();
    context.sessions = sessions_.get();
    context.registry = registry_.get();
    context.counters = &counters_;
    context.tiers = tiers_.get();
    context.pending_commits = std::make_shared<PendingCommits>();
    lookups_ = std::make_unique<Lookups>(context);
  }
  void TearDown() override {
    if (tiers_) tiers_->Close();
  }

  wire::CacheKey Key(const std::string& rid, int seed, int64_t tokens) {
    wire::CacheKey k;
    k.model_name = "m";
    k.world_size = 1;
    for (int64_t i = 0; i < tokens; ++i) k.token_ids.push_back(static_cast<uint32_t>((i * 31 + seed) % 32000));
    k.start = 0;
    k.end = tokens;
    k.request_id = rid;
    k.num_kv_readers = 1;
    return k;
  }
  std::vector<l1::ChunkKey> Chunks(int seed, int64_t tokens) {
    auto r = RequestChunkKeys(*sessions_, l1_->namespaces(), kChunk, Key("keys", seed, tokens), true);
    EXPECT_TRUE(r.ok());
    return r->keys;
  }
  void WriteL1(const l1::ChunkKey& k) {
    auto res = l1_->ReserveWrite(k, 1, 0, kObj);
    ASSERT_TRUE(res.ok());
    std::memset(res->data(), 1, kObj);
    ASSERT_TRUE(res->Commit());
  }
  uint32_t ReadLocks(const l1::ChunkKey& k) {
    auto s = l1_->DescribeSlot(k, 0);
    return s ? s->read_locks : 0;
  }

  ServerConfig config_;
  FakeClock clock_;
  ServiceCounters counters_;
  std::unique_ptr<l1::L1Cache> l1_;
  std::unique_ptr<SessionTable> sessions_;
  std::unique_ptr<InstanceRegistry> registry_;
  std::unique_ptr<Lookups> lookups_;
  std::shared_ptr<InstantTier> tier_;
  std::unique_ptr<l2::TierSet> tiers_;
};

// A tier that completes at once: the prefetch's completion runs inside the LOOKUP; the
// result is the whole prefix, read-locked, and no lock is left of the L1 part alone.
TEST_F(LookupsTest, PrefetchCompletingInsideTheLookupIsRecorded) {
  Make(/*inline_answers=*/true);
  auto a = Chunks(1, 2 * kChunk);
  WriteL1(a[0]);  // chunk 1 is in the tier only
  ASSERT_TRUE(lookups_->Lookup({Key("r", 1, 2 * kChunk), 1}).ok());
  EXPECT_EQ(lookups_->results().Take("r"), std::optional<int64_t>(2));
  EXPECT_EQ(ReadLocks(a[0]), 1u);
  EXPECT_EQ(ReadLocks(a[1]), 1u);
}

// The tier's part of the hit is counted once the prefetch finished, under the lookup's
// (model_name, cache_salt): L1 chunk 0, tier chunk 1; keys are objects (one per rank).
TEST_F(LookupsTest, HitsAreSplitBetweenL1AndTheTiersPerModelAndSalt) {
  Make(/*inline_answers=*/true);
  auto a = Chunks(1, 2 * kChunk);
  WriteL1(a[0]);  // chunk 1 is in the tier only
  ASSERT_TRUE(lookups_->Lookup({Key("r", 1, 2 * kChunk), 1}).ok());
  EXPECT_EQ(lookups_->results().Take("r"), std::optional<int64_t>(2));
  const LookupValues& v = counters_.lookups.Get({"m", ""});
  EXPECT_EQ(v.lookups.load(), 1u);
  EXPECT_EQ(v.requested_chunks.load(), 2u);
  EXPECT_EQ(v.hit_l1_chunks.load(), 1u);
  EXPECT_EQ(v.hit_l2_chunks.load(), 1u);
  EXPECT_EQ(v.hit_l1_keys.load(), 1u);
  EXPECT_EQ(v.hit_l2_keys.load(), 1u);
  EXPECT_EQ(counters_.lookups.size(), 1u);
}

// Regression (prefetch callback race): a prefetch's completion could run after a later
// LOOKUP of the same request read-locked its prefix but before that lookup was registered
// (LookupResults::Begin), see itself as the current lookup, and replace the new lookup's locks with
// its own. Forced here: lookup 1 (prompt A) waits for a tier load; lookup 2 (prompt B, whose
// second chunk no tier has) read-locks B's first chunk, which releases the tier's answer to
// lookup 1 while lookup 2 is still searching a large registry. After both answered the
// request must hold exactly lookup 2's lock and report its 1 hit.
TEST_F(LookupsTest, PrefetchCallbackRaceLeavesTheLastLookupsLocks) {
  std::vector<l1::ChunkKey> a, b;
  std::atomic<bool> armed{false};
  // The tier answers lookup 1's load once lookup 2 holds B's first chunk.
  auto gate = [&] { return armed.load() && ReadLocks(b[0]) > 0; };
  // Keys are known only after L1 exists: build once to compute them, then for the test.
  Make(true);
  a = Chunks(1, 2 * kChunk);  // chunk 0 in L1, chunk 1 in the tier
  b = Chunks(2, 2 * kChunk);  // chunk 0 in L1, chunk 1 nowhere
  tiers_->Close();
  tiers_.reset();
  Make(false, {b[1].chunk_hash}, gate, /*pad=*/100000);
  ASSERT_EQ(Chunks(1, 2 * kChunk)[1].chunk_hash, a[1].chunk_hash);
  a = Chunks(1, 2 * kChunk);
  b = Chunks(2, 2 * kChunk);
  WriteL1(a[0]);
  WriteL1(b[0]);
  armed = true;
  ASSERT_TRUE(lookups_->Lookup({Key("r", 1, 2 * kChunk), 1}).ok());
  ASSERT_TRUE(lookups_->Lookup({Key("r", 2, 2 * kChunk), 1}).ok());
  std::optional<int64_t> hits;
  for (int i = 0; i < 2000 && !(hits = lookups_->results().Take("r")); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(tiers_->WaitIdle(10));
  for (int i = 0; i < 2000 && tiers_->stats().active_prefetch_jobs > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(hits, std::optional<int64_t>(1));
  EXPECT_EQ(ReadLocks(b[0]), 1u);
  EXPECT_EQ(ReadLocks(a[0]), 0u);
  EXPECT_EQ(ReadLocks(a[1]), 0u);
  EXPECT_EQ(tiers_->stats().prefetch_hit_chunks, 1u);  // lookup 1's chunk did arrive
}

// Regression (stale prefetch after END_SESSION): a request's lookup generations restarted
// with its session, so a prefetch that outlived END_SESSION passed for the first lookup of the
// same request id after it, replaced that lookup's read locks with its own prompt's and
// recorded its own hit count. Forced here: lookup 1 (prompt A) waits for its tier load, the
// session ends, lookup 2 (prompt B) of the same id waits for its own; then the tier answers
// both, A's first. The result and the locks must be lookup 2's.
TEST_F(LookupsTest, StalePrefetchAfterEndSessionLeavesTheNextLookupAlone) {
  std::atomic<bool> release{false};
  Make(false, {}, [&] { return release.load(); });
  auto a = Chunks(1, 3 * kChunk);  // chunk 0 in L1, chunks 1 and 2 in the tier
  auto b = Chunks(2, 2 * kChunk);  // chunk 0 in L1, chunk 1 in the tier
  WriteL1(a[0]);
  WriteL1(b[0]);
  auto wait_loads = [&](int n) {
    for (int i = 0; i < 5000 && tier_->loads() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(tier_->loads(), n);
  };
  ASSERT_TRUE(lookups_->Lookup({Key("r", 1, 3 * kChunk), 1}).ok());
  wait_loads(1);
  lookups_->EndSession("r");
  ASSERT_TRUE(lookups_->Lookup({Key("r", 2, 2 * kChunk), 1}).ok());
  wait_loads(2);
  release = true;
  std::optional<int64_t> hits;
  for (int i = 0; i < 5000 && !(hits = lookups_->results().Take("r")); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(tiers_->WaitIdle(10));
  EXPECT_EQ(hits, std::optional<int64_t>(2));  // B's two chunks, not A's three
  EXPECT_EQ(ReadLocks(b[0]), 1u);
  EXPECT_EQ(ReadLocks(b[1]), 1u);
  EXPECT_EQ(ReadLocks(a[0]), 0u);
  EXPECT_EQ(ReadLocks(a[1]), 0u);
  EXPECT_EQ(ReadLocks(a[2]), 0u);
}

}  // namespace
}  // namespace kvd::server
