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

#include "common/metrics.h"
#include "server/request_phases.h"
#include "wire/ops.h"

namespace kvd::server {

class RequestMetrics {
 public:
  // Upper bounds (seconds) of the latency buckets; a final +Inf bucket is implied.
  static constexpr std::array<double, 19> kLatencyBounds = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,     0.1,     0.25,   0.5,     1.0,    2.5,   5.0,    10.0};
  static constexpr size_t kMaxOps = 64;

  struct PhaseSnapshot {
    std::string name;                 // kPhaseNames: "queue", "decode", ..., "reply"
    std::vector<uint64_t> buckets;    // per bucket (NOT cumulative); size kLatencyBounds + 1
    double sum_seconds = 0;
  };
  struct OpSnapshot {
    std::string name;                 // wire op name, e.g. "store"
    uint64_t requests = 0;            // completed requests
    uint64_t in_flight = 0;           // begun, not yet completed
    std::vector<uint64_t> buckets;    // per bucket (NOT cumulative); size kLatencyBounds + 1
    double latency_sum_seconds = 0;
    std::vector<PhaseSnapshot> phases;  // phases this op's requests went through
    uint64_t refused = 0;             // refused unread: its connection had too much queued
  };
  // The socket thread's loop: time from a wake-up to the next wait, i.e. how long one
  // wake-up kept every client waiting (wall clock: being descheduled counts too; the
  // thread's CPU clock costs a system call, too much per request).
  struct LoopSnapshot {
    uint64_t iterations = 0;
    std::vector<uint64_t> buckets;    // wall time per iteration, per bucket (NOT cumulative)
    double sum_seconds = 0;
    double longest_seconds = 0;
    // The longest single request run on the loop's thread (an inline op).
    double longest_inline_seconds = 0;
    std::string longest_inline_op;    // its op name ("" before the first)
  };

  // Returns the start time to hand to End, which returns the request's duration (ns).
  int64_t Begin(wire::Op op);
  int64_t End(wire::Op op, int64_t begin_ns);
  // A request whose op frame could not be decoded.
  void CountUnknownOp() { unknown_ops_.fetch_add(1, std::memory_order_relaxed); }
  // A message dropped unanswered: fewer frames than [uid, op], or a uid frame over
  // wire::kMaxRequestUidBytes (a reply would echo it).
  void CountMalformedMessage() { malformed_messages_.fetch_add(1, std::memory_order_relaxed); }

  // Ops that have seen at least one request, in op-table order.
  std::vector<OpSnapshot> Snapshot() const;
  uint64_t unknown_ops() const { return unknown_ops_.load(std::memory_order_relaxed); }

  // Counts one completed request that took `seconds` (for tests and callers that time
  // requests themselves).
  void Record(wire::Op op, double seconds);

  // Server time per phase of one completed request (phases with 0 ns did not occur).
  void RecordPhases(wire::Op op, const PhaseTotals& phases);
  // A request refused without being run (per-connection queue bound).
  void CountRefused(wire::Op op);
  // One wake-up of the socket loop, and one request run inline during a wake-up.
  void RecordLoopIteration(int64_t wall_ns);
  void RecordInline(wire::Op op, int64_t wall_ns);
  LoopSnapshot Loop() const;

  // The request socket's connections (net/zmtp_router.h): published by the loop's thread
  // after each wake-up, read by any thread.
  struct TransportSnapshot {
    uint64_t connections = 0;      // open now
    uint64_t accepted = 0;         // since start
    uint64_t closed = 0;
    uint64_t protocol_errors = 0;  // closed for breaking ZMTP or a size limit
    uint64_t handshake_timeouts = 0;  // closed for not finishing the handshake in time
    uint64_t dropped_replies = 0;  // not sent: client gone, or not reading its replies
    // Closed per reason (net::ZmtpRouter::CloseReason order: peer, protocol_error,
    // handshake_timeout, evicted); they add up to `closed`.
    std::array<uint64_t, 4> closed_by{};
    // New connections closed at once (RejectReason order: per_address, total, descriptors).
    std::array<uint64_t, 3> rejected{};
    uint64_t accept_pauses = 0;    // accepting paused for lack of descriptors or memory
  };
  void SetTransport(const TransportSnapshot& t);
  TransportSnapshot Transport() const;

  // Registers the request families (kvd_requests_total, kvd_requests_in_flight,
  // kvd_requests_refused_total and kvd_request_duration_seconds per op,
  // kvd_request_phase_seconds per op and phase, kvd_unknown_op_requests_total, the
  // kvd_request_loop_* families) and the connection families (kvd_zmtp_*) with `registry`,
  // which must outlive this object; they are removed when it is destroyed. Call once. An op
  // shows once it has seen a request.
  void RegisterMetrics(metrics::Registry& registry);

 private:
  void RegisterRequestFamilies(metrics::Registry& registry);
  struct Histogram {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> sum_ns{0};
    std::array<std::atomic<uint64_t>, kLatencyBounds.size() + 1> buckets{};
    void Add(int64_t ns);
    std::vector<uint64_t> Buckets() const;
  };
  struct PerOp {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> begun{0};
    std::atomic<uint64_t> sum_ns{0};
    std::atomic<uint64_t> refused{0};
    std::array<std::atomic<uint64_t>, kLatencyBounds.size() + 1> buckets{};
    std::array<Histogram, kNumPhases> phases{};
  };
  void Finish(PerOp& p, int64_t ns);

  std::array<PerOp, kMaxOps> ops_{};
  std::atomic<uint64_t> unknown_ops_{0};
  std::atomic<uint64_t> malformed_messages_{0};
  Histogram loop_;
  std::atomic<int64_t> loop_longest_ns_{0};
  std::atomic<int64_t> inline_longest_ns_{0};
  std::atomic<int> inline_longest_op_{-1};  // op of inline_longest_ns_
  std::atomic<uint64_t> transport_connections_{0}, transport_accepted_{0}, transport_closed_{0},
      transport_protocol_errors_{0}, transport_dropped_{0}, transport_handshake_timeouts_{0},
      transport_evicted_{0}, transport_accept_pauses_{0};
  std::array<std::atomic<uint64_t>, 4> transport_closed_by_{};
  std::array<std::atomic<uint64_t>, 3> transport_rejected_{};
  std::vector<metrics::CollectorHandle> metric_handles_;  // last: unregistered first
};

}  // namespace kvd::server
