// L1Listener: the cache reports an entry once when its last slot commits, and reports
// complete entries (only those) when they are evicted or cleared.
#include "l1/l1_listener.h"

#include <string>
#include <vector>

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

struct Recorder final : L1Listener {
  std::vector<ChunkKey> completed;
  std::vector<std::vector<ChunkKey>> removed;  // one element per call
  std::vector<RemovalCause> causes;
  void OnEntryComplete(const ChunkKey& key) override { completed.push_back(key); }
  void OnEntriesRemoved(std::span<const ChunkKey> keys, RemovalCause cause) override {
    EXPECT_FALSE(keys.empty());
    removed.emplace_back(keys.begin(), keys.end());
    causes.push_back(cause);
  }
  // Every key reported removed, over all calls (a batch is one index shard's).
  std::vector<ChunkKey> AllRemoved() const {
    std::vector<ChunkKey> all;
    for (const auto& b : removed) all.insert(all.end(), b.begin(), b.end());
    return all;
  }
};

class L1ListenerTest : public ::testing::Test {
 protected:
  std::unique_ptr<L1Cache> Make(uint64_t pages, double watermark = 0.8, double ratio = 0.2) {
    L1CacheOptions options;
    options.capacity_bytes = pages * kPage;
    options.eviction_watermark = watermark;
    options.eviction_ratio = ratio;
    options.clock = &clock_;
    options.listener = &rec_;
    auto cache = L1Cache::Create(options);
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    if (!cache.ok()) return nullptr;
    EXPECT_EQ(Ns(**cache, "m", 1), 0u);
    return std::move(cache).value();
  }
  FakeClock clock_;
  Recorder rec_;
};

TEST_F(L1ListenerTest, EntryIsReportedOnceWhenItsLastSlotCommits) {
  auto cache = Make(16);
  const ChunkKey k = Key(1, Ns(*cache, "m", 2));
  ASSERT_TRUE(WriteObject(*cache, k, 2, 0, kPage).ok());
  EXPECT_TRUE(rec_.completed.empty()) << "one of two ranks committed: not visible yet";
  ASSERT_TRUE(WriteObject(*cache, k, 2, 1, kPage).ok());
  ASSERT_EQ(rec_.completed.size(), 1u);
  EXPECT_EQ(rec_.completed[0], k);
  EXPECT_EQ(cache->namespaces().Get(rec_.completed[0].ns).world_size, 2);
  // A second writer of a resident slot is refused and reports nothing.
  EXPECT_FALSE(WriteObject(*cache, k, 2, 1, kPage).ok());
  EXPECT_EQ(rec_.completed.size(), 1u);
}

TEST_F(L1ListenerTest, AbortedWriteReportsNothing) {
  auto cache = Make(16);
  {
    auto r = cache->ReserveWrite(Key(2), 1, 0, kPage);
    ASSERT_TRUE(r.ok());
  }  // aborted
  EXPECT_TRUE(rec_.completed.empty());
  EXPECT_TRUE(rec_.removed.empty());
}

TEST_F(L1ListenerTest, ClearReportsOnlyCompleteEntries) {
  auto cache = Make(16);
  ASSERT_TRUE(WriteObject(*cache, Key(1), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(3, Ns(*cache, "m", 2)), 2, 0, kPage).ok());  // half a TP=2 chunk
  cache->Clear();
  ASSERT_FALSE(rec_.removed.empty());
  for (RemovalCause c : rec_.causes) EXPECT_EQ(c, RemovalCause::kCleared);
  std::vector<ChunkKey> got = rec_.AllRemoved();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE((got[0] == Key(1) && got[1] == Key(2)) || (got[0] == Key(2) && got[1] == Key(1)));
  const size_t calls = rec_.removed.size();
  cache->Clear();  // nothing left: no call
  EXPECT_EQ(rec_.removed.size(), calls);
}

TEST_F(L1ListenerTest, WatermarkEvictionReportsTheEvictedEntries) {
  auto cache = Make(10, /*watermark=*/0.5, /*ratio=*/0.3);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  ASSERT_EQ(cache->EvictToWatermark(), 3u);
  for (RemovalCause c : rec_.causes) EXPECT_EQ(c, RemovalCause::kEvicted);
  ASSERT_EQ(rec_.AllRemoved().size(), 3u);
  for (const auto& k : rec_.AllRemoved()) EXPECT_FALSE(cache->IsResident(k, 0));
}

TEST_F(L1ListenerTest, EvictionOnTheAllocationPathIsReported) {
  auto cache = Make(4, /*watermark=*/1.0);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(WriteObject(*cache, Key(i), 1, 0, kPage).ok());
  ASSERT_TRUE(rec_.removed.empty());
  ASSERT_TRUE(WriteObject(*cache, Key(9), 1, 0, kPage).ok());  // does not fit: evicts one
  ASSERT_EQ(rec_.removed.size(), 1u);
  ASSERT_EQ(rec_.removed[0].size(), 1u);
  EXPECT_FALSE(cache->IsResident(rec_.removed[0][0], 0));
  EXPECT_EQ(rec_.completed.size(), 5u);
}

// Regression: entries the tiers removed with RemoveIfIdle (skip_l1, the prefetch sweep) left
// the table without a report, so KV-event subscribers kept routing to chunks L1 no longer had.
TEST_F(L1ListenerTest, RemoveIfIdleReportsTheCompleteEntriesItRemoves) {
  auto cache = Make(16);
  const NamespaceId ns2 = Ns(*cache, "m", 2);
  ASSERT_TRUE(WriteObject(*cache, Key(1), 1, 0, kPage).ok());
  ASSERT_TRUE(WriteObject(*cache, Key(2, ns2), 2, 0, kPage).ok());  // half a TP=2 chunk
  std::vector<ChunkKey> keys = {Key(1), Key(2, ns2)};
  ASSERT_EQ(cache->RemoveIfIdle(keys), 2u);
  ASSERT_EQ(rec_.AllRemoved().size(), 1u) << "only the complete entry was ever visible";
  EXPECT_EQ(rec_.AllRemoved()[0], Key(1));
  EXPECT_EQ(rec_.causes[0], RemovalCause::kEvicted);
}

}  // namespace
}  // namespace kvd::l1
