// The Prometheus exposition of the registry's families: well-formed families, a histogram
// whose buckets are cumulative and whose count matches +Inf, escaped label values. (Which
// families exist, with which values, is tested where they are registered: l1_metrics_test,
// service_counters_test, request_metrics_test, kv_service_test, ...)
#include "http/prometheus.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "fake_source.h"

namespace kvd::http {
namespace {

// name{labels} -> value, ignoring comments.
std::map<std::string, std::string> Parse(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    auto sp = line.rfind(' ');
    out[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return out;
}

TEST(Prometheus, EverySeriesCarriesItsSnapshotValue) {
  auto m = Parse(RenderPrometheus(SampleSnapshot()));
  EXPECT_EQ(m["lmcache_mp_l1_write_chunks_total"], "12");
  EXPECT_EQ(m["lmcache_mp_l1_memory_usage_bytes"], "250");
  EXPECT_EQ(m["kvd_stored_bytes_total"], std::to_string(12 << 20));
  EXPECT_EQ(m["kvd_uptime_seconds"], "42.5");
  EXPECT_EQ(m["lmcache_mp_lookups_requests_total{cache_salt=\"tenant\",model_name=\"m\"}"], "2");
  EXPECT_EQ(m["kvd_build_info{version=\"1.2.3\",lmcache_protocol=\"0.5.6\"}"], "1");
}

TEST(Prometheus, PerOpHistogramIsCumulativeAndConsistent) {
  auto m = Parse(RenderPrometheus(SampleSnapshot()));
  EXPECT_EQ(m["kvd_requests_total{op=\"store\"}"], "10");
  EXPECT_EQ(m["kvd_requests_in_flight{op=\"store\"}"], "1");
  EXPECT_EQ(m["kvd_request_duration_seconds_bucket{op=\"store\",le=\"0.001\"}"], "6");
  EXPECT_EQ(m["kvd_request_duration_seconds_bucket{op=\"store\",le=\"0.01\"}"], "9");
  EXPECT_EQ(m["kvd_request_duration_seconds_bucket{op=\"store\",le=\"0.1\"}"], "10");
  EXPECT_EQ(m["kvd_request_duration_seconds_bucket{op=\"store\",le=\"+Inf\"}"], "10");
  EXPECT_EQ(m["kvd_request_duration_seconds_count{op=\"store\"}"], "10");
  EXPECT_EQ(std::stod(m["kvd_request_duration_seconds_sum{op=\"store\"}"]), 0.02);
  EXPECT_EQ(m["kvd_request_duration_seconds_bucket{op=\"lookup\",le=\"+Inf\"}"], "4");
}

TEST(Prometheus, PhaseSeriesExplainWhereARequestsTimeWent) {
  auto m = Parse(RenderPrometheus(SampleSnapshot()));
  EXPECT_EQ(m["kvd_request_phase_seconds_bucket{op=\"store\",phase=\"decode\",le=\"0.001\"}"], "10");
  EXPECT_EQ(m["kvd_request_phase_seconds_bucket{op=\"store\",phase=\"copy\",le=\"0.001\"}"], "2");
  EXPECT_EQ(m["kvd_request_phase_seconds_bucket{op=\"store\",phase=\"copy\",le=\"0.01\"}"], "9");
  EXPECT_EQ(m["kvd_request_phase_seconds_bucket{op=\"store\",phase=\"copy\",le=\"+Inf\"}"], "10");
  EXPECT_EQ(m["kvd_request_phase_seconds_count{op=\"store\",phase=\"copy\"}"], "10");
  EXPECT_EQ(std::stod(m["kvd_request_phase_seconds_sum{op=\"store\",phase=\"copy\"}"]), 0.015);
}

TEST(Prometheus, EveryFamilyHasHelpAndTypeOnce) {
  std::string text = RenderPrometheus(SampleSnapshot());
  std::istringstream in(text);
  std::map<std::string, int> types;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) types[line.substr(7, line.find(' ', 7) - 7)]++;
  }
  for (const auto& [name, n] : types) EXPECT_EQ(n, 1) << name;
  EXPECT_TRUE(types.count("kvd_request_duration_seconds"));
  EXPECT_TRUE(types.count("lmcache_mp_l1_write_chunks_total"));
  // Every sample line belongs to a declared family.
  std::istringstream in2(text);
  for (std::string line; std::getline(in2, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!types.count(name) && name.size() > strlen(suffix) &&
          name.compare(name.size() - strlen(suffix), strlen(suffix), suffix) == 0) {
        name = name.substr(0, name.size() - strlen(suffix));
      }
    }
    EXPECT_TRUE(types.count(name)) << line;
  }
}

TEST(Prometheus, LabelValuesAreEscaped) {
  Snapshot s;
  SetValue(s, "kvd_build_info", metrics::Kind::kGauge, 1, {"version"}, {"a\"b\\c\nd"});
  std::string text = RenderPrometheus(s);
  EXPECT_NE(text.find("version=\"a\\\"b\\\\c\\nd\""), std::string::npos);
}

// Client-chosen label values (model names, salts) may hold anything: quotes, backslashes and
// line feeds are escaped, bytes that are not UTF-8 become U+FFFD, and the line stays one line.
TEST(Prometheus, ClientLabelValuesAreEscapedAndKeptOnOneLine) {
  metrics::Registry r;
  metrics::CollectorHandle h = r.AddCollected(
      {"lmcache_mp_lookups_requests_total", "LOOKUP requests.", metrics::Kind::kCounter,
       {"cache_salt", "model_name"}, {}},
      [](metrics::SeriesSink& sink) {
        sink.Add({std::string("caf\xc3\xa9 \xff\xc3", 8), "org/\"quoted\"\\model\nline2"}, 7);
      });
  Snapshot s;
  s.families = r.Collect();
  const std::string text = RenderPrometheus(s);
  const std::string want =
      "lmcache_mp_lookups_requests_total{cache_salt=\"caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd\","
      "model_name=\"org/\\\"quoted\\\"\\\\model\\nline2\"} 7\n";
  EXPECT_NE(text.find(want), std::string::npos) << text.substr(0, 2000);
}

TEST(EscapeLabelValue, FollowsTheTextFormat) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\"b"), "a\\\"b");
  EXPECT_EQ(EscapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeLabelValue("a\nb"), "a\\nb");
  EXPECT_EQ(EscapeLabelValue("tab\there"), "tab\there");  // only \\, \" and \n are escaped
  EXPECT_EQ(EscapeLabelValue("\xe2\x82\xac \xf0\x9f\x99\x82"), "\xe2\x82\xac \xf0\x9f\x99\x82");
  // Overlong, surrogate, truncated and stray bytes: one U+FFFD per byte.
  EXPECT_EQ(EscapeLabelValue("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(EscapeLabelValue("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(EscapeLabelValue("x\xe2\x82"), "x\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(EscapeLabelValue("\x80"), "\xef\xbf\xbd");
}

TEST(Prometheus, OneDecimalBoundsAreWrittenAsLmcachesExporterWritesThem) {
  // lmcache's copy-throughput histograms (ServiceCounters::RegisterMetrics) write "5.0".
  metrics::Registry r;
  metrics::FamilyDesc d{"lmcache_mp_l0_l1_store_throughput_GB_per_second", "GB/s.",
                        metrics::Kind::kHistogram, {"device", "engine_id", "model_name"}, {0, 5, 10}};
  d.one_decimal_bounds = true;
  metrics::CollectorHandle h = r.AddCollected(std::move(d), [](metrics::SeriesSink& s) {
    s.AddHistogram({"cpu", "17", "llama"}, {0, 2, 1, 0}, 12.5);
  });
  Snapshot snap;
  snap.families = r.Collect();
  auto m = Parse(RenderPrometheus(snap));
  const std::string n = "lmcache_mp_l0_l1_store_throughput_GB_per_second";
  const std::string l = "device=\"cpu\",engine_id=\"17\",model_name=\"llama\"";
  EXPECT_EQ(m[n + "_bucket{" + l + ",le=\"0.0\"}"], "0");
  EXPECT_EQ(m[n + "_bucket{" + l + ",le=\"5.0\"}"], "2");
  EXPECT_EQ(m[n + "_bucket{" + l + ",le=\"10.0\"}"], "3");
  EXPECT_EQ(m[n + "_bucket{" + l + ",le=\"+Inf\"}"], "3");
  EXPECT_EQ(m[n + "_count{" + l + "}"], "3");
  EXPECT_EQ(std::stod(m[n + "_sum{" + l + "}"]), 12.5);
  EXPECT_EQ(m.count(n + "_bucket{" + l + ",le=\"5\"}"), 0u);
}

TEST(Prometheus, EmptySnapshotRendersNothing) {
  EXPECT_EQ(RenderPrometheus(Snapshot{}), "");
}

TEST(Prometheus, RegistryFamiliesAreRenderedGenerically) {
  metrics::Registry r;
  r.AddCounter("kvd_example_total", "Examples.").Add(4);
  metrics::Histogram& h = r.AddHistogram("kvd_example_seconds", "Example waits.", {0.5, 2});
  h.Observe(0.25);
  h.Observe(1);
  h.Observe(3);
  metrics::CollectorHandle labelled = r.AddCollected(
      {"kvd_example_models", "Per model.", metrics::Kind::kGauge, {"model_name"}, {}},
      [](metrics::SeriesSink& s) { s.Add({"org/\"m\""}, 2); });
  Snapshot snap;
  snap.families = r.Collect();
  const std::string text = RenderPrometheus(snap);
  auto m = Parse(text);
  EXPECT_EQ(m["kvd_example_total"], "4");
  EXPECT_NE(text.find("# TYPE kvd_example_total counter"), std::string::npos);
  EXPECT_NE(text.find("# HELP kvd_example_seconds Example waits."), std::string::npos);
  EXPECT_EQ(m["kvd_example_seconds_bucket{le=\"0.5\"}"], "1");
  EXPECT_EQ(m["kvd_example_seconds_bucket{le=\"2\"}"], "2");
  EXPECT_EQ(m["kvd_example_seconds_bucket{le=\"+Inf\"}"], "3");
  EXPECT_EQ(m["kvd_example_seconds_count"], "3");
  EXPECT_EQ(m["kvd_example_seconds_sum"], "4.25");
  EXPECT_EQ(m["kvd_example_models{model_name=\"org/\\\"m\\\"\"}"], "2");
}

TEST(HistogramQuantile, InterpolatesInsideTheBucket) {
  std::vector<double> bounds = {1, 2, 4};
  EXPECT_EQ(HistogramQuantile(bounds, {0, 0, 0, 0}, 0.5), 0);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {10, 0, 0, 0}, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {0, 10, 0, 0}, 0.5), 1.5);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {5, 0, 5, 0}, 0.99), 2 + 2 * 0.98);
  // Beyond the last finite bound: report that bound.
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {0, 0, 0, 3}, 0.5), 4);
}

}  // namespace
}  // namespace kvd::http
