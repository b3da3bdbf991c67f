// object_state.h: every legal transition, once as the pure rule and once through L1Cache,
// and the illegal ones refused.
#include "l1/object_state.h"

#include <gtest/gtest.h>

#include "common/clock.h"
#include "l1/l1_cache.h"
#include "l1_test_util.h"

namespace kvd::l1 {
namespace {

using testing::Key;
using testing::Ns;
using testing::WriteObject;

constexpr uint64_t kPage = 4096;

// --- the rules -------------------------------------------------------------------------------

TEST(SlotStateRules, ExactlyTheDrawnTransitionsAreLegal) {
  struct Legal {
    SlotState from;
    SlotEvent event;
    SlotState to;
  };
  const Legal legal[] = {
      {SlotState::kEmpty, SlotEvent::kReserve, SlotState::kStaging},
      {SlotState::kStaging, SlotEvent::kCommit, SlotState::kResident},
      {SlotState::kStaging, SlotEvent::kAbort, SlotState::kEmpty},
      {SlotState::kStaging, SlotEvent::kReclaim, SlotState::kEmpty},
      {SlotState::kStaging, SlotEvent::kEvict, SlotState::kEvicting},
      {SlotState::kResident, SlotEvent::kEvict, SlotState::kEvicting},
      {SlotState::kEvicting, SlotEvent::kFree, SlotState::kEmpty},
  };
  const SlotState states[] = {SlotState::kEmpty, SlotState::kStaging, SlotState::kResident,
                              SlotState::kEvicting};
  const SlotEvent events[] = {SlotEvent::kReserve, SlotEvent::kCommit, SlotEvent::kAbort,
                              SlotEvent::kReclaim, SlotEvent::kEvict, SlotEvent::kFree};
  int legal_count = 0;
  for (SlotState s : states) {
    for (SlotEvent e : events) {
      std::optional<SlotState> expected;
      for (const Legal& l : legal) {
        if (l.from == s && l.event == e) expected = l.to;
      }
      EXPECT_EQ(NextSlotState(s, e), expected) << SlotStateName(s) << " + " << SlotEventName(e);
      legal_count += expected.has_value();
    }
  }
  EXPECT_EQ(legal_count, 7);
}

TEST(EntryLockRules, FirstLockTakesTheEntryOffTheListAndTheLastPutsItBack) {
  for (auto [begin, end] : {std::pair{LockEvent::kWriteBegin, LockEvent::kWriteEnd},
                            std::pair{LockEvent::kHoldBegin, LockEvent::kHoldEnd},
                            std::pair{LockEvent::kPinBegin, LockEvent::kPinEnd}}) {
    EntryLocks l;
    EXPECT_EQ(l.Apply(begin), ListChange::kBecameLocked) << LockEventName(begin);
    EXPECT_EQ(l.Apply(begin), ListChange::kNone);
    EXPECT_EQ(l.Apply(end), ListChange::kNone);
    EXPECT_EQ(l.Apply(end), ListChange::kBecameEvictable) << LockEventName(end);
    EXPECT_FALSE(l.locked());
    EXPECT_FALSE(l.Apply(end).has_value());  // nothing to end: refused, nothing changes
    EXPECT_FALSE(l.locked());
  }
}

TEST(EntryLockRules, LocksOverlapAndCountsNeverOverflow) {
  EntryLocks l;
  EXPECT_EQ(l.Apply(LockEvent::kHoldBegin), ListChange::kBecameLocked);
  EXPECT_EQ(l.Apply(LockEvent::kPinBegin), ListChange::kNone);
  EXPECT_EQ(l.Apply(LockEvent::kHoldEnd), ListChange::kNone);  // the pin still locks it
  EXPECT_EQ(l.Apply(LockEvent::kPinEnd), ListChange::kBecameEvictable);
  l.holders = EntryLocks::kMax;
  EXPECT_FALSE(l.Apply(LockEvent::kHoldBegin).has_value());
  EXPECT_EQ(l.holders, EntryLocks::kMax);
}

// --- the same transitions through the cache ----------------------------------------------------

class ObjectStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    L1CacheOptions o;
    o.capacity_bytes = 4 * kPage;
    o.clock = &clock_;
    cache_ = std::move(L1Cache::Create(o)).value();
    ASSERT_EQ(Ns(*cache_), 0u);
  }
  SlotState State(const ChunkKey& k, uint32_t slot = 0) {
    auto info = cache_->DescribeSlot(k, slot);
    return info ? info->state : SlotState::kEmpty;
  }
  // True when `k` survives filling the pool with other entries (it is not evictable).
  bool SurvivesPressure(const ChunkKey& k) {
    for (int i = 100; i < 104; ++i) (void)WriteObject(*cache_, Key(i), 1, 0, kPage);
    return cache_->DescribeSlot(k, 0).has_value();
  }
  FakeClock clock_;
  std::unique_ptr<L1Cache> cache_;
};

TEST_F(ObjectStateTest, EmptyReserveStaging) {
  auto r = cache_->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(State(Key(1)), SlotState::kStaging);
  EXPECT_EQ(cache_->stats().staging_objects, 1u);
}

TEST_F(ObjectStateTest, StagingCommitResident) {
  auto r = cache_->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(r.ok() && r->Commit());
  EXPECT_EQ(State(Key(1)), SlotState::kResident);
  EXPECT_EQ(cache_->stats().resident_objects, 1u);
}

TEST_F(ObjectStateTest, StagingAbortEmpty) {
  const ChunkKey k = Key(1, Ns(*cache_, "model", 2));
  ASSERT_TRUE(WriteObject(*cache_, k, 2, 0, kPage).ok());
  auto r = cache_->ReserveWrite(k, 2, 1, kPage);
  ASSERT_TRUE(r.ok());
  r->Abort();
  EXPECT_EQ(State(k, 1), SlotState::kEmpty);
  EXPECT_EQ(cache_->stats().used_bytes, kPage);
}

TEST_F(ObjectStateTest, StagingReclaimEmptyAfterTheWriteLockExpires) {
  auto r = cache_->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(r.ok());
  clock_.AdvanceSeconds(601);
  EXPECT_EQ(cache_->ExpireLocks(), 1u);
  EXPECT_FALSE(cache_->DescribeSlot(Key(1), 0).has_value());  // the emptied entry is gone
  EXPECT_EQ(cache_->stats().used_bytes, 0u);
  EXPECT_EQ(cache_->stats().reclaimed_writes, 1u);
  EXPECT_FALSE(r->Commit());  // the writer learns it lost the slot
}

TEST_F(ObjectStateTest, StagingEvictedByClearIsFreedWhenItsWriterEnds) {
  auto r = cache_->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(r.ok());
  cache_->Clear();  // live write lock: the memory stays the writer's
  EXPECT_EQ(cache_->stats().used_bytes, kPage);
  EXPECT_FALSE(r->Commit());  // EVICTING -> EMPTY: freed now
  EXPECT_EQ(cache_->stats().used_bytes, 0u);
  EXPECT_EQ(cache_->stats().detached_entries, 0u);
}

TEST_F(ObjectStateTest, ResidentEvictFreesTheMemory) {
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(WriteObject(*cache_, Key(i), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache_, Key(9), 1, 0, kPage).ok());  // evicts Key(0)
  EXPECT_FALSE(cache_->DescribeSlot(Key(0), 0).has_value());
  EXPECT_EQ(cache_->stats().evictions, 1u);
  EXPECT_EQ(cache_->stats().used_bytes, 4 * kPage);  // EVICTING -> EMPTY returned the page
}

TEST_F(ObjectStateTest, WriteBeginAndEndMoveTheEntryOffAndOnTheList) {
  const ChunkKey k = Key(1, Ns(*cache_, "model", 2));
  ASSERT_TRUE(WriteObject(*cache_, k, 2, 0, kPage).ok());
  EXPECT_EQ(cache_->stats().locked_entries, 0u);
  auto r = cache_->ReserveWrite(k, 2, 1, kPage);  // WriteBegin
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(cache_->stats().locked_entries, 1u);
  EXPECT_TRUE(SurvivesPressure(k));
  ASSERT_TRUE(r->Commit());  // WriteEnd
  EXPECT_EQ(cache_->stats().locked_entries, 0u);
}

TEST_F(ObjectStateTest, HoldBeginAndEndMoveTheEntryOffAndOnTheList) {
  ASSERT_TRUE(WriteObject(*cache_, Key(1), 1, 0, kPage).ok());
  const ChunkKey k = Key(1);
  ASSERT_EQ(cache_->LookupAndLock("r", 0, {&k, 1}, 1, 1), 1u);  // HoldBegin
  EXPECT_EQ(cache_->stats().locked_entries, 1u);
  EXPECT_TRUE(SurvivesPressure(k));
  cache_->ReleaseLocks("r", 0, 1, 0);  // HoldEnd
  EXPECT_EQ(cache_->stats().locked_entries, 0u);
  EXPECT_FALSE(SurvivesPressure(k));
}

TEST_F(ObjectStateTest, PinBeginAndEndMoveTheEntryOffAndOnTheList) {
  ASSERT_TRUE(WriteObject(*cache_, Key(1), 1, 0, kPage).ok());
  auto pin = cache_->PinForRead(Key(1), 0);  // PinBegin
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(cache_->stats().locked_entries, 1u);
  EXPECT_TRUE(SurvivesPressure(Key(1)));
  pin->Release();  // PinEnd
  EXPECT_EQ(cache_->stats().locked_entries, 0u);
  EXPECT_FALSE(SurvivesPressure(Key(1)));
}

TEST_F(ObjectStateTest, IllegalRequestsChangeNothing) {
  ASSERT_TRUE(WriteObject(*cache_, Key(1), 1, 0, kPage).ok());
  // RESIDENT + Reserve is not a transition: the object is never overwritten.
  EXPECT_EQ(cache_->ReserveWrite(Key(1), 1, 0, kPage).status().code(),
            StatusCode::kAlreadyExists);
  // STAGING is not readable: no PinBegin on it.
  auto r = cache_->ReserveWrite(Key(2), 1, 0, kPage);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(cache_->PinForRead(Key(2), 0).status().code(), StatusCode::kNotFound);
  // A HoldEnd nobody began is ignored.
  cache_->ReleaseLocks("nobody", 0, 1, 0);
  EXPECT_EQ(cache_->DescribeSlot(Key(1), 0)->read_locks, 0u);
  EXPECT_EQ(State(Key(1)), SlotState::kResident);
  EXPECT_EQ(State(Key(2)), SlotState::kStaging);
}

}  // namespace
}  // namespace kvd::l1
