// RequestMetrics' registered families: per-op counts, in-flight gauges and latency
// histograms, the phases a request went through, refusals, unknown ops and the loop's
// wake-ups, as /metrics and /status read them.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kvd::server {
namespace {

using wire::Op;

class RequestMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override { m_.RegisterMetrics(registry_); }
  const metrics::Series* Series(const std::string& name, const std::vector<std::string>& labels) {
    families_ = registry_.Collect();
    return metrics::FindSeries(families_, name, labels);
  }
  double Value(const std::string& name, const std::vector<std::string>& labels = {}) {
    const metrics::Series* s = Series(name, labels);
    return s ? s->value : -1;
  }

  metrics::Registry registry_;  // outlives m_, which unregisters from it
  RequestMetrics m_;
  std::vector<metrics::FamilySnapshot> families_;
};

TEST_F(RequestMetricsTest, OpsShowOnceTheyHaveSeenARequest) {
  EXPECT_EQ(Series("kvd_requests_total", {"store"}), nullptr);
  const int64_t begun = m_.Begin(Op::kStore);
  EXPECT_EQ(Value("kvd_requests_total", {"store"}), 0);
  EXPECT_EQ(Value("kvd_requests_in_flight", {"store"}), 1);
  m_.End(Op::kStore, begun);
  m_.Record(Op::kStore, 0.003);  // counted as a second completed request (bucket le=0.005)
  EXPECT_EQ(Value("kvd_requests_total", {"store"}), 1 + 1);
  EXPECT_EQ(Value("kvd_requests_in_flight", {"store"}), 0);
  const metrics::Series* h = Series("kvd_request_duration_seconds", {"store"});
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->count(), 2u);
  const auto& bounds = metrics::FindFamily(families_, "kvd_request_duration_seconds")->desc.bounds;
  ASSERT_EQ(bounds.size(), RequestMetrics::kLatencyBounds.size());
  ASSERT_EQ(h->buckets.size(), bounds.size() + 1);
  const size_t b5ms = static_cast<size_t>(std::find(bounds.begin(), bounds.end(), 0.005) - bounds.begin());
  EXPECT_GE(h->buckets[b5ms], 1u);
  EXPECT_GE(h->sum, 0.003);
  EXPECT_EQ(Series("kvd_requests_total", {"lookup"}), nullptr);
}

TEST_F(RequestMetricsTest, PhasesRefusalsUnknownOpsAndTheLoop) {
  PhaseTotals phases;
  phases.ns[static_cast<size_t>(Phase::kCopy)] = 2'000'000;  // 2 ms
  m_.Record(Op::kStore, 0.004);
  m_.RecordPhases(Op::kStore, phases);
  m_.CountRefused(Op::kStore);
  m_.CountUnknownOp();
  m_.RecordLoopIteration(1'000'000);
  m_.RecordLoopIteration(5'000'000);
  m_.RecordInline(Op::kLookup, 300'000);
  const metrics::Series* copy = Series("kvd_request_phase_seconds", {"store", "copy"});
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->count(), 1u);
  EXPECT_DOUBLE_EQ(copy->sum, 0.002);
  // Phases an op never went through have no series.
  EXPECT_EQ(Series("kvd_request_phase_seconds", {"store", "hash"}), nullptr);
  EXPECT_EQ(Value("kvd_requests_refused_total", {"store"}), 1);
  EXPECT_EQ(Value("kvd_unknown_op_requests_total"), 1);
  const metrics::Series* loop = Series("kvd_request_loop_wakeup_seconds", {});
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->count(), 2u);
  EXPECT_DOUBLE_EQ(Value("kvd_request_loop_longest_wakeup_seconds"), 0.005);
  EXPECT_DOUBLE_EQ(Value("kvd_request_loop_longest_inline_seconds", {"lookup"}), 0.0003);

  // A reset rebases the counters; histograms and gauges stay absolute.
  registry_.ResetCounters();
  EXPECT_EQ(Value("kvd_requests_total", {"store"}), 0);
  EXPECT_EQ(Value("kvd_requests_refused_total", {"store"}), 0);
  EXPECT_EQ(Value("kvd_unknown_op_requests_total"), 0);
  EXPECT_EQ(Series("kvd_request_duration_seconds", {"store"})->count(), 1u);
  EXPECT_DOUBLE_EQ(Value("kvd_request_loop_longest_wakeup_seconds"), 0.005);
}

}  // namespace
}  // namespace kvd::server
