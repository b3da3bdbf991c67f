// The L1 cache's metric families report what L1Cache::stats() says, under the names /metrics,
// /status and the dashboard read.
#include "l1/l1_metrics.h"

#include <gtest/gtest.h>

#include "common/clock.h"
#include "l1_test_util.h"

namespace kvd::l1 {
namespace {

using testing::Key;
using testing::Ns;
using testing::WriteObject;

constexpr uint64_t kPage = 4096;

double Value(const metrics::Registry& r, const std::string& name) {
  return metrics::ValueOf(r.Collect(), name, -1);
}

TEST(L1MetricsTest, FamiliesFollowTheCacheAndCountersRebaseOnReset) {
  FakeClock clock;
  L1CacheOptions options;
  options.capacity_bytes = 16 * kPage;
  options.clock = &clock;
  options.eviction_watermark = 0.5;
  options.eviction_ratio = 0.5;
  auto made = L1Cache::Create(options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  L1Cache& cache = **made;
  ASSERT_EQ(Ns(cache), 0u);
  metrics::Registry registry;
  std::vector<metrics::CollectorHandle> handles = RegisterL1Metrics(cache, registry);

  EXPECT_EQ(Value(registry, "kvd_l1_capacity_bytes"), 16.0 * kPage);
  EXPECT_EQ(Value(registry, "kvd_l1_entries"), 0);
  EXPECT_EQ(Value(registry, "lmcache_mp_l1_usage_ratio"), 0);
  for (uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(WriteObject(cache, Key(i), 1, 0, kPage).ok());
  EXPECT_EQ(Value(registry, "kvd_l1_entries"), 12);
  EXPECT_EQ(Value(registry, "kvd_l1_resident_objects"), 12);
  EXPECT_EQ(Value(registry, "lmcache_mp_l1_memory_usage_bytes"), static_cast<double>(cache.stats().used_bytes));
  EXPECT_DOUBLE_EQ(Value(registry, "lmcache_mp_l1_usage_ratio"),
                   static_cast<double>(cache.stats().used_bytes) / (16.0 * kPage));

  const size_t evicted = cache.EvictToWatermark();
  ASSERT_GT(evicted, 0u);
  EXPECT_EQ(Value(registry, "lmcache_mp_l1_evicted_chunks_total"), static_cast<double>(cache.stats().evictions));
  EXPECT_EQ(Value(registry, "kvd_l1_evicted_bytes_total"), static_cast<double>(cache.stats().evicted_bytes));
  EXPECT_EQ(Value(registry, "kvd_l1_entries"), static_cast<double>(12 - cache.stats().evictions));

  // A reset rebases the counters; the gauges stay absolute.
  registry.ResetCounters();
  EXPECT_EQ(Value(registry, "lmcache_mp_l1_evicted_chunks_total"), 0);
  EXPECT_EQ(Value(registry, "kvd_l1_evicted_bytes_total"), 0);
  EXPECT_EQ(Value(registry, "kvd_l1_entries"), static_cast<double>(cache.stats().entries));

  const std::vector<metrics::FamilySnapshot> families = registry.Collect();
  const metrics::Series* info = metrics::FindSeries(families, "kvd_l1_info", {"regular"});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->value, 1);

  handles.clear();  // unregisters every family
  EXPECT_FALSE(registry.Has("kvd_l1_entries"));
  EXPECT_FALSE(registry.Has("kvd_l1_info"));
}

}  // namespace
}  // namespace kvd::l1
