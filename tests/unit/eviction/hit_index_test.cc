// What LHD learns (eviction/hit_index.h): age buckets, the index computed from observations,
// the orders imposed on it, and the statistics shared between instances.
#include "eviction/hit_index.h"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace kvd::eviction::lhd {
namespace {

TEST(HitIndex, BucketsTileEveryAge) {
  EXPECT_EQ(BucketStart(0), 0u);
  for (int b = 0; b + 1 < kBuckets; ++b) {
    ASSERT_EQ(BucketStart(b) + BucketWidth(b), BucketStart(b + 1)) << b;
  }
  EXPECT_EQ(BucketStart(kBuckets - 1) + BucketWidth(kBuckets - 1), uint64_t{1} << 32);
  std::vector<uint32_t> ages = {0, 1, 7, 8, 9, 15, 16, 100, 1000, 65535, 65536,
                                std::numeric_limits<uint32_t>::max()};
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) ages.push_back(static_cast<uint32_t>(rng()) >> (rng() % 32));
  for (uint32_t a : ages) {
    const int b = BucketOf(a);
    ASSERT_GE(b, 0);
    ASSERT_LT(b, kBuckets);
    EXPECT_LE(BucketStart(b), a);
    EXPECT_LT(a, BucketStart(b) + BucketWidth(b)) << a;
  }
}

TEST(HitIndex, NothingLearnedIndexesZero) {
  const IndexTable t = ComputeIndex({}, {}, {});
  for (const auto& row : t) {
    for (float v : row) EXPECT_EQ(v, 0.f);
  }
}

TEST(HitIndex, ReusedClassOutranksDeadClassAndDeadOnesIndexZero) {
  Histogram hits, ends, open;
  hits.Add(1, 100, 50);   // class 1 (used twice): reused at age 100
  ends.Add(0, 1000, 50);  // class 0 (used once): never reused
  const IndexTable t = ComputeIndex(hits, ends, open);
  EXPECT_EQ(t[0][BucketOf(10)], 0.f);
  EXPECT_GT(t[1][BucketOf(10)], 0.f);
  // At age 96..111 (the bucket of 100) every entry is reused within 16 ticks; younger ones
  // rank no lower than older ones of their class.
  EXPECT_FLOAT_EQ(t[1][BucketOf(100)], 1.0f / 16);
  EXPECT_FLOAT_EQ(t[1][BucketOf(0)], t[1][BucketOf(100)]);
  // Beyond the oldest observation the index is that of the oldest age observed, not zero.
  EXPECT_EQ(t[1][BucketOf(1'000'000)], t[1][BucketOf(100)]);
}

TEST(HitIndex, OpenObservationsAreCensoredNotIgnored) {
  Histogram hits, ends, open;
  hits.Add(0, 100, 10);
  ends.Add(0, 5000, 10);
  const float before = ComputeIndex(hits, ends, open)[0][BucketOf(0)];
  open.Add(0, 8000, 100);  // 100 more entries passed age 100 unused, not resolved yet
  const float after = ComputeIndex(hits, ends, open)[0][BucketOf(0)];
  EXPECT_LT(after, before / 3);
  // Entries younger than the reuses say nothing about the index from that age on.
  Histogram young;
  young.Add(0, 50, 100);
  EXPECT_EQ(ComputeIndex(hits, ends, young)[0][BucketOf(100)],
            ComputeIndex(hits, ends, {})[0][BucketOf(100)]);
}

TEST(HitIndex, NeverRisesWithAgeNorFallsWithUses) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    Histogram hits, ends, open;
    for (int i = 0; i < 300; ++i) {
      const int cls = static_cast<int>(rng() % kClasses);
      const uint32_t age = static_cast<uint32_t>(rng() % 100000);
      switch (rng() % 3) {
        case 0: hits.Add(cls, age); break;
        case 1: ends.Add(cls, age); break;
        default: open.Add(cls, age); break;
      }
    }
    const IndexTable t = ComputeIndex(hits, ends, open);
    for (int c = 0; c < kClasses; ++c) {
      for (int b = 0; b + 1 < kBuckets; ++b) ASSERT_GE(t[c][b], t[c][b + 1]) << c << " " << b;
      if (c > 0) {
        for (int b = 0; b < kBuckets; ++b) ASSERT_GE(t[c][b], t[c - 1][b]) << c << " " << b;
      }
    }
  }
}

TEST(HitStats, InstancesShareOneIndexUpdatedAfterEnoughObservations) {
  HitStats stats;
  const size_t a = stats.Join(), b = stats.Join();
  EXPECT_NE(a, b);
  const uint64_t v0 = stats.version();
  Histogram hits, ends;
  hits.Add(1, 100, HitStats::kRecomputeEvents / 2);
  auto view = stats.Sync(a, hits, ends, nullptr, 0, 0);
  EXPECT_EQ(hits.Total(), 0.0);  // taken
  EXPECT_EQ(stats.version(), v0);  // not enough yet
  ends.Add(0, 1000, HitStats::kRecomputeEvents / 2);
  view = stats.Sync(b, hits, ends, nullptr, 300.0 * 10, 10);
  EXPECT_GT(stats.version(), v0);
  EXPECT_EQ(view.version, stats.version());
  EXPECT_GT((*view.index)[1][BucketOf(0)], 0.f);  // a's hits, b's ends: one index
  EXPECT_EQ((*view.index)[0][BucketOf(0)], 0.f);
  EXPECT_EQ(view.horizon, static_cast<uint32_t>(HitStats::kHorizonFactor * 300));
  EXPECT_EQ(stats.view().index, view.index);
  stats.Leave(a);
  EXPECT_EQ(stats.Join(), a);  // its slot is reused
}

}  // namespace
}  // namespace kvd::eviction::lhd
