// TierSet's small parts on their own: PrefetchedChunks (the default prefetch policy's chunks
// leave L1 once idle) and SkipL1Chunks (a chunk leaves L1 once tiers hold every rank's
// object). The TierSet tests cover them through the composer.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "l2/prefetched_chunks.h"
#include "l2/skip_l1_chunks.h"

namespace kvd::l2 {
namespace {

constexpr uint64_t kObj = 4096;

class TierSetPartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    l1::L1CacheOptions o;
    o.capacity_bytes = 4ull << 20;
    o.clock = &clock_;
    l1_ = std::move(l1::L1Cache::Create(o)).value();
    ns_ = std::move(l1_->namespaces().Intern("m", 2, "")).value();
  }
  l1::ChunkKey Chunk(uint8_t i) {
    l1::ChunkKey k;
    k.ns = ns_;
    k.chunk_hash[0] = i;
    return k;
  }
  // Writes every rank of chunk i.
  void Write(uint8_t i, uint32_t ranks = 2) {
    for (uint32_t r = 0; r < ranks; ++r) {
      auto res = l1_->ReserveWrite(Chunk(i), 2, r, kObj);
      ASSERT_TRUE(res.ok());
      ASSERT_TRUE(res->Commit());
    }
  }
  bool Resident(uint8_t i) { return l1_->IsResident(Chunk(i), 0); }
  CommittedObject Object(uint8_t i, uint32_t slot) {
    CommittedObject o;
    o.chunk = Chunk(i);
    o.num_slots = 2;
    o.slot = slot;
    return o;
  }

  FakeClock clock_;
  std::unique_ptr<l1::L1Cache> l1_;
  l1::NamespaceId ns_ = 0;
};

TEST_F(TierSetPartsTest, PrefetchedChunksLeaveAfterTheirRetrieveOrTheGracePeriod) {
  PrefetchedChunks p(l1_.get(), &clock_);
  Write(1);
  Write(2);
  Write(3);
  const std::vector<l1::ChunkKey> added = {Chunk(1), Chunk(2)};
  p.Add(added);
  EXPECT_EQ(p.size(), 2u);
  // A retrieve read chunk 1 (and 3, which no prefetch brought): only 1 leaves.
  const std::vector<l1::ChunkKey> read = {Chunk(1), Chunk(3)};
  p.AfterRetrieve(read);
  EXPECT_FALSE(Resident(1));
  EXPECT_TRUE(Resident(3));
  EXPECT_EQ(p.size(), 1u);
  // Chunk 2, idle: a sweep within the grace period does not touch it...
  p.Sweep();
  EXPECT_TRUE(Resident(2));
  // ...one after it keeps it while it is read-locked...
  const std::vector<l1::ChunkKey> two = {Chunk(2)};
  ASSERT_EQ(l1_->LookupAndLock("req", 0, two, 2, 1), 1u);
  clock_.AdvanceSeconds(3);
  p.Sweep();
  EXPECT_TRUE(Resident(2));
  EXPECT_EQ(p.size(), 1u);
  // ...and removes it once idle.
  l1_->ReleaseAllLocks("req");
  p.Sweep();
  EXPECT_FALSE(Resident(2));
  EXPECT_EQ(p.size(), 0u);
}

TEST_F(TierSetPartsTest, SkipL1ChunkLeavesOnceEveryRankIsHeld) {
  SkipL1Chunks s(l1_.get());
  Write(1);
  Write(2);
  std::atomic<bool> yes[1] = {true};
  std::atomic<bool> no[1] = {false};
  s.Stored({Object(1, 0)}, yes);
  s.Stored({Object(2, 0)}, no);  // not held by any tier: not recorded
  EXPECT_TRUE(Resident(1));
  EXPECT_EQ(s.waiting(), 1u);
  // Rank 1 held while chunk 1 is read-locked: recorded complete, removed by a later sweep.
  const std::vector<l1::ChunkKey> one = {Chunk(1)};
  ASSERT_EQ(l1_->LookupAndLock("req", 0, one, 2, 1), 1u);
  s.Stored({Object(1, 1)}, yes);
  EXPECT_TRUE(Resident(1));
  EXPECT_EQ(s.removed(), 0u);
  l1_->ReleaseAllLocks("req");
  s.Sweep();
  EXPECT_FALSE(Resident(1));
  EXPECT_EQ(s.removed(), 1u);
  EXPECT_EQ(s.waiting(), 0u);
  EXPECT_TRUE(Resident(2));
}

TEST_F(TierSetPartsTest, SkipL1RecordOfAChunkL1LetGoIsDropped) {
  SkipL1Chunks s(l1_.get());
  Write(1);
  std::atomic<bool> yes[1] = {true};
  s.Stored({Object(1, 0)}, yes);  // half held
  EXPECT_EQ(s.waiting(), 1u);
  l1_->Clear();
  s.Sweep();
  EXPECT_EQ(s.waiting(), 0u);
  EXPECT_EQ(s.removed(), 0u);
}

}  // namespace
}  // namespace kvd::l2
