// RequestMetrics: per-operation request counts, in-flight gauges and latency histograms
// for the ZMQ front end. The socket loop calls Begin when a request is decoded and End
// when its reply is ready (so latency includes time queued on a lane or the pool).
//
// Threads: Begin/End/Snapshot may run concurrently from any thread; every counter is a
// relaxed atomic, so the hot path takes no lock and allocates nothing. A Snapshot is not
// atomic across counters (a request may show in `requests` but not yet in the histogram
// sum); each counter on its own is monotonic.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "wire/ops.h"

namespace kvd::server {

class RequestMetrics {
 public:
  // Upper bounds (seconds) of the latency buckets; a final +Inf bucket is implied.
  static constexpr std::array<double, 19> kLatencyBounds = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,     0.1,     0.25,   0.5,     1.0,    2.5,   5.0,    10.0};
  static constexpr size_t kMaxOps = 64;

  struct OpSnapshot {
    std::string name;                 // wire op name, e.g. "store"
    uint64_t requests = 0;            // completed requests
    uint64_t in_flight = 0;           // begun, not yet completed
    std::vector<uint64_t> buckets;    // per bucket (NOT cumulative); size kLatencyBounds + 1
    double latency_sum_seconds = 0;
  };

  // Returns the start time to hand to End.
  int64_t Begin(wire::Op op);
  void End(wire::Op op, int64_t begin_ns);
  // A request whose op frame could not be decoded.
  void CountUnknownOp() { unknown_ops_.fetch_add(1, std::memory_order_relaxed); }

  // Ops that have seen at least one request, in op-table order.
  std::vector<OpSnapshot> Snapshot() const;
  uint64_t unknown_ops() const { return unknown_ops_.load(std::memory_order_relaxed); }

  // Counts one completed request that took `seconds` (for tests and callers that time
  // requests themselves).
  void Record(wire::Op op, double seconds);

 private:
  struct PerOp {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> begun{0};
    std::atomic<uint64_t> sum_ns{0};
    std::array<std::atomic<uint64_t>, kLatencyBounds.size() + 1> buckets{};
  };
  void Finish(PerOp& p, int64_t ns);

  std::array<PerOp, kMaxOps> ops_{};
  std::atomic<uint64_t> unknown_ops_{0};
};

}  // namespace kvd::server
