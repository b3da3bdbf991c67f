// The dashboard's ring of samples: bounded, rates from consecutive samples on the
// monotonic clock, hit ratio null when nothing was looked up.
#include "http/timeseries.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace kvd::http {
namespace {

Sample At(double sec, uint64_t stored, uint64_t lookup_tokens, uint64_t hit_tokens,
          uint64_t requests) {
  Sample s;
  s.unix_ms = 1'700'000'000'000 + static_cast<int64_t>(sec * 1000);
  s.mono_seconds = sec;
  s.stored_bytes = stored;
  s.lookup_tokens = lookup_tokens;
  s.hit_tokens = hit_tokens;
  s.requests = requests;
  s.l1_used_bytes = stored;
  s.l1_capacity_bytes = 1000;
  return s;
}

TEST(TimeSeries, KeepsOnlyTheNewestSamples) {
  TimeSeries ts(3);
  for (int i = 0; i < 5; ++i) ts.Add(At(i, 0, 0, 0, 0));
  EXPECT_EQ(ts.size(), 3u);
  auto j = nlohmann::json::parse(ts.ToJson(0, 1.0));
  ASSERT_EQ(j["t"].size(), 3u);
  EXPECT_EQ(j["t"][0], 1'700'000'000'000 + 2000);
  EXPECT_EQ(j["capacity"], 3);
}

TEST(TimeSeries, RatesComeFromConsecutiveSamples) {
  TimeSeries ts(10);
  ts.Add(At(0, 0, 0, 0, 0));
  ts.Add(At(1, 100, 512, 256, 10));
  ts.Add(At(3, 500, 512, 256, 14));  // 2 s later, no lookups
  auto j = nlohmann::json::parse(ts.ToJson(0, 1.0));
  EXPECT_EQ(j["store_bytes_per_second"][0], 0.0);
  EXPECT_EQ(j["store_bytes_per_second"][1], 100.0);
  EXPECT_EQ(j["store_bytes_per_second"][2], 200.0);
  EXPECT_EQ(j["requests_per_second"][2], 2.0);
  EXPECT_TRUE(j["hit_ratio"][0].is_null());
  EXPECT_EQ(j["hit_ratio"][1], 0.5);
  EXPECT_TRUE(j["hit_ratio"][2].is_null());
  EXPECT_EQ(j["l1_usage_ratio"][2], 0.5);
}

TEST(TimeSeries, MaxPointsKeepsRatesOfTheFirstReturnedPoint) {
  TimeSeries ts(10);
  ts.Add(At(0, 0, 0, 0, 0));
  ts.Add(At(1, 100, 0, 0, 0));
  ts.Add(At(2, 300, 0, 0, 0));
  auto j = nlohmann::json::parse(ts.ToJson(2, 1.0));
  ASSERT_EQ(j["t"].size(), 2u);
  EXPECT_EQ(j["store_bytes_per_second"][0], 100.0);  // computed from the sample before it
  EXPECT_EQ(j["store_bytes_per_second"][1], 200.0);
}

TEST(TimeSeries, EmptySeriesIsValidJson) {
  TimeSeries ts(10);
  auto j = nlohmann::json::parse(ts.ToJson(0, 1.0));
  EXPECT_TRUE(j["t"].empty());
  EXPECT_TRUE(j["hit_ratio"].empty());
}

}  // namespace
}  // namespace kvd::http
