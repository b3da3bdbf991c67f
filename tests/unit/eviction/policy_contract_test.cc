// One contract, every policy: the rules of eviction_policy.h checked over each name
// MakePolicy accepts, against a reference model of which entries are evictable.
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "eviction/eviction_policy.h"

namespace kvd::eviction {
namespace {

// A minimal owner: entries are indices into a vector of hooks; keys are derived from a
// per-entry identity so that a re-inserted identity has the same key (ghost hits).
class FakeOwner final : public HookArena {
 public:
  explicit FakeOwner(size_t n) : hooks_(n), keys_(n) {
    for (size_t i = 0; i < n; ++i) keys_[i] = 0x9e3779b97f4a7c15ULL * (i + 1);
  }
  Hook& hook(EntryId id) override { return hooks_.at(id); }
  uint64_t key(EntryId id) override { return keys_.at(id); }
  void Reset(EntryId id) { hooks_.at(id) = Hook{}; }

 private:
  std::vector<Hook> hooks_;
  std::vector<uint64_t> keys_;
};

class PolicyContract : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<EvictionPolicy> Make(FakeOwner* owner) {
    PolicyContext c;
    c.hooks = owner;
    c.clock = &clock_;
    c.quotas = &quotas_;
    auto p = MakePolicy(GetParam(), c);
    EXPECT_NE(p, nullptr);
    return p;
  }
  bool Evicts() const { return GetParam() != "noop"; }

  std::atomic<uint32_t> clock_{0};
  QuotaBook quotas_;
};

TEST_P(PolicyContract, NameRoundTrips) {
  FakeOwner owner(1);
  auto p = Make(&owner);
  EXPECT_EQ(p->name(), GetParam());
  EXPECT_EQ(CanonicalPolicyName(GetParam()), GetParam());
}

TEST_P(PolicyContract, EmptyPolicyOffersNothing) {
  FakeOwner owner(1);
  auto p = Make(&owner);
  EXPECT_FALSE(p->Victim().has_value());
  EXPECT_EQ(p->size(), 0u);
}

TEST_P(PolicyContract, EvictingDrainsEveryEntryExactlyOnce) {
  constexpr EntryId kN = 200;
  FakeOwner owner(kN);
  auto p = Make(&owner);
  for (EntryId i = 0; i < kN; ++i) p->Insert(i);
  for (EntryId i = 0; i < kN; i += 3) p->Access(i);
  EXPECT_EQ(p->size(), kN);
  std::set<EntryId> seen;
  while (auto v = p->Victim()) {
    ASSERT_LT(v->id, kN);
    ASSERT_TRUE(seen.insert(v->id).second) << "offered twice: " << v->id;
    p->Evicted(v->id);
  }
  if (Evicts()) {
    EXPECT_EQ(seen.size(), kN);
    EXPECT_EQ(p->size(), 0u);
  } else {
    EXPECT_TRUE(seen.empty());
  }
}

TEST_P(PolicyContract, HeldEntriesAreNeverOffered) {
  constexpr EntryId kN = 20;
  FakeOwner owner(kN);
  auto p = Make(&owner);
  for (EntryId i = 0; i < kN; ++i) p->Insert(i);
  for (EntryId i = 0; i < kN; ++i) p->Hold(i);
  EXPECT_FALSE(p->Victim().has_value());
  EXPECT_EQ(p->size(), kN);  // held entries are still tracked
  p->Access(7);              // a hit while held is allowed
  p->Access(7, UseInfo{2, 5, 3});  // with request information too
  p->Release(7);
  auto v = p->Victim();
  if (Evicts()) {
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->id, 7u);
    p->Evicted(7);
  } else {
    EXPECT_FALSE(v.has_value());
  }
  EXPECT_FALSE(p->Victim().has_value());
}

TEST_P(PolicyContract, ErasedEntriesAreForgotten) {
  FakeOwner owner(3);
  auto p = Make(&owner);
  for (EntryId i = 0; i < 3; ++i) p->Insert(i);
  p->Hold(1);
  p->Erase(1);  // held then erased
  p->Erase(0);  // evictable then erased
  EXPECT_EQ(p->size(), 1u);
  if (Evicts()) {
    auto v = p->Victim();
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->id, 2u);
  }
}

TEST_P(PolicyContract, ReinsertedIdentitiesAreTrackedAgain) {
  // Evict everything, re-insert the same identities (ghost hits for ARC and S3-FIFO), and
  // drain again: the policy must account for them like fresh entries.
  constexpr EntryId kN = 50;
  FakeOwner owner(kN);
  auto p = Make(&owner);
  for (int round = 0; round < 3; ++round) {
    for (EntryId i = 0; i < kN; ++i) {
      owner.Reset(i);
      p->Insert(i);
    }
    EXPECT_EQ(p->size(), kN);
    size_t drained = 0;
    while (auto v = p->Victim()) {
      p->Evicted(v->id);
      ++drained;
    }
    if (!Evicts()) {
      for (EntryId i = 0; i < kN; ++i) p->Erase(i);
    } else {
      EXPECT_EQ(drained, kN);
    }
    EXPECT_EQ(p->size(), 0u);
  }
}

// Random operations against a reference model: the victim is always a tracked, unheld entry,
// size() is the tracked count, and a policy that evicts offers a victim whenever an unheld
// entry exists.
TEST_P(PolicyContract, RandomOperationsKeepTheContract) {
  constexpr EntryId kN = 64;
  FakeOwner owner(kN);
  auto p = Make(&owner);
  std::set<EntryId> tracked, held;
  std::mt19937 rng(1234);
  for (int step = 0; step < 20000; ++step) {
    const EntryId id = rng() % kN;
    const int op = static_cast<int>(rng() % 7);
    const bool is_tracked = tracked.count(id) > 0;
    const bool is_held = held.count(id) > 0;
    // Half the uses carry request information (a lookup's), half none (a pin, a touch).
    const uint32_t chunks = rng() % 2 ? 1 + rng() % 8 : 0;
    const UseInfo use{chunks ? static_cast<uint32_t>(rng() % chunks) : 0, chunks,
                      chunks ? static_cast<uint32_t>(rng() % (chunks + 1)) : 0};
    if (!is_tracked) {
      if (op < 4) {
        owner.Reset(id);
        p->Insert(id, use);
        tracked.insert(id);
      }
    } else if (op == 0) {
      p->Access(id, use);
    } else if (op == 1 && !is_held) {
      p->Hold(id);
      held.insert(id);
    } else if (op == 2 && is_held) {
      p->Release(id);
      held.erase(id);
    } else if (op == 3) {
      p->Erase(id);
      tracked.erase(id);
      held.erase(id);
    } else if (op >= 4) {
      auto v = p->Victim();
      if (Evicts() && held.size() < tracked.size()) {
        ASSERT_TRUE(v.has_value()) << step;
      }
      if (v) {
        ASSERT_TRUE(tracked.count(v->id)) << "victim " << v->id << " is not tracked";
        ASSERT_FALSE(held.count(v->id)) << "victim " << v->id << " is held";
        if (op == 6) {
          p->Evicted(v->id);
          tracked.erase(v->id);
        }
      }
    }
    ASSERT_EQ(p->size(), tracked.size()) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PolicyContract, ::testing::ValuesIn(PolicyNames()),
                         [](const auto& info) {
                           std::string n = info.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

TEST(PolicyRegistry, NamesAreCaseInsensitiveAndUnknownNamesFail) {
  EXPECT_EQ(CanonicalPolicyName("lru"), "LRU");
  EXPECT_EQ(CanonicalPolicyName("s3-fifo"), "S3-FIFO");
  EXPECT_EQ(CanonicalPolicyName("isolatedlru"), "IsolatedLRU");
  EXPECT_EQ(CanonicalPolicyName("NOOP"), "noop");
  EXPECT_FALSE(CanonicalPolicyName("LFU").has_value());
  FakeOwner owner(1);
  std::atomic<uint32_t> clock{0};
  EXPECT_EQ(MakePolicy("LFU", PolicyContext{&owner, &clock, nullptr}), nullptr);
}

}  // namespace
}  // namespace kvd::eviction
