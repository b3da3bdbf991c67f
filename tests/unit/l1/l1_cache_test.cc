// L1Cache: the slot state machine, locks, pins, eviction and stats, driven by a FakeClock.
// Sizes are in pages (4096 bytes, the pool's granularity) so that "the pool holds N objects"
// is exact.
#include "l1/l1_cache.h"

#include <array>
#include <random>
#include <chrono>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "l1_test_util.h"

namespace kvd::l1 {
namespace {

using testing::CheckPattern;
using testing::FillPattern;
using testing::Key;
using testing::Ns;
using testing::WriteObject;

constexpr uint64_t kPage = 4096;

class L1CacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<L1Cache> Make(uint64_t pages, double watermark = 0.8, double ratio = 0.2,
                                const std::string& policy = "LRU",
                                uint64_t max_lookup_holds = L1CacheOptions{}.max_lookup_holds) {
    L1CacheOptions options;
    options.max_lookup_holds = max_lookup_holds;
    options.eviction_policy = policy;
    options.capacity_bytes = pages * kPage;
    options.read_ttl_seconds = 300;
    options.write_ttl_seconds = 600;
    options.eviction_watermark = watermark;
    options.eviction_ratio = ratio;
    options.clock = &clock_;
    auto cache = L1Cache::Create(options);
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    if (!cache.ok()) return nullptr;
    EXPECT_EQ(Ns(**cache), 0u);  // Key(i) lives in namespace 0
    return std::move(cache).value();
  }

  // A lookup by request `owner` (chunk indices from 0).
  size_t Lookup(L1Cache& cache, std::vector<ChunkKey> keys, uint32_t num_slots = 1,
                uint32_t readers = 0, const std::string& owner = "req") {
    return cache.LookupAndLock(owner, 0, keys, num_slots, readers);
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
  options.eviction_policy = "LFU";
  EXPECT_EQ(L1Cache::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.eviction_policy = "lru";
  auto ok = L1Cache::Create(options);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->capacity_bytes(), 16 * kPage);
  EXPECT_NE((*ok)->base(), nullptr);
  EXPECT_TRUE((*ok)->shm_name().empty());
  EXPECT_EQ((*ok)->policy_name(), "LRU");
  // Keys must name an interned namespace.
  EXPECT_EQ((*ok)->ReserveWrite(Key(1, 5), 1, 0, kPage).status().code(),
            StatusCode::kInvalidArgument);
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
  const ChunkKey k = Key(1, Ns(*cache, "model", 4));
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
  cache->ReleaseLocks("nobody", 0, 1, 5);      // ignored
  cache->ReleaseLocks("nobody", 0, 10, std::nullopt);
  EXPECT_EQ(cache->stats().entries, 1u);
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, 0).status().code(), StatusCode::kInvalidArgument);
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

// LHD on the L1's path: lookups are uses of a request, the 64 shards learn one index. 40
// popular chunks, each looked up again after 160 one-shot chunks were stored, room for 100:
// LRU never keeps a popular chunk that long, LHD learns to.
TEST_F(L1CacheTest, LhdKeepsChunksThatAreUsedAgainThroughAScan) {
  auto popular_hits = [&](const std::string& policy) {
    auto cache = Make(100, 0.8, 0.2, policy);
    int hits = 0;
    uint64_t next = 1000;
    for (int round = 0; round < 100; ++round) {
      for (uint64_t p = 0; p < 40; ++p) {
        if (Lookup(*cache, {Key(p)}) == 1) {
          hits += round >= 50;
        } else {
          EXPECT_TRUE(WriteObject(*cache, Key(p), 1, 0, kPage).ok());
        }
        for (int s = 0; s < 4; ++s) {
          const ChunkKey k = Key(next++);
          EXPECT_EQ(Lookup(*cache, {k}), 0u);
          EXPECT_TRUE(WriteObject(*cache, k, 1, 0, kPage).ok());
        }
      }
    }
    EXPECT_EQ(cache->stats().entries, 100u);
    return hits;
  };
  EXPECT_EQ(popular_hits("LRU"), 0);
  EXPECT_GE(popular_hits("LHD"), 50 * 40 * 3 / 4);
}

TEST_F(L1CacheTest, EvictionRemovesWholeEntries) {
  auto cache = Make(4);
  const ChunkKey k = Key(1, Ns(*cache, "model", 2));
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
  EXPECT_EQ(cache->LookupAndLock("a", 0, keys, 1, 1), 4u);
  EXPECT_EQ(cache->stats().locked_entries, 4u);
  EXPECT_EQ(cache->stats().lookup_locks, 1u);
  auto res = cache->ReserveWrite(Key(10), 1, 0, kPage);
  EXPECT_EQ(res.status().code(), StatusCode::kResourceExhausted);
  L1Stats st = cache->stats();
  EXPECT_EQ(st.entries, 4u);  // the entry this call would have created is not left behind
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(st.write_exhausted, 1u);

  cache->ReleaseLocks("a", 2, 1, 0);  // the reader of chunk 2 is done
  ASSERT_TRUE(WriteObject(*cache, Key(10), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(2), 0));  // the only unlocked one, though not the oldest
  for (int i : {0, 1, 3}) EXPECT_TRUE(cache->IsResident(Key(i), 0));
}

// Issue 11 finding 5, at the cache's level: each lookup request owns its locks, there is no
// cap that loses locks, and one owner's releases never touch another's.
TEST_F(L1CacheTest, ReadLocksBelongToTheLookupThatTookThem) {
  auto cache = Make(2);
  const ChunkKey k = Key(1);
  ASSERT_TRUE(WriteObject(*cache, k, 1, 0, kPage).ok());
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(Lookup(*cache, {k}, 1, 1, std::string("r") + std::to_string(i)), 1u);
  }
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 300u);  // no cap
  // Releases by owners that hold nothing change nothing, however many.
  for (int i = 0; i < 500; ++i) cache->ReleaseLocks("stranger", 0, 1, 0);
  cache->ReleaseAllLocks("stranger");
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 300u);
  // An owner releases once; a second release of the same reader is ignored.
  cache->ReleaseLocks("r0", 0, 1, 0);
  cache->ReleaseLocks("r0", 0, 1, 0);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 299u);
  for (int i = 1; i < 299; ++i) cache->ReleaseLocks(std::string("r") + std::to_string(i), 0, 1, 0);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 1u);
  for (int i = 2; i < 6; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  EXPECT_TRUE(cache->IsResident(k, 0));  // still r299's: the others evicted each other
  cache->ReleaseLocks("r299", 0, 1, 0);
  EXPECT_EQ(cache->stats().locked_entries, 0u);
  EXPECT_EQ(cache->stats().lookup_locks, 0u);
  for (int i = 6; i < 8; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(k, 0));
}

// Regression: an entry counts its lookup holds in 16 bits. The 65,536th lookup that held a
// hot chunk (a shared prefix under many lookups that are not retrieved, e.g. a client that
// looks up and ends sessions; kvd-bench's 8- and 64-client hit cases) was refused its lock
// and answered a miss, for every client, until holds expired 300 s later.
TEST_F(L1CacheTest, AHotChunkStillHitsPastSixtyFiveThousandHolds) {
  // More holds than the default bound on holds (this tests the entry's counter, not it).
  auto cache = Make(4, 0.8, 0.2, "LRU", uint64_t{1} << 20);
  const ChunkKey k = Key(1);
  ASSERT_TRUE(WriteObject(*cache, k, 1, 0, kPage).ok());
  constexpr int kOwners = EntryLocks::kMax + 1000;
  for (int i = 0; i < kOwners; ++i) {
    ASSERT_EQ(Lookup(*cache, {k}, 1, 1, std::string("r") + std::to_string(i)), 1u) << "lookup " << i;
  }
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, static_cast<uint32_t>(kOwners));
  EXPECT_EQ(cache->stats().lookup_locks, static_cast<uint64_t>(kOwners));
  // A transient lookup (no readers) still hits and leaves the count as it was.
  EXPECT_EQ(Lookup(*cache, {k}, 1, 0, "peek"), 1u);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, static_cast<uint32_t>(kOwners));
  // Every hold, counted in the entry or beside it, keeps the entry: only after the last
  // release can it be evicted.
  for (int i = 0; i < kOwners - 1; ++i) cache->ReleaseLocks(std::string("r") + std::to_string(i), 0, 1, 0);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 1u);
  for (int i = 2; i < 6; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  EXPECT_TRUE(cache->IsResident(k, 0));
  cache->ReleaseLocks(std::string("r") + std::to_string(kOwners - 1), 0, 1, 0);
  EXPECT_EQ(cache->stats().locked_entries, 0u);
  EXPECT_EQ(cache->stats().lookup_locks, 0u);
  for (int i = 6; i < 10; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(k, 0));
}

// Regression: at the bound on read-lock counters a lookup used to lock (and report) only what
// still fit, so a client that looked up without retrieving made every other client's lookups
// miss until its holds expired. Now the oldest holds are released early instead.
TEST_F(L1CacheTest, AtTheReadLockBoundTheOldestHoldsAreReleasedEarly) {
  L1CacheOptions options;
  options.capacity_bytes = 16 * kPage;
  options.max_read_lock_slots = 40;
  options.clock = &clock_;
  auto made = L1Cache::Create(options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  L1Cache& cache = **made;
  ASSERT_EQ(Ns(cache), 0u);  // Key(i)'s namespace
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 10; ++i) {
    keys.push_back(Key(i));
    ASSERT_TRUE(WriteObject(cache, keys.back(), 1, 0, kPage).ok());
  }
  for (int i = 0; i < 4; ++i) {  // 4 x 10 counters: the bound; old0 the oldest
    ASSERT_EQ(cache.LookupAndLock(std::string("old") + std::to_string(i), 0, keys, 1, 1), 10u);
    clock_.AdvanceSeconds(10);
  }
  EXPECT_EQ(cache.stats().shed_lookup_locks, 0u);
  EXPECT_EQ(cache.LookupAndLock("new", 0, keys, 1, 1), 10u);  // was 0
  L1Stats st = cache.stats();
  EXPECT_EQ(st.shed_lookup_locks, 1u);  // old0 only: 30 of 40 counters leave room for 10
  EXPECT_EQ(st.lookup_locks, 4u);
  EXPECT_EQ(cache.DescribeSlot(keys[0], 0)->read_locks, 4u);
  cache.ReleaseAllLocks("old0");  // gone already: changes nothing
  EXPECT_EQ(cache.DescribeSlot(keys[0], 0)->read_locks, 4u);
  for (const char* owner : {"old1", "old2", "old3", "new"}) cache.ReleaseAllLocks(owner);
  EXPECT_EQ(cache.stats().lookup_locks, 0u);
  EXPECT_EQ(cache.stats().locked_entries, 0u);
}

// Issue 27, finding 6: a hold costs memory beyond its counters (its request id, its record),
// and a lookup that holds one chunk costs one counter, so the counter bound alone let 2^24
// holds pile up (gigabytes of records). The number of holds is bounded too: at that bound the
// oldest holds go early, as at the counter bound.
TEST_F(L1CacheTest, Finding6AtTheHoldBoundTheOldestHoldsAreReleasedEarly) {
  L1CacheOptions options;
  options.capacity_bytes = 16 * kPage;
  options.max_lookup_holds = 8;
  options.clock = &clock_;
  auto made = L1Cache::Create(options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  L1Cache& cache = **made;
  ASSERT_EQ(Ns(cache), 0u);  // Key(i)'s namespace
  const ChunkKey k = Key(1);
  ASSERT_TRUE(WriteObject(cache, k, 1, 0, kPage).ok());
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(cache.LookupAndLock(std::string("owner") + std::to_string(i), 0, {&k, 1}, 1, 1), 1u)
        << i;  // every lookup still locks its hit
    EXPECT_LE(cache.stats().lookup_locks, 8u) << i;
    clock_.AdvanceSeconds(1);
  }
  const L1Stats st = cache.stats();
  EXPECT_GE(st.shed_lookup_locks, 32u);
  EXPECT_EQ(cache.DescribeSlot(k, 0)->read_locks, static_cast<uint32_t>(st.lookup_locks));
  // The newest hold survived the shedding; releasing every owner leaves nothing locked.
  cache.ReleaseLocks("owner39", 0, 1, 0);
  EXPECT_EQ(cache.DescribeSlot(k, 0)->read_locks, static_cast<uint32_t>(st.lookup_locks - 1));
  for (int i = 0; i < 40; ++i) cache.ReleaseAllLocks(std::string("owner") + std::to_string(i));
  EXPECT_EQ(cache.stats().lookup_locks, 0u);
  EXPECT_EQ(cache.stats().locked_entries, 0u);
}

TEST_F(L1CacheTest, EachReaderOfASlotReleasesOnce) {
  // An MLA object read by three TP ranks: three readers of slot 0.
  auto cache = Make(4);
  const ChunkKey k = Key(1);
  ASSERT_TRUE(WriteObject(*cache, k, 1, 0, kPage).ok());
  ASSERT_EQ(Lookup(*cache, {k}, 1, 3, "mla"), 1u);
  cache->ReleaseLocks("mla", 0, 1, 0);
  cache->ReleaseLocks("mla", 0, 1, 0);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 1u);
  cache->ReleaseLocks("mla", 0, 1, 0);
  EXPECT_EQ(cache->DescribeSlot(k, 0)->read_locks, 0u);
  // Two slots: the chunk stays locked until both ranks retrieved.
  const ChunkKey t = Key(2, Ns(*cache, "model", 2));
  for (uint32_t s = 0; s < 2; ++s) ASSERT_TRUE(WriteObject(*cache, t, 2, s, kPage).ok());
  ASSERT_EQ(Lookup(*cache, {t}, 2, 1, "tp2"), 1u);
  cache->ReleaseLocks("tp2", 0, 1, 1);
  EXPECT_EQ(cache->DescribeSlot(t, 0)->read_locks, 1u);
  cache->ReleaseLocks("tp2", 0, 1, 0);
  EXPECT_EQ(cache->DescribeSlot(t, 0)->read_locks, 0u);
}

TEST_F(L1CacheTest, ANewLookupReplacesTheOwnersOldLocks) {
  auto cache = Make(4);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  ASSERT_EQ(Lookup(*cache, {Key(0), Key(1)}, 1, 1, "q"), 2u);
  ASSERT_EQ(Lookup(*cache, {Key(2)}, 1, 1, "q"), 1u);
  EXPECT_EQ(cache->DescribeSlot(Key(0), 0)->read_locks, 0u);
  EXPECT_EQ(cache->DescribeSlot(Key(2), 0)->read_locks, 1u);
  EXPECT_EQ(cache->stats().lookup_locks, 1u);
  cache->ReleaseAllLocks("q");
  EXPECT_EQ(cache->stats().locked_entries, 0u);
}

TEST_F(L1CacheTest, ReleaseRangesUseTheRequestsChunkNumbers) {
  auto cache = Make(8);
  const ChunkKey a = Key(1, Ns(*cache, "model", 2));
  const ChunkKey b = Key(2, a.ns);
  for (const ChunkKey& k : {a, b}) {
    for (uint32_t s = 0; s < 2; ++s) ASSERT_TRUE(WriteObject(*cache, k, 2, s, kPage).ok());
  }
  std::vector<ChunkKey> keys = {a, b, Key(77, a.ns)};
  // The lookup covers chunks 4, 5, 6 of its request.
  EXPECT_EQ(cache->LookupAndLock("r", 4, keys, 2, 3), 2u);
  cache->ReleaseLocks("r", 0, 4, std::nullopt);  // chunks 0-3: none held
  EXPECT_EQ(cache->DescribeSlot(a, 0)->read_locks, 1u);
  cache->ReleaseLocks("r", 5, 1, std::nullopt);  // FREE_LOOKUP_LOCKS of chunk 5 = b
  EXPECT_EQ(cache->DescribeSlot(b, 0)->read_locks, 0u);
  EXPECT_EQ(cache->DescribeSlot(a, 0)->read_locks, 1u);
  cache->ReleaseLocks("r", 0, 100, std::nullopt);
  EXPECT_EQ(cache->stats().locked_entries, 0u);
  EXPECT_EQ(cache->stats().lookup_locks, 0u);
}

TEST_F(L1CacheTest, ExpiredReadLocksAreReleasedByTheSweep) {
  auto cache = Make(2);
  ASSERT_TRUE(WriteObject(*cache, Key(0), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(1), 1, 0, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {Key(0), Key(1)}, 1, 1, "a"), 2u);
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, kPage).status().code(),
            StatusCode::kResourceExhausted);
  clock_.AdvanceSeconds(299);
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, kPage).status().code(),
            StatusCode::kResourceExhausted);
  // Another request locks Key(1) later; a's locks then lapse first.
  EXPECT_EQ(Lookup(*cache, {Key(1)}, 1, 1, "b"), 1u);
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->read_locks, 2u);
  clock_.AdvanceSeconds(2);
  // An allocation that finds nothing evictable sweeps expired locks, then evicts Key(0).
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_FALSE(cache->IsResident(Key(0), 0));
  EXPECT_TRUE(cache->IsResident(Key(1), 0));
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->read_locks, 1u);
  // The maintenance sweep releases b's lock once it expires too.
  clock_.AdvanceSeconds(301);
  EXPECT_EQ(cache->ExpireLocks(), 1u);
  EXPECT_EQ(cache->DescribeSlot(Key(1), 0)->read_locks, 0u);
  EXPECT_EQ(cache->stats().lookup_locks, 0u);
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
  ASSERT_TRUE(WriteObject(*cache, Key(9), 1, 0, kPage).ok());
  ASSERT_EQ(Lookup(*cache, {Key(9)}, 1, 1, "hold"), 1u);
  auto dead = cache->ReserveWrite(k, 1, 0, kPage);
  ASSERT_TRUE(dead.ok());
  clock_.AdvanceSeconds(601);
  cache->ReleaseAllLocks("hold");
  ASSERT_EQ(Lookup(*cache, {Key(9)}, 1, 1, "hold"), 1u);  // a fresh lock keeps Key(9)
  // Reclaiming works, but two pages do not fit next to the locked Key(9): the entry must not
  // stay behind empty.
  EXPECT_EQ(cache->ReserveWrite(k, 1, 0, 2 * kPage).status().code(),
            StatusCode::kResourceExhausted);
  L1Stats st = cache->stats();
  EXPECT_EQ(st.entries, 1u);  // Key(9) only
  EXPECT_EQ(st.used_bytes, kPage);
  EXPECT_EQ(st.detached_entries, 1u);  // still referenced by the dead writer's handle
  dead->Abort();
  EXPECT_EQ(cache->stats().detached_entries, 0u);
}

TEST_F(L1CacheTest, LiveStagingBlocksEvictionExpiredStagingDoesNot) {
  auto cache = Make(2);
  auto writer = cache->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_EQ(cache->stats().locked_entries, 1u);
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
  EXPECT_EQ(cache->stats().locked_entries, 1u);
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
  const ChunkKey k = Key(1, Ns(*cache, "model", 2));
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, k, 2, 1, 2 * kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  ASSERT_EQ(Lookup(*cache, {Key(2)}, 1, 1, "r"), 1u);
  auto pin = cache->PinForRead(k, 1);
  ASSERT_TRUE(pin.ok());

  cache->Clear();
  L1Stats st = cache->stats();
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.detached_entries, 1u);
  EXPECT_EQ(st.used_bytes, 3 * kPage);  // only the pinned entry's memory is kept
  EXPECT_EQ(st.pinned_objects, 1u);
  EXPECT_EQ(st.lookup_locks, 0u);  // Clear drops read locks too
  EXPECT_EQ(Lookup(*cache, {k}, 2), 0u);
  EXPECT_EQ(cache->PinForRead(k, 1).status().code(), StatusCode::kNotFound);

  // New writes fill the rest of the pool but never land on the pinned bytes.
  for (int i = 10; i < 15; ++i) {
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
  EXPECT_EQ(st.used_bytes, 5 * kPage);
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

// lmcache 0.5.6's IsolatedLRU fails on the L1 path (its eviction loop passes no salt); here
// quotas set through the L1 (the /quota routes) shed each salt on the L1's own rounds.
TEST_F(L1CacheTest, IsolatedLruShedsSaltsOverTheirQuotaOnTheL1Path) {
  auto cache = Make(100, /*watermark=*/0.8, /*ratio=*/0.2, "IsolatedLRU");
  const NamespaceId a = Ns(*cache, "model", 1, "a");
  const NamespaceId b = Ns(*cache, "model", 1, "b");
  const NamespaceId c = Ns(*cache, "model", 1, "c");
  ASSERT_TRUE(cache->SetQuota("a", 10 * kPage).ok());
  ASSERT_TRUE(cache->SetQuota("b", 50 * kPage).ok());
  ASSERT_TRUE(cache->SetQuota("", 100 * kPage).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i, a), 1, 0, kPage).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i, b), 1, 0, kPage).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i, c), 1, 0, kPage).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  EXPECT_EQ(cache->GetQuota("a").usage_bytes, 20 * kPage);
  // 48% used: no watermark round, only quotas. "a" is at 200% of its quota and sheds down to
  // (0.8 - 0.2) x 10 pages, oldest first; "c" has no quota (effective limit 0) and loses all;
  // "b" (40%) and the empty salt (5%) keep everything.
  EXPECT_EQ(cache->EvictToWatermark(), 14u + 3u);
  EXPECT_EQ(cache->GetQuota("a").usage_bytes, 6 * kPage);
  for (int i = 0; i < 14; ++i) EXPECT_FALSE(cache->IsResident(Key(i, a), 0)) << i;
  for (int i = 14; i < 20; ++i) EXPECT_TRUE(cache->IsResident(Key(i, a), 0)) << i;
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(cache->IsResident(Key(i, c), 0)) << i;
  EXPECT_EQ(cache->GetQuota("b").usage_bytes, 20 * kPage);
  EXPECT_EQ(cache->GetQuota("").usage_bytes, 5 * kPage);
  const auto listed = cache->ListQuotas();
  EXPECT_EQ(listed.size(), 3u);
  // Removing "b"'s quota leaves it at an effective limit of 0: its next round empties it.
  EXPECT_TRUE(cache->DeleteQuota("b"));
  EXPECT_FALSE(cache->DeleteQuota("b"));
  EXPECT_FALSE(cache->GetQuota("b").limit_bytes.has_value());
  EXPECT_EQ(cache->EvictToWatermark(), 20u);
  EXPECT_EQ(cache->GetQuota("b").usage_bytes, 0u);
  EXPECT_EQ(cache->GetQuota("a").usage_bytes, 6 * kPage);
}

TEST_F(L1CacheTest, WatermarkEvictionStopsWhenEverythingIsLocked) {
  auto cache = Make(10, 0.5, 0.5);
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 8; ++i) {
    keys.push_back(Key(i));
    ASSERT_TRUE(WriteObject(*cache, keys.back(), 1, 0, kPage).ok());
  }
  EXPECT_EQ(cache->LookupAndLock("r", 0, keys, 1, 1), 8u);
  EXPECT_EQ(cache->EvictToWatermark(), 0u);
  cache->ReleaseLocks("r", 6, 1, 0);
  EXPECT_EQ(cache->EvictToWatermark(), 1u);
  EXPECT_FALSE(cache->IsResident(Key(6), 0));
}

TEST_F(L1CacheTest, StatsCountWhatHappened) {
  auto cache = Make(4);
  const ChunkKey k = Key(1, Ns(*cache, "model", 2));
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  auto staging = cache->ReserveWrite(k, 2, 1, 2 * kPage);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  EXPECT_EQ(Lookup(*cache, {Key(2), k}, 1, 1), 1u);  // k has 2 slots: miss
  EXPECT_EQ(cache->ReserveWrite(Key(2), 1, 0, kPage).status().code(), StatusCode::kAlreadyExists);
  auto pin = cache->PinForRead(k, 0);
  ASSERT_TRUE(pin.ok());

  L1Stats st = cache->stats();
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
  cache->ReleaseLocks("req", 0, 1, 0);
  st = cache->stats();
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
  Ns(**cache);
  ASSERT_TRUE(WriteObject(**cache, Key(1), 1, 0, kPage).ok());
}

// Issue 11, finding 3: a shared pool's pages are allocated (fallocate) before a reservation
// is handed out, so writing it never raises SIGBUS; anonymous pools need nothing.
TEST_F(L1CacheTest, Finding3ReservationsOfASharedPoolAreBackedBeforeUse) {
  L1CacheOptions options;
  options.capacity_bytes = 3 * MemoryPool::kBackingGranule;
  options.shm_name = "kvd_test_backing_" + std::to_string(getpid());
  options.clock = &clock_;
  auto cache = L1Cache::Create(options);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  Ns(**cache);
  EXPECT_EQ((*cache)->stats().backed_bytes, 0u);  // sparse until used
  auto r = (*cache)->ReserveWrite(Key(1), 1, 0, kPage);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*cache)->stats().backed_bytes, MemoryPool::kBackingGranule);
  // The segment's blocks are allocated: st_blocks covers the granule.
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + options.shm_name).c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, MemoryPool::kBackingGranule);
  auto big = (*cache)->ReserveWrite(Key(2), 1, 0, MemoryPool::kBackingGranule + kPage);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*cache)->stats().backed_bytes, 2 * MemoryPool::kBackingGranule);
  EXPECT_EQ((*cache)->stats().backing_failures, 0u);
  auto anonymous = Make(4);
  ASSERT_TRUE(WriteObject(*anonymous, Key(3), 1, 0, kPage).ok());
  EXPECT_EQ(anonymous->stats().backed_bytes, 0u);
}

// Issue 12, item 5: with population on, the pool's pages are populated in the background
// after Create returns (stats().populated_bytes reaches the capacity) and stores keep
// working meanwhile; off (the default of L1CacheOptions) populates nothing.
TEST_F(L1CacheTest, PopulatesThePoolInTheBackgroundWhenAsked) {
  L1CacheOptions options;
  options.capacity_bytes = 4 * MemoryPool::kBackingGranule;
  options.shm_name = "kvd_test_populate_" + std::to_string(getpid());
  options.clock = &clock_;
  options.populate.mode = PopulateMode::kAll;
  options.populate.room = [] { return std::optional<MemoryRoom>(MemoryRoom{1ull << 40, 1ull << 40, "test"}); };
  options.populate.idle_poll = std::chrono::milliseconds(2);
  auto cache = L1Cache::Create(options);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  Ns(**cache);
  ASSERT_TRUE(WriteObject(**cache, Key(1), 1, 0, 3 * kPage).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((*cache)->stats().populated_bytes < options.capacity_bytes &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ((*cache)->stats().populated_bytes, options.capacity_bytes);
  EXPECT_EQ((*cache)->stats().backed_bytes, options.capacity_bytes);
  ASSERT_TRUE(WriteObject(**cache, Key(2), 1, 0, 5 * kPage).ok());
  EXPECT_TRUE((*cache)->IsResident(Key(1), 0));

  auto plain = Make(16);
  ASSERT_TRUE(WriteObject(*plain, Key(3), 1, 0, kPage).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(plain->stats().populated_bytes, 0u);
}

TEST(ChunkKeyTest, EqualityAndDigestCoverBothFields) {
  const ChunkKey base = Key(7, 3);
  EXPECT_EQ(base, Key(7, 3));
  EXPECT_EQ(ChunkKeyDigest(base, 1), ChunkKeyDigest(Key(7, 3), 1));
  for (const ChunkKey& other : {Key(8, 3), Key(7, 4), Key(7, 0)}) {
    EXPECT_NE(base, other);
    EXPECT_NE(ChunkKeyDigest(base, 1), ChunkKeyDigest(other, 1));
  }
  ChunkKey late_byte = base;
  late_byte.chunk_hash[31] ^= 1;  // equality looks at every byte even if the digest does not
  EXPECT_NE(base, late_byte);
  EXPECT_NE(ChunkKeyDigest(base, 1), ChunkKeyDigest(base, 2));  // the seed matters
}

TEST(NamespacesTest, InternFindAndSaltGroups) {
  Namespaces ns;
  auto a = ns.Intern("m", 1, "");
  auto b = ns.Intern("m", 2, "");
  auto c = ns.Intern("m", 1, "tenant");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_EQ(ns.Intern("m", 1, "").value(), *a);
  EXPECT_EQ(ns.Find("m", 2, ""), *b);
  EXPECT_FALSE(ns.Find("m", 4, "").has_value());
  EXPECT_FALSE(ns.Find("m\x01", 1, "").has_value());
  // Fields do not run into each other: ("ab", "") is not ("a", "b").
  auto ab = ns.Intern("ab", 1, "");
  auto a_b = ns.Intern("a", 1, "b");
  ASSERT_TRUE(ab.ok() && a_b.ok());
  EXPECT_NE(*ab, *a_b);
  EXPECT_EQ(ns.Get(*c).model_name, "m");
  EXPECT_EQ(ns.Get(*c).cache_salt, "tenant");
  EXPECT_EQ(ns.Get(*b).world_size, 2);
  EXPECT_EQ(ns.Get(*a).salt_group, ns.Get(*b).salt_group);  // same (empty) salt
  EXPECT_NE(ns.Get(*a).salt_group, ns.Get(*c).salt_group);
  EXPECT_EQ(ns.SaltOf(ns.Get(*c).salt_group), "tenant");
}

TEST(NamespacesTest, ABoundedNumberOfNamespaces) {
  Namespaces ns;
  for (uint32_t i = 0; i < Namespaces::kMaxNamespaces; ++i) {
    ASSERT_TRUE(ns.Intern("m", static_cast<int32_t>(i + 1), "").ok()) << i;
  }
  auto over = ns.Intern("m", 0, "");
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(ns.Intern("m", 1, "").ok());  // existing ones still resolve
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
  ASSERT_EQ(testing::Ns(*cache, "m", 2), 0u);
  const ChunkKey idle = testing::Key(1), pinned = testing::Key(2), locked = testing::Key(3),
                 staging = testing::Key(4), absent = testing::Key(5);
  for (const auto& k : {idle, pinned, locked}) ASSERT_TRUE(testing::WriteObject(*cache, k, 2, 0, 4096).ok());
  for (const auto& k : {idle, pinned, locked}) ASSERT_TRUE(testing::WriteObject(*cache, k, 2, 1, 4096).ok());
  auto pin = cache->PinForRead(pinned, 1);
  ASSERT_TRUE(pin.ok());
  std::vector<ChunkKey> lk = {locked};
  ASSERT_EQ(cache->LookupAndLock("r", 0, lk, 2, 1), 1u);
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
  cache->ReleaseLocks("r", 0, 1, std::nullopt);
  EXPECT_EQ(cache->RemoveIfIdle(all), 2u);
  EXPECT_TRUE(res->Commit());
  EXPECT_EQ(cache->RemoveIfIdle(all), 1u);
  EXPECT_EQ(cache->stats().used_bytes, 0u);
  EXPECT_EQ(cache->stats().entries, 0u);
}

// Random sequences of every operation on a small pool, with the clock moving: memory never
// exceeds the capacity, and once every handle is gone and the cache is cleared nothing is left
// (no leaked memory, record, lock or list entry). Every policy runs the same sequences.
class RandomOperations : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomOperations, AccountingBalances) {
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::err);
  for (int seed = 0; seed < 12; ++seed) {
    FakeClock clock;
    L1CacheOptions o;
    o.capacity_bytes = 16 * 4096;
    o.clock = &clock;
    o.read_ttl_seconds = 1;
    o.write_ttl_seconds = 5;
    o.eviction_policy = GetParam();
    auto cache = std::move(L1Cache::Create(o)).value();
    ASSERT_EQ(Ns(*cache, "m", 2), 0u);
    std::mt19937 rng(seed);
    std::vector<WriteReservation> res;
    std::vector<ReadPin> pins;
    for (int step = 0; step < 2000; ++step) {
      const ChunkKey k = Key(rng() % 20);
      const std::string owner = std::string(1, static_cast<char>('a' + rng() % 3));
      switch (rng() % 10) {
        case 0:
        case 1: {
          auto r = cache->ReserveWrite(k, 2, rng() % 2, 4096 * (1 + rng() % 2) - rng() % 100);
          if (r.ok()) res.push_back(std::move(r).value());
          break;
        }
        case 2:
          if (!res.empty()) {
            const size_t i = rng() % res.size();
            (void)res[i].Commit();
            res.erase(res.begin() + i);
          }
          break;
        case 3:
          if (!res.empty()) res.erase(res.begin() + rng() % res.size());  // abort
          break;
        case 4: {
          auto p = cache->PinForRead(k, rng() % 2);
          if (p.ok()) pins.push_back(std::move(p).value());
          break;
        }
        case 5:
          if (!pins.empty()) pins.erase(pins.begin() + rng() % pins.size());
          break;
        case 6: {
          std::vector<ChunkKey> keys{k, Key(rng() % 20)};
          cache->LookupAndLock(owner, 0, keys, 2, rng() % 2);
          break;
        }
        case 7:
          cache->ReleaseLocks(owner, 0, 2,
                              rng() % 3 == 0 ? std::nullopt : std::optional<uint32_t>(rng() % 2));
          break;
        case 8:
          clock.AdvanceSeconds(0.5);
          if (rng() % 3 == 0) cache->ExpireLocks();
          break;
        case 9:
          if (rng() % 20 == 0) cache->Clear(); else cache->EvictToWatermark();
          break;
      }
      const L1Stats st = cache->stats();
      ASSERT_LE(st.used_bytes, st.capacity_bytes) << "seed " << seed << " step " << step;
      ASSERT_LE(st.locked_entries, st.entries) << "seed " << seed << " step " << step;
    }
    res.clear();
    pins.clear();
    cache->Clear();
    const L1Stats st = cache->stats();
    EXPECT_EQ(st.used_bytes, 0u) << seed;
    EXPECT_EQ(st.entries, 0u) << seed;
    EXPECT_EQ(st.detached_entries, 0u) << seed;
    EXPECT_EQ(st.locked_entries, 0u) << seed;
    EXPECT_EQ(st.resident_objects + st.staging_objects + st.pinned_objects, 0u) << seed;
    // The pool is whole again.
    ASSERT_TRUE(WriteObject(*cache, Key(99), 1, 0, 16 * 4096).ok()) << seed;
  }
  spdlog::set_level(level);
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, RandomOperations,
                         ::testing::ValuesIn(eviction::PolicyNames()), [](const auto& info) {
                           std::string n = info.param;
                           std::erase(n, '-');
                           return n;
                         });

}  // namespace
}  // namespace kvd::l1
