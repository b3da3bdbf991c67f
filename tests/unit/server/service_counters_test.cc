// ServiceCounters' registry families: lmcache's transfer counters per device, its
// copy-throughput histograms and the label tables' sizes, read from the tables at each
// collection; the overflow label set once something was counted under it; counters rebased
// by /metrics/reset, histograms and gauges not; gone when the handles are.
#include "server/service_counters.h"

#include <gtest/gtest.h>

namespace kvd::server {
namespace {

const metrics::FamilySnapshot& Family(const std::vector<metrics::FamilySnapshot>& all,
                                      const std::string& name) {
  const metrics::FamilySnapshot* f = metrics::FindFamily(all, name);
  EXPECT_NE(f, nullptr) << name;
  static const metrics::FamilySnapshot kNone;
  return f ? *f : kNone;
}

// The value of the series with `labels` (-1 when there is none).
double Value(const metrics::FamilySnapshot& f, const std::vector<std::string>& labels) {
  for (const auto& s : f.series) {
    if (s.label_values == labels) return s.value;
  }
  return -1;
}

TEST(ServiceCountersMetrics, TransfersPerDeviceAndTheOverflowSetOnceUsed) {
  ServiceCounters c(/*max_label_sets=*/1);
  metrics::Registry r;
  auto handles = c.RegisterMetrics(r, 256);
  TransferValues& cpu = c.transfers.Get({"cpu"});
  cpu.submitted_stores += 3;
  cpu.finished_stores += 2;
  cpu.submitted_retrieves += 5;
  cpu.finished_retrieves += 4;
  auto all = r.Collect();
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_submitted_stores_total"), {"cpu"}), 3);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_finished_stores_total"), {"cpu"}), 2);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_submitted_retrieves_total"), {"cpu"}), 5);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_finished_retrieves_total"), {"cpu"}), 4);
  EXPECT_EQ(Family(all, "lmcache_mp_num_submitted_stores_total").series.size(), 1u);  // no __other__ yet
  EXPECT_EQ(Value(Family(all, "kvd_metric_label_sets"), {"transfer"}), 1);
  EXPECT_EQ(Value(Family(all, "kvd_metric_label_sets_refused_total"), {"transfer"}), 0);

  // The table is full: a second device counts under __other__, which now shows.
  c.transfers.Get({"cuda:0"}).submitted_stores += 7;
  all = r.Collect();
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_submitted_stores_total"), {kOverflowLabel}), 7);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_submitted_stores_total"), {"cpu"}), 3);
  EXPECT_EQ(Value(Family(all, "kvd_metric_label_sets_refused_total"), {"transfer"}), 1);
  EXPECT_EQ(Value(Family(all, "kvd_metric_label_sets"), {"lookup"}), 0);

  // /metrics/reset rebases the counters per label set; the gauge keeps its value.
  r.ResetCounters();
  cpu.submitted_stores += 1;
  all = r.Collect();
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_submitted_stores_total"), {"cpu"}), 1);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_num_submitted_stores_total"), {kOverflowLabel}), 0);
  EXPECT_EQ(Value(Family(all, "kvd_metric_label_sets_refused_total"), {"transfer"}), 0);
  EXPECT_EQ(Value(Family(all, "kvd_metric_label_sets"), {"transfer"}), 1);

  handles.clear();
  EXPECT_FALSE(r.Has("lmcache_mp_num_submitted_stores_total"));
  EXPECT_FALSE(r.Has("kvd_metric_label_sets"));
}

TEST(ServiceCountersMetrics, ThroughputHistogramsPerLabelSetOnceSampledWithLmcachesBounds) {
  ServiceCounters c;
  metrics::Registry r;
  auto handles = c.RegisterMetrics(r, 256);
  ThroughputValues& v = c.throughput.Get({"cpu", "17", "llama"});
  v.store.Record(5'000'000'000, 1.0);  // 5 GB/s
  v.store.Record(6'000'000'000, 1.0);  // 6 GB/s
  c.throughput.Get({"cuda:0", "18", "llama"});  // a label set without samples
  auto all = r.Collect();
  const auto& store = Family(all, "lmcache_mp_l0_l1_store_throughput_GB_per_second");
  EXPECT_EQ(store.desc.kind, metrics::Kind::kHistogram);
  EXPECT_TRUE(store.desc.one_decimal_bounds);
  EXPECT_EQ(store.desc.bounds,
            std::vector<double>(kThroughputBoundsGBps.begin(), kThroughputBoundsGBps.end()));
  ASSERT_EQ(store.series.size(), 1u);  // cuda:0 has no sample
  const metrics::Series& s = store.series[0];
  EXPECT_EQ(s.label_values, (std::vector<std::string>{"cpu", "17", "llama"}));
  ASSERT_EQ(s.buckets.size(), kThroughputBoundsGBps.size() + 1);
  EXPECT_EQ(s.buckets[1], 1u);  // le 5
  EXPECT_EQ(s.buckets[2], 1u);  // le 10
  EXPECT_EQ(s.count(), 2u);
  EXPECT_DOUBLE_EQ(s.sum, 11);
  EXPECT_TRUE(Family(all, "lmcache_mp_l0_l1_load_throughput_GB_per_second").series.empty());
  // Histograms are not rebased by /metrics/reset.
  r.ResetCounters();
  all = r.Collect();
  EXPECT_EQ(Family(all, "lmcache_mp_l0_l1_store_throughput_GB_per_second").series.at(0).count(), 2u);
}

TEST(ServiceCountersMetrics, LookupsPerSaltAndModelInTokensWithEarlyExitsOnceTheyHappened) {
  ServiceCounters c(/*max_label_sets=*/2);
  metrics::Registry r;
  auto handles = c.RegisterMetrics(r, 256);
  LookupValues& a = c.lookups.Get({"llama", ""});
  a.lookups += 3;
  a.requested_chunks += 6;
  a.hit_l1_chunks += 1;
  a.hit_l2_chunks += 1;
  a.hit_l1_keys += 2;
  a.hit_l2_keys += 2;
  a.early_exits[static_cast<size_t>(EarlyExit::kEmptyChunkHashes)] += 1;
  LookupValues& b = c.lookups.Get({"llama", "tenant-1"});
  b.lookups += 1;
  b.requested_chunks += 2;
  auto all = r.Collect();
  const std::vector<std::string> la{"", "llama"}, lb{"tenant-1", "llama"};  // cache_salt, model_name
  EXPECT_EQ(Family(all, "lmcache_mp_lookups_requests_total").desc.label_names,
            (std::vector<std::string>{"cache_salt", "model_name"}));
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookups_requests_total"), la), 3);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookups_requests_total"), lb), 1);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_requested_tokens_total"), la), 1536);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_requested_tokens_total"), lb), 512);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_hit_tokens_total"), la), 512);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_hit_tokens_total"), lb), 0);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_hit_l1_tokens_total"), la), 256);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_hit_l2_tokens_total"), la), 256);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_hit_l1_keys_total"), la), 2);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookup_hit_l2_keys_total"), lb), 0);
  const auto& exits = Family(all, "lmcache_mp_lookup_early_exit_requests_total");
  ASSERT_EQ(exits.series.size(), 1u) << "a reason appears once it happened";
  EXPECT_EQ(exits.series[0].label_values, (std::vector<std::string>{"", "llama", "empty_chunk_hashes"}));
  EXPECT_EQ(exits.series[0].value, 1);
  EXPECT_EQ(Family(all, "lmcache_mp_lookups_requests_total").series.size(), 2u) << "no __other__ yet";
  // A third label set: the table is full, it counts under __other__, which now shows.
  c.lookups.Get({"mistral", ""}).lookups += 4;
  all = r.Collect();
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookups_requests_total"), {kOverflowLabel, kOverflowLabel}), 4);
  EXPECT_EQ(Value(Family(all, "kvd_metric_label_sets_refused_total"), {"lookup"}), 1);
  // /metrics/reset: per label set, from zero.
  r.ResetCounters();
  a.lookups += 1;
  all = r.Collect();
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookups_requests_total"), la), 1);
  EXPECT_EQ(Value(Family(all, "lmcache_mp_lookups_requests_total"), lb), 0);
}

}  // namespace
}  // namespace kvd::server
