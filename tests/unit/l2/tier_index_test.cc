// TierIndex: a capacity tier's objects in eviction order (an eviction::EvictionPolicy), with
// loads in progress and planned deletes held out of the candidates.
#include "l2/tier_index.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace kvd::l2 {
namespace {

using Ids = std::vector<std::string>;

TEST(TierIndexTest, PlansTheLeastRecentlyUsedFirstUpToTheTarget) {
  TierIndex index;
  index.Account("a", 10);
  index.Account("b", 10);
  index.Account("c", 10);
  index.Account("a", 99);  // written again: touched, size unchanged
  EXPECT_EQ(index.usage(), 30u);
  EXPECT_EQ(index.PlanVictims(15), (Ids{"b", "c"}));
  EXPECT_EQ(index.PlanVictims(100), (Ids{"a"}));  // planned ones are not offered again
  EXPECT_TRUE(index.PlanVictims(100).empty());
}

TEST(TierIndexTest, ABusyObjectIsNeverPlannedAndIsMostRecentWhenTheLoadEnds) {
  TierIndex index;
  index.Account("a", 1);
  index.Account("b", 1);
  index.Account("c", 1);
  index.Busy("a", +1);
  index.Busy("a", +1);  // two loads
  EXPECT_EQ(index.PlanVictims(1), (Ids{"b"}));
  index.Busy("a", -1);
  EXPECT_EQ(index.PlanVictims(1), (Ids{"c"}));  // one load still reads a
  index.Busy("a", -1);
  EXPECT_EQ(index.PlanVictims(1), (Ids{"a"}));
}

TEST(TierIndexTest, ObjectsOfEarlierRunsGoFirstOldestFirst) {
  TierIndex index;
  index.Account("new1", 5);
  index.Account("new2", 5);
  index.Busy("new2", +1);
  // The scan lists new1 too (this run wrote it): it keeps its place and is not counted twice.
  EXPECT_EQ(index.AddOlder({{"old1", 7}, {"new1", 5}, {"old2", 7}}), 14u);
  EXPECT_EQ(index.usage(), 24u);
  EXPECT_EQ(index.size(), 4u);
  EXPECT_EQ(index.PlanVictims(100), (Ids{"old1", "old2", "new1"}));  // new2 is busy
  index.Busy("new2", -1);
  EXPECT_EQ(index.PlanVictims(100), (Ids{"new2"}));
}

TEST(TierIndexTest, AFailedDeleteMakesTheObjectACandidateAgainAndRemoveForgetsIt) {
  TierIndex index;
  index.Account("a", 3);
  index.Account("b", 4);
  ASSERT_EQ(index.PlanVictims(7), (Ids{"a", "b"}));
  index.Unplan("a");  // its delete failed
  EXPECT_EQ(index.Remove("b"), 4u);
  EXPECT_EQ(index.Remove("b"), 0u);
  EXPECT_EQ(index.usage(), 3u);
  EXPECT_FALSE(index.contains("b"));
  EXPECT_EQ(index.PlanVictims(1), (Ids{"a"}));
  // A planned object a load started on meanwhile: the delete decides.
  index.Busy("a", +1);
  EXPECT_EQ(index.Remove("a"), 3u);
  index.Busy("a", -1);  // the load ends after: nothing to do
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.usage(), 0u);
  // Slots are reused.
  index.Account("c", 1);
  EXPECT_EQ(index.PlanVictims(1), (Ids{"c"}));
}

// Issue 24: the blend matcher is told when the last copy of a chunk's object leaves the
// tiers, so the index knows which chunk slot each object holds.
TEST(TierIndexTest, KnowsWhichChunkSlotsItsObjectsHoldUntilTheLastLeaves) {
  l1::ChunkKey chunk;
  chunk.ns = 3;
  chunk.chunk_hash[0] = 7;
  const ChunkSlot s0{chunk, 0}, s1{chunk, 1};
  TierIndex index;
  index.Account("scanned", 1);          // only a scan saw it: no slot
  index.Account("rank0", 1, &s0);
  index.Account("rank0-other-layout", 1, &s0);
  index.Account("rank1", 1);            // written without a slot...
  EXPECT_FALSE(index.holds(s1));
  index.Account("rank1", 1, &s1);       // ...then found for chunk slot 1
  EXPECT_TRUE(index.holds(s0));
  EXPECT_TRUE(index.holds(s1));
  index.Account("rank1", 1, &s0);       // the first slot named is kept
  std::optional<ChunkSlot> gone;
  EXPECT_EQ(index.Remove("rank0", &gone), 1u);
  EXPECT_EQ(gone, s0);
  EXPECT_TRUE(index.holds(s0)) << "the other layout's object still holds slot 0";
  index.Remove("rank0-other-layout", &gone);
  EXPECT_EQ(gone, s0);
  EXPECT_FALSE(index.holds(s0));
  index.Remove("scanned", &gone);
  EXPECT_FALSE(gone.has_value());
  index.Remove("rank1", &gone);
  EXPECT_EQ(gone, s1);
  EXPECT_FALSE(index.holds(s1));
  // A reused entry does not inherit the slot of the object it replaced.
  index.Account("fresh", 1);
  index.Remove("fresh", &gone);
  EXPECT_FALSE(gone.has_value());
}

TEST(TierIndexTest, TakesAnyPolicyOfTheEvictionModule) {
  TierIndex arc("ARC");  // any policy that needs no quotas
  arc.Account("x", 1);
  EXPECT_EQ(arc.PlanVictims(1), (Ids{"x"}));
}

}  // namespace
}  // namespace kvd::l2
