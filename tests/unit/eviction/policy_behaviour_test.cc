// What each policy is for, beyond the shared contract: the order it evicts in.
#include <vector>

#include <gtest/gtest.h>

#include "eviction/eviction_policy.h"
#include "eviction/hook_list.h"

namespace kvd::eviction {
namespace {

class Owner final : public HookArena {
 public:
  explicit Owner(size_t n) : hooks_(n) {}
  Hook& hook(EntryId id) override { return hooks_.at(id); }
  uint64_t key(EntryId id) override { return 1000 + id; }
  size_t size() const { return hooks_.size(); }

 private:
  std::vector<Hook> hooks_;
};

struct Rig {
  explicit Rig(const char* name, size_t n = 64, SharedState* shared = nullptr) : owner(n) {
    policy = MakePolicy(name, PolicyContext{&owner, &clock, &quotas, shared});
  }
  // Evicts until nothing is offered; returns the order.
  std::vector<EntryId> Drain(size_t max = 1000) {
    std::vector<EntryId> out;
    while (out.size() < max) {
      auto v = policy->Victim();
      if (!v) break;
      out.push_back(v->id);
      policy->Evicted(v->id);
    }
    return out;
  }
  EntryId EvictOne() {
    auto v = policy->Victim();
    EXPECT_TRUE(v.has_value());
    policy->Evicted(v->id);
    return v->id;
  }
  Owner owner;
  std::atomic<uint32_t> clock{0};
  QuotaBook quotas;
  std::unique_ptr<EvictionPolicy> policy;
};

TEST(LruPolicy, LeastRecentlyUsedFirstAndReleaseCountsAsUse) {
  Rig r("LRU");
  for (EntryId i = 0; i < 5; ++i) r.policy->Insert(i);
  r.policy->Access(0);  // 1 2 3 4 0
  r.policy->Hold(1);    // off the list
  r.policy->Access(2);  // 3 4 0 2
  r.policy->Release(1); // 3 4 0 2 1
  EXPECT_EQ(r.Drain(), (std::vector<EntryId>{3, 4, 0, 2, 1}));
}

TEST(LruPolicy, InstancesSharingAClockRankInGlobalLruOrder) {
  // Two shards: the candidate with the larger age is the globally least recently used.
  Owner owner(8);
  std::atomic<uint32_t> clock{0};
  auto a = MakeLruPolicy({&owner, &clock, nullptr});
  auto b = MakeLruPolicy({&owner, &clock, nullptr});
  a->Insert(0);
  b->Insert(1);
  a->Insert(2);
  b->Insert(3);
  a->Access(0);  // global order now: 1 2 3 0
  std::vector<EntryId> order;
  for (;;) {
    auto va = a->Victim(), vb = b->Victim();
    if (!va && !vb) break;
    const bool take_a = va && (!vb || GoesBefore(*va, *vb));
    auto& p = take_a ? a : b;
    order.push_back((take_a ? va : vb)->id);
    p->Evicted(order.back());
  }
  EXPECT_EQ(order, (std::vector<EntryId>{1, 2, 3, 0}));
}

TEST(ArcPolicy, EntriesHitTwiceOutliveAScanOfNewOnes) {
  Rig r("ARC", 100);
  for (EntryId i = 0; i < 10; ++i) r.policy->Insert(i);
  for (EntryId i = 0; i < 10; ++i) r.policy->Access(i);  // all in T2 now
  // A scan: 40 entries used once. Keep the cache at 10 entries.
  for (EntryId i = 10; i < 50; ++i) {
    r.policy->Insert(i);
    const EntryId v = r.EvictOne();
    EXPECT_GE(v, 10u) << "a frequently used entry was evicted by a scan";
  }
}

TEST(ArcPolicy, GhostHitInB1GrowsTheRecencySide) {
  Rig r("ARC", 100);
  // T2 holds 0..4 (hit twice), T1 gets 5..9; evicting takes T1 first while T1 > p = 0.
  for (EntryId i = 0; i < 5; ++i) r.policy->Insert(i), r.policy->Access(i);
  for (EntryId i = 5; i < 10; ++i) r.policy->Insert(i);
  EXPECT_EQ(r.EvictOne(), 5u);  // into B1
  // 5 comes back: a B1 ghost hit, so it goes to T2 and p grows; T1 (6..9) is now at most
  // p-sized more often, so the next victims still come from T1 only while it is above p.
  r.owner.hook(5) = Hook{};
  r.policy->Insert(5);
  const EntryId v = r.EvictOne();
  EXPECT_TRUE(v >= 6 && v <= 9) << v;  // T1 still larger than p = 1
}

TEST(S3FifoPolicy, OneHitWondersLeaveBeforeEntriesHitInTheSmallQueue) {
  Rig r("S3-FIFO", 100);
  for (EntryId i = 0; i < 10; ++i) r.policy->Insert(i);
  r.policy->Access(0);
  r.policy->Access(1);
  // 0 and 1 were hit while in S: they move to M; the others are evicted first, in FIFO order.
  auto order = r.Drain();
  ASSERT_EQ(order.size(), 10u);
  EXPECT_EQ(std::vector<EntryId>(order.begin(), order.begin() + 8),
            (std::vector<EntryId>{2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(S3FifoPolicy, GhostHitsEnterTheMainQueue) {
  Rig r("S3-FIFO", 100);
  for (EntryId i = 0; i < 20; ++i) r.policy->Insert(i);
  for (EntryId i = 10; i < 20; ++i) r.policy->Access(i);  // these will reach M
  // Evict 0: it leaves S into the ghost queue.
  EXPECT_EQ(r.EvictOne(), 0u);
  r.owner.hook(0) = Hook{};
  r.policy->Insert(0);  // ghost hit: straight into M
  // The rest of S (1..9) goes before 0, which now sits in M.
  for (EntryId i = 1; i < 10; ++i) EXPECT_EQ(r.EvictOne(), i);
}

TEST(IsolatedLruPolicy, GroupsThatMustShedGoFirstThenPlainLru) {
  Rig r("IsolatedLRU");
  for (EntryId i = 0; i < 6; ++i) {
    r.owner.hook(i).group = i < 3 ? 1 : 2;  // 0,1,2 in group 1; 3,4,5 in group 2
    r.policy->Insert(i);
  }
  r.quotas.SetLimit(1, 1 << 20);
  r.quotas.SetLimit(2, 100);
  r.quotas.AddUsage(1, 1000);   // within its quota
  r.quotas.AddUsage(2, 1000);   // over its quota
  auto v = r.policy->Victim();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->id, 3u);  // group 2's oldest, although 0 is older
  EXPECT_EQ(v->priority, EvictionPolicy::kForced);
  r.quotas.AddUsage(2, -1000);  // back under: plain LRU across groups
  v = r.policy->Victim();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->id, 0u);
  EXPECT_EQ(v->priority, EvictionPolicy::kNormal);
}

TEST(IsolatedLruPolicy, AGroupWithoutAQuotaMustShed) {
  // lmcache's allowlist semantics: no quota means an effective limit of 0.
  Rig r("IsolatedLRU");
  r.owner.hook(0).group = 7;
  r.policy->Insert(0);
  r.quotas.AddUsage(7, 4096);
  auto v = r.policy->Victim();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->priority, EvictionPolicy::kForced);
}

TEST(LhdPolicy, WithoutRequestUsesItIsLru) {
  // Accesses that carry no UseInfo (read pins, touches) refresh recency but count no use:
  // every entry stays in one class, and one class is LRU.
  Rig r("LHD");
  for (EntryId i = 0; i < 5; ++i) r.policy->Insert(i);
  r.policy->Access(0);
  r.policy->Hold(1);
  r.policy->Access(2);
  r.policy->Release(1);
  EXPECT_EQ(r.Drain(), (std::vector<EntryId>{3, 4, 0, 2, 1}));
}

// An owner with room for 100 entries: 40 popular entries, each used again (a lookup, or a
// store after a miss) after 160 one-shot entries were stored. Returns the hits of the popular
// entries in the last half of the rounds.
int PopularHitsThroughScans(Rig& r, int rounds = 100) {
  constexpr size_t kRoom = 100;
  constexpr EntryId kPopular = 40;
  const UseInfo use{0, 1, 0};
  std::vector<bool> resident(r.owner.size(), false);
  auto make_room = [&] {
    while (r.policy->size() >= kRoom) {
      auto v = r.policy->Victim();
      if (!v) return;
      r.policy->Evicted(v->id);
      resident[v->id] = false;
    }
  };
  auto store = [&](EntryId id) {
    make_room();
    r.policy->Insert(id, use);
    resident[id] = true;
  };
  int hits = 0;
  EntryId next = kPopular;
  for (int round = 0; round < rounds; ++round) {
    for (EntryId p = 0; p < kPopular; ++p) {
      if (resident[p]) {
        r.policy->Access(p, use);
        hits += round >= rounds / 2;
      } else {
        store(p);
      }
      for (int s = 0; s < 4; ++s) store(next++);
    }
  }
  return hits;
}

TEST(LhdPolicy, LearnsThatEntriesUsedAgainOutliveAScanOfOneShotEntries) {
  constexpr size_t kIds = 40 + 100 * 40 * 4;
  Rig lru("LRU", kIds), lhd("LHD", kIds);
  EXPECT_EQ(PopularHitsThroughScans(lru), 0);  // 200 entries between uses, room for 100
  // Ghosts show the popular keys coming back; once the index is learned they stay.
  EXPECT_GE(PopularHitsThroughScans(lhd), 50 * 40 * 9 / 10);
}

TEST(LhdPolicy, InstancesRankWithTheIndexLearnedByAll) {
  constexpr size_t kIds = 40 + 100 * 40 * 4;
  auto shared = MakeSharedState("lhd");
  ASSERT_NE(shared, nullptr);
  Rig teacher("LHD", kIds, shared.get());
  ASSERT_GT(PopularHitsThroughScans(teacher), 0);
  // A second instance that saw nothing: an entry used twice, then newer entries used once.
  Rig pupil("LHD", 8, shared.get());
  pupil.policy->Insert(0, UseInfo{0, 1, 0});
  pupil.policy->Access(0, UseInfo{0, 1, 0});
  for (EntryId i = 1; i < 8; ++i) pupil.policy->Insert(i, UseInfo{0, 1, 0});
  for (int t = 0; t < 200; ++t) Tick(pupil.clock);  // everyone ages
  // LRU would take 0 first; the shared index says once-used entries are worth less.
  EXPECT_NE(pupil.EvictOne(), 0u);
  EXPECT_EQ(MakeSharedState("LRU"), nullptr);
}

TEST(QuotaBook, SheddingStartsAtTheWatermarkAndStopsAtWatermarkMinusRatio) {
  QuotaBook q;
  q.SetLimit(3, 1000);
  q.AddUsage(3, 790);
  q.UpdateShedding();
  EXPECT_FALSE(q.MustShed(3));
  q.AddUsage(3, 10);  // 800 = 0.8 x 1000
  q.UpdateShedding();
  EXPECT_TRUE(q.MustShed(3));
  q.AddUsage(3, -150);  // 650: still above 600
  EXPECT_TRUE(q.MustShed(3));
  q.AddUsage(3, -50);  // 600: shedding stops at once, before the next round
  EXPECT_FALSE(q.MustShed(3));
  q.UpdateShedding();
  q.AddUsage(3, 50);  // 650 again: below the watermark, not shedding
  EXPECT_FALSE(q.MustShed(3));
  EXPECT_TRUE(q.ClearLimit(3));
  EXPECT_FALSE(q.ClearLimit(3));
  EXPECT_TRUE(q.MustShed(3));  // no limit: effective 0
  EXPECT_EQ(q.Usage(3), 650u);
  EXPECT_EQ(q.Usage(4), 0u);
}

}  // namespace
}  // namespace kvd::eviction
