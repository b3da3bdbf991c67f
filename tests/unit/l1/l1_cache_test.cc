// L1Cache: the slot state machine, locks, pins, eviction and stats, driven by a FakeClock.
// Sizes are in pages (4096 bytes, the pool's granularity) so that "the pool holds N objects"
// is exact.
#include "l1/l1_cache.h"

#include <array>
#include <chrono>
#include <thread>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "l1/eviction_thread.h"
#include "l1_test_util.h"

namespace kvd::l1 {
namespace {

using testing::CheckPattern;
using testing::FillPattern;
using testing::Key;
using testing::WriteObject;

constexpr uint64_t kPage = 4096;

class L1CacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<L1Cache> Make(uint64_t pages, double watermark = 0.8, double ratio = 0.2) {
    L1CacheOptions options;
    options.capacity_bytes = pages * kPage;
    options.read_ttl_seconds = 300;
    options.write_ttl_seconds = 600;
    options.eviction_watermark = watermark;
    options.eviction_ratio = ratio;
    options.clock = &clock_;
    auto cache = L1Cache::Create(options);
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    return cache.ok() ? std::move(cache).value() : nullptr;
  }

  size_t Lookup(L1Cache& cache, std::vector<ChunkKey> keys, uint32_t num_slots = 1,
                uint32_t locks = 0) {
    return cache.LookupPrefixAndLock(keys, num_slots, locks);
  }

  FakeClock clock_;
};

TEST_F(L1CacheTest, CreateValidatesOptions) {
  L1CacheOptions options;
  options.capacity_bytes = 16 * kPage;
  EXPECT_EQ(L1Cache::Create(options).status().code(), StatusCode::kInvalidArgument);  // no clock
  options.clock = &clock_;
  options.eviction_watermark = 1.5;
  EXPECT_EQ(L1Cache::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.eviction_watermark = 0.8;
  options.eviction_ratio = 0;
  EXPECT_EQ(L1Cache::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.eviction_ratio = 0.2;
  options.read_ttl_seconds = 0;
  EXPECT_EQ(L1Cache::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.read_ttl_seconds = 300;
  options.capacity_bytes = 0;
  EXPECT_EQ(L1Cache::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.capacity_bytes = 16 * kPage;
  auto ok = L1Cache::Create(options);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->capacity_bytes(), 16 * kPage);
  EXPECT_NE((*ok)->base(), nullptr);
  EXPECT_TRUE((*ok)->shm_name().empty());
  EXPECT_STREQ((*ok)->policy_name(), "lru");
}

TEST_F(L1CacheTest, WriteCommitLookupHitAndRead) {
  auto cache = Make(16);
  const ChunkKey k = Key(1);
  auto res = cache->ReserveWrite(k, 1, 0, 5000);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_TRUE(res->valid());
  EXPECT_EQ(res->size(), 5000u);
  EXPECT_EQ(res->offset() % kPage, 0u);
  EXPECT_EQ(res->data(), cache->base() + res->offset());
  FillPattern(res->data(), res->size(), k, 0);
  EXPECT_TRUE(res->Commit());
  EXPECT_FALSE(res->valid());
  EXPECT_FALSE(res->Commit());  // second commit on an empty handle

  EXPECT_TRUE(cache->IsResident(k, 0));
  EXPECT_EQ(Lookup(*cache, {k}), 1u);
  auto pin = cache->PinForRead(k, 0);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(pin->size(), 5000u);
  EXPECT_TRUE(CheckPattern(pin->data(), pin->size(), k, 0));
}

TEST_F(L1CacheTest, StagingIsInvisible) {
  auto cache = Make(16);
  const ChunkKey k = Key(1);
  auto res = cache->ReserveWrite(k, 1, 0, kPage);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(Lookup(*cache, {k}, 1, 1), 0u);
  EXPECT_FALSE(cache->IsResident(k, 0));
  EXPECT_EQ(cache->PinForRead(k, 0).status().code(), StatusCode::kNotFound);
  auto info = cache->DescribeSlot(k, 0);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->state, SlotState::kStaging);
  EXPECT_TRUE(info->write_lock_live);
  EXPECT_EQ(info->read_locks, 0u);  // a miss takes no lock
  ASSERT_TRUE(res->Commit());
  EXPECT_EQ(Lookup(*cache, {k}), 1u);
}

TEST_F(L1CacheTest, PartialEntryIsAMiss) {
  auto cache = Make(16);
  const ChunkKey k = Key(1, "model", 2);
  ASSERT_TRUE(WriteObject(*cache, k, 4, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, k, 4, 1, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, k, 4, 3, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {k}, 4), 0u);
  ASSERT_TRUE(WriteObject(*cache, k, 4, 2, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {k}, 4), 1u);
  // The same chunk asked with another slot count is a miss, not a crash.
  EXPECT_EQ(Lookup(*cache, {k}, 2), 0u);
}

TEST_F(L1CacheTest, SlotArgumentsAreValidated) {
  auto cache = Make(16);
  const ChunkKey k = Key(1);
  EXPECT_EQ(cache->ReserveWrite(k, 0, 0, kPage).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->ReserveWrite(k, 2, 2, kPage).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->ReserveWrite(k, L1Cache::kMaxSlotsPerEntry + 1, 0, kPage).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  EXPECT_EQ(cache->ReserveWrite(k, 3, 1, kPage).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->PinForRead(k, 5).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(cache->IsResident(k, 5));
  EXPECT_FALSE(cache->DescribeSlot(k, 5));
  cache->ReleaseReadLocks(k, 5, 1);        // ignored
  cache->ReleaseReadLocks(Key(99), 0, 1);  // ignored
  EXPECT_EQ(cache->stats().entries, 1u);
}

TEST_F(L1CacheTest, PrefixStopsAtFirstMissAndLocksOnlyHits) {
  auto cache = Make(16);
  for (int i : {0, 1, 3}) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {Key(0), Key(1), Key(2), Key(3)}, 1, 1), 2u);
  EXPECT_EQ(cache->DescribeSlot(Key(0), 0)->read_locks, 1u);
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->read_locks, 1u);
  EXPECT_EQ(cache->DescribeSlot(Key(3), 0)->read_locks, 0u);
  EXPECT_EQ(Lookup(*cache, {Key(2), Key(0)}), 0u);
  EXPECT_EQ(Lookup(*cache, {}), 0u);
}

TEST_F(L1CacheTest, ResidentObjectIsNeverOverwritten) {
  auto cache = Make(16);
  const ChunkKey k = Key(1);
  ASSERT_TRUE(WriteObject(*cache, k, 1, 0, kPage).ok());
  const uint64_t used = cache->stats().used_bytes;
  auto again = cache->ReserveWrite(k, 1, 0, kPage);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cache->stats().used_bytes, used);
  auto pin = cache->PinForRead(k, 0);
  ASSERT_TRUE(pin.ok());
  EXPECT_TRUE(CheckPattern(pin->data(), pin->size(), k, 0));
  EXPECT_EQ(cache->stats().write_conflicts, 1u);
}

TEST_F(L1CacheTest, SecondWriterOfAStagingSlotGetsAlreadyExists) {
  auto cache = Make(16);
  const ChunkKey k = Key(1);
  auto first = cache->ReserveWrite(k, 1, 0, kPage);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(cache->ReserveWrite(k, 1, 0, kPage).status().code(), StatusCode::kAlreadyExists);
  clock_.AdvanceSeconds(599);  // still within the write TTL
  EXPECT_EQ(cache->ReserveWrite(k, 1, 0, kPage).status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(first->Commit());
}

TEST_F(L1CacheTest, AbortFreesMemoryAndRemovesEmptyEntry) {
  auto cache = Make(16);
  const ChunkKey k = Key(1);
  {
    auto res = cache->ReserveWrite(k, 1, 0, 3 * kPage);
    ASSERT_TRUE(res.ok());
    EXPECT_EQ(cache->stats().used_bytes, 3 * kPage);
    EXPECT_EQ(cache->stats().staging_objects, 1u);
  }  // destroyed without Commit
  L1Stats st = cache->stats();
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.aborts, 1u);
  EXPECT_FALSE(cache->DescribeSlot(k, 0));

  // With another resident slot the entry stays, only the aborted slot is freed.
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  auto res = cache->ReserveWrite(k, 2, 1, kPage);
  ASSERT_TRUE(res.ok());
  res->Abort();
  EXPECT_FALSE(res->valid());
  st = cache->stats();
  EXPECT_EQ(st.used_bytes, kPage);
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(cache->DescribeSlot(k, 1)->state, SlotState::kEmpty);
  // The slot can be written again.
  EXPECT_TRUE(WriteObject(*cache, k, 2, 1, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {k}, 2), 1u);
}

TEST_F(L1CacheTest, MoveAssignmentAbortsTheOverwrittenReservation) {
  auto cache = Make(16);
  auto a = cache->ReserveWrite(Key(1), 1, 0, kPage);
  auto b = cache->ReserveWrite(Key(2), 1, 0, kPage);
  ASSERT_TRUE(a.ok() && b.ok());
  WriteReservation moved = std::move(a).value();
  EXPECT_TRUE(moved.valid());
  moved = std::move(b).value();  // Key(1)'s reservation is aborted
  EXPECT_FALSE(cache->DescribeSlot(Key(1), 0));
  EXPECT_EQ(cache->stats().used_bytes, kPage);
  EXPECT_TRUE(moved.Commit());
  EXPECT_TRUE(cache->IsResident(Key(2), 0));
}

TEST_F(L1CacheTest, EvictsLeastRecentlyUsedAndTouchRefreshes) {
  auto cache = Make(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  std::vector<ChunkKey> touch = {Key(0)};
  cache->Touch(touch);  // order now 1, 2, 3, 0
  ASSERT_TRUE(WriteObject(*cache, Key(10), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(1), 0));
  EXPECT_TRUE(cache->IsResident(Key(0), 0));
  // A lookup hit also refreshes: 2 becomes the newest, so 3 goes next.
  EXPECT_EQ(Lookup(*cache, {Key(2)}), 1u);
  ASSERT_TRUE(WriteObject(*cache, Key(11), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(3), 0));
  EXPECT_TRUE(cache->IsResident(Key(2), 0));
  EXPECT_TRUE(cache->IsResident(Key(0), 0));
  // A two-page object evicts the two oldest (0, then 10).
  ASSERT_TRUE(WriteObject(*cache, Key(12), 1, 0, 2 * kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(0), 0));
  EXPECT_FALSE(cache->IsResident(Key(10), 0));
  EXPECT_TRUE(cache->IsResident(Key(2), 0));
  EXPECT_TRUE(cache->IsResident(Key(11), 0));
  EXPECT_EQ(cache->stats().evictions, 4u);
}

TEST_F(L1CacheTest, EvictionRemovesWholeEntries) {
  auto cache = Make(4);
  const ChunkKey k = Key(1, "model", 2);
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, k, 2, 1, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(3), 1, 0, 2 * kPage).ok());  // evicts k (2 pages)
  EXPECT_FALSE(cache->DescribeSlot(k, 0));
  EXPECT_FALSE(cache->DescribeSlot(k, 1));
  EXPECT_TRUE(cache->IsResident(Key(2), 0));
  EXPECT_EQ(cache->stats().used_bytes, 3 * kPage);
}

TEST_F(L1CacheTest, ReadLockedEntriesAreNotEvicted) {
  auto cache = Make(4);
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(Key(i));
    ASSERT_TRUE(WriteObject(*cache, keys.back(), 1, 0, kPage).ok());
  }
  EXPECT_EQ(cache->LookupPrefixAndLock(keys, 1, 1), 4u);
  EXPECT_EQ(cache->stats(true).locked_entries, 4u);
  auto res = cache->ReserveWrite(Key(10), 1, 0, kPage);
  EXPECT_EQ(res.status().code(), StatusCode::kResourceExhausted);
  L1Stats st = cache->stats();
  EXPECT_EQ(st.entries, 4u);  // the entry this call would have created is not left behind
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(st.write_exhausted, 1u);

  cache->ReleaseReadLocks(Key(2), 0, 1);
  ASSERT_TRUE(WriteObject(*cache, Key(10), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(2), 0));  // the only unlocked one, though not the oldest
  for (int i : {0, 1, 3}) EXPECT_TRUE(cache->IsResident(Key(i), 0));
}

TEST_F(L1CacheTest, ReadLocksAreCappedAndNeverNegative) {
  auto cache = Make(4);
  const ChunkKey k = Key(1);
  ASSERT_TRUE(WriteObject(*cache, k, 1, 0, kPage).ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(Lookup(*cache, {k}, 1, 2), 1u);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, L1Cache::kMaxReadLocksPerSlot);
  cache->ReleaseReadLocks(k, 0, L1Cache::kMaxReadLocksPerSlot - 1);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 1u);
  EXPECT_EQ(cache->stats(true).locked_entries, 1u);
  cache->ReleaseReadLocks(k, 0, 5);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 0u);
  EXPECT_EQ(cache->stats(true).locked_entries, 0u);
  // Lookup without locks takes none.
  EXPECT_EQ(Lookup(*cache, {k}, 1, 0), 1u);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 0u);
}

TEST_F(L1CacheTest, ReleaseReadLocksAllSlots) {
  auto cache = Make(8);
  const ChunkKey a = Key(1, "model", 2);
  const ChunkKey b = Key(2, "model", 2);
  for (const ChunkKey& k : {a, b}) {
    for (uint32_t s = 0; s < 2; ++s) ASSERT_TRUE(WriteObject(*cache, k, 2, s, kPage).ok());
  }
  std::vector<ChunkKey> keys = {a, b, Key(77)};
  EXPECT_EQ(cache->LookupPrefixAndLock(keys, 2, 3), 2u);
  cache->ReleaseReadLocksAllSlots(keys, 2);
  for (const ChunkKey& k : {a, b}) {
    for (uint32_t s = 0; s < 2; ++s) EXPECT_EQ(cache->DescribeSlot(k, s)->read_locks, 1u);
  }
  cache->ReleaseReadLocksAllSlots(keys, 10);
  EXPECT_EQ(cache->stats(true).locked_entries, 0u);
}

TEST_F(L1CacheTest, ExpiredReadLocksCountAsZero) {
  auto cache = Make(2);
  ASSERT_TRUE(WriteObject(*cache, Key(0), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(1), 1, 0, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {Key(0), Key(1)}, 1, 1), 2u);
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, kPage).status().code(),
            StatusCode::kResourceExhausted);
  clock_.AdvanceSeconds(299);
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, kPage).status().code(),
            StatusCode::kResourceExhausted);
  // A lookup refreshes Key(1)'s expiry; Key(0)'s lock then lapses first.
  EXPECT_EQ(Lookup(*cache, {Key(1)}, 1, 1), 1u);
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->read_locks, 2u);
  clock_.AdvanceSeconds(2);
  EXPECT_EQ(cache->DescribeSlot(Key(0), 0)->read_locks, 0u);
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->read_locks, 2u);
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(0), 0));
  EXPECT_TRUE(cache->IsResident(Key(1), 0));
  // A new lock on an entry whose old locks expired starts from zero.
  clock_.AdvanceSeconds(301);
  EXPECT_EQ(Lookup(*cache, {Key(1)}, 1, 1), 1u);
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->read_locks, 1u);
}

TEST_F(L1CacheTest, ExpiredWriteLockLetsAnotherWriterReclaim) {
  auto cache = Make(4);
  const ChunkKey k = Key(1);
  auto dead = cache->ReserveWrite(k, 1, 0, kPage);
  ASSERT_TRUE(dead.ok());
  clock_.AdvanceSeconds(601);
  EXPECT_FALSE(cache->DescribeSlot(k, 0)->write_lock_live);
  auto fresh = cache->ReserveWrite(k, 1, 0, 2 * kPage);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(cache->stats().used_bytes, 2 * kPage);  // the dead writer's page was freed
  EXPECT_EQ(cache->stats().reclaimed_writes, 1u);
  FillPattern(fresh->data(), fresh->size(), k, 0);
  EXPECT_FALSE(dead->Commit());  // lost its slot: fails safely
  EXPECT_EQ(cache->DescribeSlot(k, 0)->state, SlotState::kStaging);
  EXPECT_TRUE(fresh->Commit());
  dead = Result<WriteReservation>(WriteReservation());  // destroying the old handle: no double free
  EXPECT_EQ(cache->stats().used_bytes, 2 * kPage);
  auto pin = cache->PinForRead(k, 0);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(pin->size(), 2 * kPage);
  EXPECT_TRUE(CheckPattern(pin->data(), pin->size(), k, 0));
}

TEST_F(L1CacheTest, ReclaimFailureDoesNotLeaveAnEmptyEntry) {
  auto cache = Make(2);
  const ChunkKey k = Key(1);
  auto dead = cache->ReserveWrite(k, 1, 0, kPage);
  ASSERT_TRUE(dead.ok());
  clock_.AdvanceSeconds(601);
  // Reclaiming works, but the new size does not fit: the entry must not stay behind empty.
  EXPECT_EQ(cache->ReserveWrite(k, 1, 0, 3 * kPage).status().code(),
            StatusCode::kResourceExhausted);
  L1Stats st = cache->stats();
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.detached_entries, 1u);  // still referenced by the dead writer's handle
  dead->Abort();
  EXPECT_EQ(cache->stats().detached_entries, 0u);
}

TEST_F(L1CacheTest, LiveStagingBlocksEvictionExpiredStagingDoesNot) {
  auto cache = Make(2);
  auto writer = cache->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_EQ(cache->stats(true).locked_entries, 1u);
  ASSERT_TRUE(WriteObject(*cache, Key(3), 1, 0, kPage).ok());  // evicts Key(2), not the writer
  EXPECT_FALSE(cache->IsResident(Key(2), 0));
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->state, SlotState::kStaging);

  clock_.AdvanceSeconds(601);
  ASSERT_TRUE(WriteObject(*cache, Key(4), 1, 0, 2 * kPage).ok());  // evicts both
  EXPECT_FALSE(cache->DescribeSlot(Key(1), 0));
  EXPECT_EQ(cache->stats().used_bytes, 2 * kPage);
  EXPECT_FALSE(writer->Commit());
  EXPECT_EQ(cache->stats().used_bytes, 2 * kPage);
  EXPECT_EQ(cache->stats().detached_entries, 0u);
}

// Issue 11 finding 2 (stale device copies): a reservation whose engine copy is still in
// flight keeps its memory past the write TTL — no reclaim, no eviction, no Clear — so a late
// copy never lands in another object's bytes.
TEST_F(L1CacheTest, Finding2CopyInFlightOutlivesTheWriteTtl) {
  auto cache = Make(2);
  const ChunkKey k = Key(1);
  auto copying = cache->ReserveWrite(k, 1, 0, kPage);
  ASSERT_TRUE(copying.ok());
  ASSERT_TRUE(copying->MarkCopyInFlight());
  ASSERT_TRUE(copying->MarkCopyInFlight());  // idempotent
  EXPECT_EQ(cache->stats().copies_in_flight, 1u);
  clock_.AdvanceSeconds(100000);
  auto info = cache->DescribeSlot(k, 0);
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->write_lock_live);
  EXPECT_TRUE(info->copy_in_flight);
  // Another writer of the same slot cannot reclaim it ...
  EXPECT_EQ(cache->ReserveWrite(k, 1, 0, kPage).status().code(), StatusCode::kAlreadyExists);
  // ... allocation pressure cannot evict it ...
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_EQ(cache->ReserveWrite(Key(3), 1, 0, 2 * kPage).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_FALSE(cache->IsResident(Key(2), 0));  // evicted trying; the copy's slot stayed
  EXPECT_EQ(cache->stats(true).locked_entries, 1u);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->state, SlotState::kStaging);
  // ... and Clear keeps its memory until the copy reports back.
  cache->Clear();
  EXPECT_EQ(cache->stats().used_bytes, kPage);
  for (int i = 10; i < 12; ++i) {
    auto other = cache->ReserveWrite(Key(i), 1, 0, kPage);
    if (!other.ok()) continue;
    EXPECT_TRUE(other->offset() + other->size() <= copying->offset() ||
                copying->offset() + copying->size() <= other->offset());
  }
  FillPattern(copying->data(), copying->size(), k, 0);  // the late copy: its own bytes only
  EXPECT_FALSE(copying->Commit());                     // cleared meanwhile: discarded
  L1Stats st = cache->stats();
  EXPECT_EQ(st.copies_in_flight, 0u);
  EXPECT_EQ(st.detached_entries, 0u);
}

TEST_F(L1CacheTest, Finding2CopyInFlightCommitsAndAbortsLikeAnyReservation) {
  auto cache = Make(4);
  auto a = cache->ReserveWrite(Key(1), 1, 0, kPage);
  auto b = cache->ReserveWrite(Key(2), 1, 0, kPage);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->MarkCopyInFlight());
  ASSERT_TRUE(b->MarkCopyInFlight());
  clock_.AdvanceSeconds(601);
  FillPattern(a->data(), a->size(), Key(1), 0);
  EXPECT_TRUE(a->Commit());  // committed after the TTL: the copy held the slot throughout
  b->Abort();
  L1Stats st = cache->stats();
  EXPECT_EQ(st.copies_in_flight, 0u);
  EXPECT_EQ(st.used_bytes, kPage);
  auto pin = cache->PinForRead(Key(1), 0);
  ASSERT_TRUE(pin.ok());
  EXPECT_TRUE(CheckPattern(pin->data(), pin->size(), Key(1), 0));
}

TEST_F(L1CacheTest, Finding2MarkingAReclaimedReservationFails) {
  auto cache = Make(4);
  auto dead = cache->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(dead.ok());
  clock_.AdvanceSeconds(601);
  auto fresh = cache->ReserveWrite(Key(1), 1, 0, kPage);  // reclaims the expired slot
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(dead->MarkCopyInFlight());  // not its memory any more: do not copy
  EXPECT_EQ(cache->stats().copies_in_flight, 0u);
  EXPECT_FALSE(WriteReservation().MarkCopyInFlight());
}

TEST_F(L1CacheTest, TooLargeObjectFailsWithoutEvicting) {
  auto cache = Make(4);
  ASSERT_TRUE(WriteObject(*cache, Key(1), 1, 0, kPage).ok());
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, 5 * kPage).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(cache->IsResident(Key(1), 0));
  EXPECT_EQ(cache->stats().evictions, 0u);
}

TEST_F(L1CacheTest, PinsBlockEviction) {
  auto cache = Make(2);
  ASSERT_TRUE(WriteObject(*cache, Key(0), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(1), 1, 0, kPage).ok());
  auto pin = cache->PinForRead(Key(0), 0);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(cache->DescribeSlot(Key(0), 0)->pins, 1u);
  clock_.AdvanceSeconds(100000);  // pins never expire
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_TRUE(cache->IsResident(Key(0), 0));
  EXPECT_FALSE(cache->IsResident(Key(1), 0));
  EXPECT_EQ(cache->ReserveWrite(Key(3), 1, 0, 2 * kPage).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckPattern(pin->data(), pin->size(), Key(0), 0));
  ReadPin moved = std::move(pin).value();
  moved.Release();
  EXPECT_EQ(cache->DescribeSlot(Key(0), 0)->pins, 0u);
  ASSERT_TRUE(WriteObject(*cache, Key(3), 1, 0, 2 * kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(0), 0));
}

TEST_F(L1CacheTest, ClearDefersPinnedMemoryUntilUnpin) {
  auto cache = Make(8);
  const ChunkKey k = Key(1, "model", 2);
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, k, 2, 1, 2 * kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  auto pin = cache->PinForRead(k, 1);
  ASSERT_TRUE(pin.ok());

  cache->Clear();
  L1Stats st = cache->stats();
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.detached_entries, 1u);
  EXPECT_EQ(st.used_bytes, 2 * kPage);  // only the pinned slot's memory is kept
  EXPECT_EQ(st.pinned_objects, 1u);
  EXPECT_EQ(Lookup(*cache, {k}, 2), 0u);
  EXPECT_EQ(cache->PinForRead(k, 1).status().code(), StatusCode::kNotFound);

  // New writes fill the rest of the pool but never land on the pinned bytes.
  for (int i = 10; i < 16; ++i) {
    auto res = cache->ReserveWrite(Key(i), 1, 0, kPage);
    ASSERT_TRUE(res.ok()) << i;
    EXPECT_TRUE(res->offset() + res->size() <= pin->offset() ||
                pin->offset() + pin->size() <= res->offset());
    FillPattern(res->data(), res->size(), Key(i), 0);
    ASSERT_TRUE(res->Commit());
  }
  EXPECT_EQ(cache->stats().used_bytes, 8 * kPage);
  EXPECT_EQ(cache->stats().evictions, 0u);
  EXPECT_TRUE(CheckPattern(pin->data(), pin->size(), k, 1));

  pin = Result<ReadPin>(ReadPin());  // drop the pin
  st = cache->stats();
  EXPECT_EQ(st.detached_entries, 0u);
  EXPECT_EQ(st.pinned_objects, 0u);
  EXPECT_EQ(st.used_bytes, 6 * kPage);
  ASSERT_TRUE(WriteObject(*cache, Key(16), 1, 0, 2 * kPage).ok());  // fits in the freed pages
  EXPECT_EQ(cache->stats().evictions, 0u);
}

TEST_F(L1CacheTest, CommitAfterClearFailsSafely) {
  auto cache = Make(8);
  auto live = cache->ReserveWrite(Key(1), 1, 0, kPage);
  auto aborted = cache->ReserveWrite(Key(2), 1, 0, kPage);
  ASSERT_TRUE(live.ok() && aborted.ok());
  cache->Clear();
  EXPECT_EQ(cache->stats().used_bytes, 2 * kPage);  // live writers keep their memory
  EXPECT_EQ(cache->stats().detached_entries, 2u);
  FillPattern(live->data(), live->size(), Key(1), 0);
  EXPECT_FALSE(live->Commit());
  aborted->Abort();
  L1Stats st = cache->stats();
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.detached_entries, 0u);
  EXPECT_EQ(st.entries, 0u);
  EXPECT_FALSE(cache->IsResident(Key(1), 0));
}

TEST_F(L1CacheTest, ClearFreesExpiredStagingAtOnce) {
  auto cache = Make(8);
  auto dead = cache->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(dead.ok());
  clock_.AdvanceSeconds(601);
  cache->Clear();
  EXPECT_EQ(cache->stats().used_bytes, 0u);
  EXPECT_FALSE(dead->Commit());
  EXPECT_EQ(cache->stats().used_bytes, 0u);
  EXPECT_EQ(cache->stats().detached_entries, 0u);
}

TEST_F(L1CacheTest, WatermarkEvictionFreesAboutTheRatio) {
  auto cache = Make(100, /*watermark=*/0.8, /*ratio=*/0.2);
  for (int i = 0; i < 79; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  EXPECT_EQ(cache->EvictToWatermark(), 0u);  // 79% < 80%
  for (int i = 79; i < 85; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  // Lock one of the oldest: it is skipped, the next one goes instead.
  EXPECT_EQ(Lookup(*cache, {Key(3)}, 1, 1), 1u);  // also makes it the newest
  std::vector<ChunkKey> touch = {Key(0)};
  cache->Touch(touch);
  EXPECT_EQ(cache->EvictToWatermark(), 20u);
  L1Stats st = cache->stats();
  EXPECT_EQ(st.used_bytes, 65 * kPage);
  EXPECT_EQ(st.evictions, 20u);
  EXPECT_EQ(st.evicted_bytes, 20 * kPage);
  // Evicted: the 20 least recent, i.e. 1, 2 and 4..21.
  EXPECT_TRUE(cache->IsResident(Key(0), 0));
  EXPECT_TRUE(cache->IsResident(Key(3), 0));
  for (int i : {1, 2, 4, 10, 21}) EXPECT_FALSE(cache->IsResident(Key(i), 0)) << i;
  EXPECT_TRUE(cache->IsResident(Key(22), 0));
  EXPECT_EQ(cache->EvictToWatermark(), 0u);  // 65% now
}

TEST_F(L1CacheTest, WatermarkEvictionStopsWhenEverythingIsLocked) {
  auto cache = Make(10, 0.5, 0.5);
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 8; ++i) {
    keys.push_back(Key(i));
    ASSERT_TRUE(WriteObject(*cache, keys.back(), 1, 0, kPage).ok());
  }
  EXPECT_EQ(cache->LookupPrefixAndLock(keys, 1, 1), 8u);
  EXPECT_EQ(cache->EvictToWatermark(), 0u);
  cache->ReleaseReadLocks(Key(6), 0, 1);
  EXPECT_EQ(cache->EvictToWatermark(), 1u);
  EXPECT_FALSE(cache->IsResident(Key(6), 0));
}

TEST_F(L1CacheTest, StatsCountWhatHappened) {
  auto cache = Make(4);
  const ChunkKey k = Key(1, "model", 2);
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  auto staging = cache->ReserveWrite(k, 2, 1, 2 * kPage);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {Key(2), k}, 1, 1), 1u);  // k has 2 slots: miss
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, kPage).status().code(), StatusCode::kAlreadyExists);
  auto pin = cache->PinForRead(k, 0);
  ASSERT_TRUE(pin.ok());

  L1Stats st = cache->stats(true);
  EXPECT_EQ(st.capacity_bytes, 4 * kPage);
  EXPECT_EQ(st.used_bytes, 4 * kPage);
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.detached_entries, 0u);
  EXPECT_EQ(st.resident_objects, 2u);
  EXPECT_EQ(st.staging_objects, 1u);
  EXPECT_EQ(st.locked_entries, 2u);  // k: staging + pin; Key(2): read lock
  EXPECT_EQ(st.pinned_objects, 1u);
  EXPECT_EQ(st.reservations, 3u);
  EXPECT_EQ(st.commits, 2u);
  EXPECT_EQ(st.aborts, 0u);
  EXPECT_EQ(st.write_conflicts, 1u);
  EXPECT_EQ(st.lookup_keys, 2u);
  EXPECT_EQ(st.lookup_hits, 1u);
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(cache->ReserveWrite(Key(3), 1, 0, kPage).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->stats().write_exhausted, 1u);

  staging->Abort();
  pin = Result<ReadPin>(ReadPin());
  cache->ReleaseReadLocks(Key(2), 0, 1);
  st = cache->stats(true);
  EXPECT_EQ(st.used_bytes, 2 * kPage);
  EXPECT_EQ(st.locked_entries, 0u);
  EXPECT_EQ(st.staging_objects, 0u);
  EXPECT_EQ(st.aborts, 1u);
}

TEST_F(L1CacheTest, SharedMemoryCacheAdvertisesItsSegment) {
  L1CacheOptions options;
  options.capacity_bytes = 16 * kPage;
  options.shm_name = "kvd_test_cache_" + std::to_string(getpid());
  options.clock = &clock_;
  auto cache = L1Cache::Create(options);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  EXPECT_EQ((*cache)->shm_name(), "/" + options.shm_name);
  ASSERT_TRUE(WriteObject(**cache, Key(1), 1, 0, kPage).ok());
}

TEST_F(L1CacheTest, EvictionThreadKeepsUsageUnderTheWatermark) {
  auto cache = Make(10, 0.6, 0.3);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  {
    EvictionThread thread(*cache, std::chrono::milliseconds(5));
    thread.Wake();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cache->stats().used_bytes > 5 * kPage && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }  // stops promptly
  EXPECT_EQ(cache->stats().used_bytes, 5 * kPage);  // 8 - ceil(0.3 * 10) = 5 pages
  EXPECT_EQ(cache->stats().evictions, 3u);
}

TEST(ChunkKeyTest, EqualityAndHashCoverAllFields) {
  const ChunkKey base = Key(7, "m", 4, "salt");
  ChunkKeyHash hash;
  EXPECT_EQ(base, Key(7, "m", 4, "salt"));
  EXPECT_EQ(hash(base), hash(Key(7, "m", 4, "salt")));
  for (const ChunkKey& other :
       {Key(8, "m", 4, "salt"), Key(7, "n", 4, "salt"), Key(7, "m", 2, "salt"),
        Key(7, "m", 4, "pepper"), Key(7, "m", 4, "")}) {
    EXPECT_NE(base, other);
    EXPECT_NE(hash(base), hash(other));
  }
  ChunkKey late_byte = base;
  late_byte.chunk_hash[31] ^= 1;  // equality looks at every byte even if the hash does not
  EXPECT_NE(base, late_byte);
  // Swapping model and salt must not collide.
  EXPECT_NE(hash(Key(7, "a", 1, "b")), hash(Key(7, "b", 1, "a")));
}

}  // namespace
}  // namespace kvd::l1

namespace kvd::l1 {
namespace {

// RemoveIfIdle (used by the tiers): only idle entries go; pinned, read-locked or staging
// ones stay until they are idle; memory comes back.
TEST(L1CacheRemoveIfIdleTest, RemovesOnlyIdleEntries) {
  FakeClock clock;
  L1CacheOptions options;
  options.capacity_bytes = 16 * 4096;
  options.clock = &clock;
  auto cache = std::move(L1Cache::Create(options)).value();
  const ChunkKey idle = testing::Key(1), pinned = testing::Key(2), locked = testing::Key(3),
                 staging = testing::Key(4), absent = testing::Key(5);
  for (const auto& k : {idle, pinned, locked}) ASSERT_TRUE(testing::WriteObject(*cache, k, 2, 0, 4096).ok());
  for (const auto& k : {idle, pinned, locked}) ASSERT_TRUE(testing::WriteObject(*cache, k, 2, 1, 4096).ok());
  auto pin = cache->PinForRead(pinned, 1);
  ASSERT_TRUE(pin.ok());
  std::vector<ChunkKey> lk = {locked};
  ASSERT_EQ(cache->LookupPrefixAndLock(lk, 2, 1), 1u);
  auto res = cache->ReserveWrite(staging, 2, 0, 4096);
  ASSERT_TRUE(res.ok());
  const uint64_t used = cache->stats().used_bytes;
  std::vector<ChunkKey> all = {idle, pinned, locked, staging, absent};
  EXPECT_EQ(cache->RemoveIfIdle(all), 1u);
  EXPECT_FALSE(cache->IsResident(idle, 0));
  EXPECT_TRUE(cache->IsResident(pinned, 0));
  EXPECT_TRUE(cache->IsResident(locked, 1));
  EXPECT_EQ(cache->stats().used_bytes, used - 2 * 4096);
  EXPECT_EQ(cache->stats().removed, 1u);
  EXPECT_EQ(cache->stats().evictions, 0u);
  // Once idle, they go too.
  pin->Release();
  cache->ReleaseReadLocksAllSlots(lk, 1);
  EXPECT_EQ(cache->RemoveIfIdle(all), 2u);
  EXPECT_TRUE(res->Commit());
  EXPECT_EQ(cache->RemoveIfIdle(all), 1u);
  EXPECT_EQ(cache->stats().used_bytes, 0u);
  EXPECT_EQ(cache->stats().entries, 0u);
}

}  // namespace
}  // namespace kvd::l1
