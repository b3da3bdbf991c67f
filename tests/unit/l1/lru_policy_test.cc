// LruPolicy through the EvictionPolicy interface: candidate order, access, removal and the
// visitor verdicts the table relies on.
#include <vector>

#include <gtest/gtest.h>

#include "l1/eviction_policy.h"

namespace kvd::l1 {
namespace {

using Verdict = EvictionPolicy::Verdict;

std::vector<EntryId> Order(EvictionPolicy& policy) {
  std::vector<EntryId> out;
  policy.ForEachCandidate([&](EntryId id) {
    out.push_back(id);
    return Verdict::kSkip;
  });
  return out;
}

TEST(LruPolicyTest, OffersLeastRecentlyUsedFirst) {
  auto lru = MakeLruPolicy();
  EXPECT_STREQ(lru->name(), "lru");
  for (EntryId id : {1, 2, 3, 4}) lru->OnInsert(id);
  EXPECT_EQ(Order(*lru), (std::vector<EntryId>{1, 2, 3, 4}));
  lru->OnAccess(2);
  lru->OnAccess(1);
  EXPECT_EQ(Order(*lru), (std::vector<EntryId>{3, 4, 2, 1}));
  lru->OnAccess(99);  // unknown: ignored
  lru->OnRemove(4);
  lru->OnRemove(99);
  EXPECT_EQ(Order(*lru), (std::vector<EntryId>{3, 2, 1}));
  EXPECT_EQ(lru->size(), 3u);
}

TEST(LruPolicyTest, VerdictsRemoveAndStop) {
  auto lru = MakeLruPolicy();
  for (EntryId id : {1, 2, 3, 4, 5}) lru->OnInsert(id);
  std::vector<EntryId> seen;
  lru->ForEachCandidate([&](EntryId id) {
    seen.push_back(id);
    if (id == 1) return Verdict::kSkip;
    if (id == 2) return Verdict::kEvicted;
    return Verdict::kEvictedAndStop;  // 3
  });
  EXPECT_EQ(seen, (std::vector<EntryId>{1, 2, 3}));
  EXPECT_EQ(Order(*lru), (std::vector<EntryId>{1, 4, 5}));
  seen.clear();
  lru->ForEachCandidate([&](EntryId id) {
    seen.push_back(id);
    return Verdict::kStop;
  });
  EXPECT_EQ(seen, (std::vector<EntryId>{1}));
  EXPECT_EQ(lru->size(), 3u);
  // Evicted ids may be inserted again and are then the newest.
  lru->OnInsert(2);
  EXPECT_EQ(Order(*lru), (std::vector<EntryId>{1, 4, 5, 2}));
}

TEST(LruPolicyTest, EvictingEverything) {
  auto lru = MakeLruPolicy();
  for (EntryId id = 1; id <= 100; ++id) lru->OnInsert(id);
  size_t n = 0;
  lru->ForEachCandidate([&](EntryId) {
    ++n;
    return Verdict::kEvicted;
  });
  EXPECT_EQ(n, 100u);
  EXPECT_EQ(lru->size(), 0u);
  EXPECT_TRUE(Order(*lru).empty());
}

}  // namespace
}  // namespace kvd::l1
