// The metrics registry: owners register families, readers collect them generically; counters
// are rebased by ResetCounters (gauges and histograms are not); a collected family leaves
// with its handle; bad names and duplicates are refused at registration.
#include "common/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace kvd::metrics {
namespace {

TEST(MetricsRegistry, CollectsOwnedMetricsInRegistrationOrder) {
  Registry r;
  Counter& c = r.AddCounter("kvd_things_total", "Things.");
  Gauge& g = r.AddGauge("kvd_level", "Level.");
  Histogram& h = r.AddHistogram("kvd_wait_seconds", "Waits.", {0.1, 1.0});
  c.Add(3);
  g.Set(2.5);
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(7);
  const auto f = r.Collect();
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].desc.name, "kvd_things_total");
  EXPECT_EQ(f[0].desc.kind, Kind::kCounter);
  EXPECT_EQ(f[0].series.at(0).value, 3);
  EXPECT_EQ(f[1].series.at(0).value, 2.5);
  EXPECT_EQ(f[2].series.at(0).buckets, (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_DOUBLE_EQ(f[2].series.at(0).sum, 7.55);
  EXPECT_EQ(f[2].series.at(0).count(), 3u);
  EXPECT_EQ(ValueOf(f, "kvd_level"), 2.5);
  EXPECT_EQ(ValueOf(f, "kvd_absent", -1), -1);
}

TEST(MetricsRegistry, CollectedFamilyReadsItsOwnerAndLeavesWithItsHandle) {
  Registry r;
  uint64_t owner_state = 7;
  {
    CollectorHandle h = r.AddCollected({"kvd_per_model_total", "Per model.", Kind::kCounter, {"model"}, {}},
                                       [&](SeriesSink& sink) {
                                         sink.Add({"a"}, static_cast<double>(owner_state));
                                         sink.Add({"b"}, 1);
                                         sink.Add({"x", "too many"}, 9);  // dropped: 2 values, 1 label
                                       });
    EXPECT_TRUE(h.registered());
    owner_state = 11;
    const auto f = r.Collect();
    ASSERT_EQ(f.size(), 1u);
    ASSERT_EQ(f[0].series.size(), 2u);
    EXPECT_EQ(f[0].series[0].label_values, std::vector<std::string>{"a"});
    EXPECT_EQ(f[0].series[0].value, 11);
    ASSERT_NE(FindSeries(f, "kvd_per_model_total", {"b"}), nullptr);
    EXPECT_EQ(FindSeries(f, "kvd_per_model_total", {"b"})->value, 1);
    EXPECT_EQ(FindSeries(f, "kvd_per_model_total", {"c"}), nullptr);
    EXPECT_EQ(FindSeries(f, "kvd_absent", {"a"}), nullptr);
    EXPECT_TRUE(r.Has("kvd_per_model_total"));
  }
  EXPECT_FALSE(r.Has("kvd_per_model_total"));
  EXPECT_TRUE(r.Collect().empty());
}

TEST(MetricsRegistry, MovedHandleUnregistersOnce) {
  Registry r;
  CollectorHandle a = r.AddCollected({"kvd_a", "A.", Kind::kGauge, {}, {}}, [](SeriesSink& s) { s.Add(1); });
  CollectorHandle b = std::move(a);
  EXPECT_FALSE(a.registered());
  EXPECT_TRUE(r.Has("kvd_a"));
  b.Reset();
  EXPECT_FALSE(r.Has("kvd_a"));
  // The name is free again.
  CollectorHandle c = r.AddCollected({"kvd_a", "A.", Kind::kGauge, {}, {}}, [](SeriesSink& s) { s.Add(2); });
  EXPECT_EQ(ValueOf(r.Collect(), "kvd_a"), 2);
}

TEST(MetricsRegistry, ResetRebasesCountersOnlyPerSeries) {
  Registry r;
  Counter& c = r.AddCounter("kvd_c_total", "C.");
  Gauge& g = r.AddGauge("kvd_g", "G.");
  Histogram& h = r.AddHistogram("kvd_h", "H.", {1});
  double a = 10, b = 20;
  CollectorHandle lab = r.AddCollected({"kvd_l_total", "L.", Kind::kCounter, {"k"}, {}}, [&](SeriesSink& s) {
    s.Add({"a"}, a);
    s.Add({"b"}, b);
  });
  c.Add(5);
  g.Set(4);
  h.Observe(0.5);
  r.ResetCounters();
  c.Add(2);
  a = 13;
  b = 15;  // went down (an owner restarted its count): never below zero
  const auto f = r.Collect();
  EXPECT_EQ(ValueOf(f, "kvd_c_total"), 2);
  EXPECT_EQ(ValueOf(f, "kvd_g"), 4);  // gauges keep their value
  EXPECT_EQ(FindFamily(f, "kvd_h")->series[0].count(), 1u);  // histograms are not rebased
  const FamilySnapshot* l = FindFamily(f, "kvd_l_total");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->series[0].value, 3);
  EXPECT_EQ(l->series[1].value, 0);
}

TEST(MetricsRegistry, ConcurrentUpdatesAreAllCounted) {
  Registry r;
  Counter& c = r.AddCounter("kvd_n_total", "N.");
  Histogram& h = r.AddHistogram("kvd_v", "V.", {0.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.Add();
        h.Observe(1.0);
        if (i % 1000 == 0) (void)r.Collect();
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto f = r.Collect();
  EXPECT_EQ(ValueOf(f, "kvd_n_total"), 40000);
  EXPECT_EQ(FindFamily(f, "kvd_v")->series[0].buckets, (std::vector<uint64_t>{0, 40000}));
  EXPECT_DOUBLE_EQ(FindFamily(f, "kvd_v")->series[0].sum, 40000.0);
}

TEST(MetricsRegistryDeathTest, InvalidOrDuplicateNamesAbort) {
  EXPECT_DEATH({ Registry r; r.AddCounter("9starts_with_digit", "x"); }, "invalid family name");
  EXPECT_DEATH({ Registry r; r.AddGauge("has space", "x"); }, "invalid family name");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("kvd_dup_total", "x");
        r.AddCounter("kvd_dup_total", "y");
      },
      "registered twice");
  EXPECT_DEATH({ Registry r; r.AddHistogram("kvd_h", "x", {2, 1}); }, "not ascending");
}

}  // namespace
}  // namespace kvd::metrics
