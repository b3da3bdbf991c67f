#include "server/metrics.h"

#include <chrono>
#include <tuple>

#include "net/zmtp_router.h"

namespace kvd::server {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t Index(wire::Op op) {
  size_t i = static_cast<size_t>(op);
  return i < RequestMetrics::kMaxOps ? i : RequestMetrics::kMaxOps - 1;
}

}  // namespace

int64_t RequestMetrics::Begin(wire::Op op) {
  ops_[Index(op)].begun.fetch_add(1, std::memory_order_relaxed);
  return NowNs();
}

int64_t RequestMetrics::End(wire::Op op, int64_t begin_ns) {
  const int64_t ns = NowNs() - begin_ns;
  Finish(ops_[Index(op)], ns);
  return ns;
}

void RequestMetrics::Record(wire::Op op, double seconds) {
  PerOp& p = ops_[Index(op)];
  p.begun.fetch_add(1, std::memory_order_relaxed);
  Finish(p, static_cast<int64_t>(seconds * 1e9));
}

namespace {

size_t BucketOf(int64_t ns) {
  const double s = static_cast<double>(ns) * 1e-9;
  size_t b = 0;
  while (b < RequestMetrics::kLatencyBounds.size() && s > RequestMetrics::kLatencyBounds[b]) ++b;
  return b;
}

void RaiseTo(std::atomic<int64_t>& max, int64_t v) {
  int64_t cur = max.load(std::memory_order_relaxed);
  while (v > cur && !max.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

void RequestMetrics::Histogram::Add(int64_t ns) {
  buckets[BucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
  sum_ns.fetch_add(static_cast<uint64_t>(ns > 0 ? ns : 0), std::memory_order_relaxed);
  count.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> RequestMetrics::Histogram::Buckets() const {
  std::vector<uint64_t> out;
  out.reserve(buckets.size());
  for (const auto& b : buckets) out.push_back(b.load(std::memory_order_relaxed));
  return out;
}

void RequestMetrics::RecordPhases(wire::Op op, const PhaseTotals& phases) {
  PerOp& p = ops_[Index(op)];
  for (size_t i = 0; i < kNumPhases; ++i) {
    if (phases.ns[i] > 0) p.phases[i].Add(phases.ns[i]);
  }
}

void RequestMetrics::CountRefused(wire::Op op) {
  ops_[Index(op)].refused.fetch_add(1, std::memory_order_relaxed);
}

void RequestMetrics::RecordLoopIteration(int64_t wall_ns) {
  loop_.Add(wall_ns);
  RaiseTo(loop_longest_ns_, wall_ns);
}

void RequestMetrics::RecordInline(wire::Op op, int64_t wall_ns) {
  // Called from the loop's thread only, so the op and the maximum stay consistent.
  if (wall_ns > inline_longest_ns_.load(std::memory_order_relaxed)) {
    inline_longest_op_.store(static_cast<int>(op), std::memory_order_relaxed);
    inline_longest_ns_.store(wall_ns, std::memory_order_relaxed);
  }
}

RequestMetrics::LoopSnapshot RequestMetrics::Loop() const {
  LoopSnapshot s;
  s.iterations = loop_.count.load(std::memory_order_relaxed);
  s.buckets = loop_.Buckets();
  s.sum_seconds = static_cast<double>(loop_.sum_ns.load(std::memory_order_relaxed)) * 1e-9;
  s.longest_seconds = static_cast<double>(loop_longest_ns_.load()) * 1e-9;
  s.longest_inline_seconds = static_cast<double>(inline_longest_ns_.load()) * 1e-9;
  const int op = inline_longest_op_.load();
  if (op >= 0) s.longest_inline_op = std::string(wire::InfoOf(static_cast<wire::Op>(op)).name);
  return s;
}

void RequestMetrics::SetTransport(const TransportSnapshot& t) {
  transport_connections_.store(t.connections, std::memory_order_relaxed);
  transport_accepted_.store(t.accepted, std::memory_order_relaxed);
  transport_closed_.store(t.closed, std::memory_order_relaxed);
  transport_protocol_errors_.store(t.protocol_errors, std::memory_order_relaxed);
  transport_dropped_.store(t.dropped_replies, std::memory_order_relaxed);
  transport_handshake_timeouts_.store(t.handshake_timeouts, std::memory_order_relaxed);
  for (size_t i = 0; i < t.closed_by.size(); ++i) transport_closed_by_[i].store(t.closed_by[i], std::memory_order_relaxed);
  for (size_t i = 0; i < t.rejected.size(); ++i) transport_rejected_[i].store(t.rejected[i], std::memory_order_relaxed);
  transport_evicted_.store(t.closed_by[static_cast<size_t>(net::ZmtpRouter::CloseReason::kEvicted)],
                           std::memory_order_relaxed);
  transport_accept_pauses_.store(t.accept_pauses, std::memory_order_relaxed);
}

RequestMetrics::TransportSnapshot RequestMetrics::Transport() const {
  TransportSnapshot t;
  t.connections = transport_connections_.load(std::memory_order_relaxed);
  t.accepted = transport_accepted_.load(std::memory_order_relaxed);
  t.closed = transport_closed_.load(std::memory_order_relaxed);
  t.protocol_errors = transport_protocol_errors_.load(std::memory_order_relaxed);
  t.dropped_replies = transport_dropped_.load(std::memory_order_relaxed);
  t.handshake_timeouts = transport_handshake_timeouts_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < t.closed_by.size(); ++i) t.closed_by[i] = transport_closed_by_[i].load(std::memory_order_relaxed);
  for (size_t i = 0; i < t.rejected.size(); ++i) t.rejected[i] = transport_rejected_[i].load(std::memory_order_relaxed);
  t.accept_pauses = transport_accept_pauses_.load(std::memory_order_relaxed);
  return t;
}

void RequestMetrics::Finish(PerOp& p, int64_t ns) {
  const double s = static_cast<double>(ns) * 1e-9;
  size_t b = 0;
  while (b < kLatencyBounds.size() && s > kLatencyBounds[b]) ++b;
  p.buckets[b].fetch_add(1, std::memory_order_relaxed);
  p.sum_ns.fetch_add(static_cast<uint64_t>(ns > 0 ? ns : 0), std::memory_order_relaxed);
  p.requests.fetch_add(1, std::memory_order_release);
}

std::vector<RequestMetrics::OpSnapshot> RequestMetrics::Snapshot() const {
  std::vector<OpSnapshot> out;
  for (const wire::OpInfo& info : wire::Lmcache056Ops()) {
    const PerOp& p = ops_[Index(info.op)];
    // requests before begun: begun is incremented first, so in_flight never underflows.
    const uint64_t requests = p.requests.load(std::memory_order_acquire);
    const uint64_t begun = p.begun.load(std::memory_order_acquire);
    if (begun == 0) continue;
    OpSnapshot s;
    s.name = std::string(info.name);
    s.requests = requests;
    s.in_flight = begun > s.requests ? begun - s.requests : 0;
    s.buckets.reserve(p.buckets.size());
    for (const auto& b : p.buckets) s.buckets.push_back(b.load(std::memory_order_relaxed));
    s.latency_sum_seconds = static_cast<double>(p.sum_ns.load(std::memory_order_relaxed)) * 1e-9;
    s.refused = p.refused.load(std::memory_order_relaxed);
    for (size_t i = 0; i < kNumPhases; ++i) {
      const Histogram& h = p.phases[i];
      if (h.count.load(std::memory_order_relaxed) == 0) continue;
      s.phases.push_back({kPhaseNames[i], h.Buckets(),
                          static_cast<double>(h.sum_ns.load(std::memory_order_relaxed)) * 1e-9});
    }
    out.push_back(std::move(s));
  }
  return out;
}

void RequestMetrics::RegisterRequestFamilies(metrics::Registry& registry) {
  using metrics::Kind;
  const std::vector<double> bounds(kLatencyBounds.begin(), kLatencyBounds.end());
  // One family per op-wide value; each collection reads the ops that have seen requests.
  auto per_op = [&](metrics::FamilyDesc desc, auto add) {
    metric_handles_.push_back(registry.AddCollected(std::move(desc), [this, add](metrics::SeriesSink& sink) {
      for (const OpSnapshot& o : Snapshot()) add(sink, o);
    }));
  };
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_unknown_op_requests_total", "Requests whose op kvd does not know.", Kind::kCounter, {}, {}},
      [this](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(unknown_ops())); }));
  per_op({"kvd_requests_total", "Requests completed, per operation.", Kind::kCounter, {"op"}, {}},
         [](metrics::SeriesSink& sink, const OpSnapshot& o) { sink.Add({o.name}, static_cast<double>(o.requests)); });
  per_op({"kvd_requests_in_flight", "Requests received and not yet answered.", Kind::kGauge, {"op"}, {}},
         [](metrics::SeriesSink& sink, const OpSnapshot& o) { sink.Add({o.name}, static_cast<double>(o.in_flight)); });
  per_op({"kvd_request_duration_seconds",
          "Time from receiving a request to its reply being ready, per operation.", Kind::kHistogram, {"op"},
          bounds},
         [](metrics::SeriesSink& sink, const OpSnapshot& o) {
           sink.AddHistogram({o.name}, o.buckets, o.latency_sum_seconds);
         });
  per_op({"kvd_request_phase_seconds",
          "Server time per request in each phase (queue, decode, hash, index, copy, reply), per operation.",
          Kind::kHistogram, {"op", "phase"}, bounds},
         [](metrics::SeriesSink& sink, const OpSnapshot& o) {
           for (const PhaseSnapshot& p : o.phases) sink.AddHistogram({o.name, p.name}, p.buckets, p.sum_seconds);
         });
  per_op({"kvd_requests_refused_total",
          "Requests answered with a failure without running: their connection had too many bytes of "
          "requests queued.",
          Kind::kCounter, {"op"}, {}},
         [](metrics::SeriesSink& sink, const OpSnapshot& o) { sink.Add({o.name}, static_cast<double>(o.refused)); });
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_request_loop_wakeup_seconds",
       "Wall time of one wake-up of the request loop's thread (reading, inline requests, sending replies): "
       "how long it kept every client waiting.",
       Kind::kHistogram, {}, bounds},
      [this](metrics::SeriesSink& sink) {
        LoopSnapshot l = Loop();
        sink.AddHistogram({}, std::move(l.buckets), l.sum_seconds);
      }));
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_request_loop_longest_wakeup_seconds",
       "Longest wake-up of the request loop's thread since start (wall clock).", Kind::kGauge, {}, {}},
      [this](metrics::SeriesSink& sink) { sink.Add(Loop().longest_seconds); }));
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_request_loop_longest_inline_seconds",
       "Longest single request the request loop's thread ran itself since start (every other client "
       "waited that long; wall clock), and its operation.",
       Kind::kGauge, {"op"}, {}},
      [this](metrics::SeriesSink& sink) {
        LoopSnapshot l = Loop();
        sink.Add({std::move(l.longest_inline_op)}, l.longest_inline_seconds);
      }));
}

void RequestMetrics::RegisterMetrics(metrics::Registry& registry) {
  using metrics::Kind;
  RegisterRequestFamilies(registry);
  struct Family {
    const char* name;
    Kind kind;
    const char* help;
    const std::atomic<uint64_t> RequestMetrics::*value;
  };
  static constexpr Family kFamilies[] = {
      {"kvd_zmtp_connections", Kind::kGauge, "Client connections open on the request port.",
       &RequestMetrics::transport_connections_},
      {"kvd_zmtp_connections_accepted_total", Kind::kCounter, "Client connections accepted.",
       &RequestMetrics::transport_accepted_},
      {"kvd_zmtp_protocol_errors_total", Kind::kCounter,
       "Connections kvd closed for breaking ZMTP or a size limit (frame, message, frames, command).",
       &RequestMetrics::transport_protocol_errors_},
      {"kvd_zmtp_handshake_timeouts_total", Kind::kCounter,
       "Connections kvd closed for not finishing the ZMTP handshake in time (--handshake-timeout-seconds).",
       &RequestMetrics::transport_handshake_timeouts_},
      {"kvd_requests_malformed_total", Kind::kCounter,
       "Messages dropped unanswered: fewer frames than [uid, op], or a uid frame over 64 bytes.",
       &RequestMetrics::malformed_messages_},
      {"kvd_zmtp_dropped_replies_total", Kind::kCounter,
       "Replies not sent: the client was gone, or did not read its replies (unsent queue full).",
       &RequestMetrics::transport_dropped_},
      {"kvd_zmtp_connections_evicted_total", Kind::kCounter,
       "Connections still in their ZMTP handshake closed to make room for a new connection.",
       &RequestMetrics::transport_evicted_},
      {"kvd_zmtp_accept_paused_total", Kind::kCounter,
       "Times accepting on the request port paused (100 ms, or until a connection closed): no "
       "descriptor or memory for a new connection.",
       &RequestMetrics::transport_accept_pauses_},
  };
  for (const Family& f : kFamilies) {
    const std::atomic<uint64_t>* v = &(this->*f.value);
    metric_handles_.push_back(registry.AddCollected(
        {f.name, f.help, f.kind, {}, {}},
        [v](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(v->load(std::memory_order_relaxed))); }));
  }
  using Router = net::ZmtpRouter;
  static_assert(std::tuple_size_v<decltype(TransportSnapshot::closed_by)> == Router::kNumCloseReasons);
  static_assert(std::tuple_size_v<decltype(TransportSnapshot::rejected)> == Router::kNumRejectReasons);
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_zmtp_connections_closed_total",
       "Client connections closed, by reason: peer (the client closed or reset it), protocol_error, "
       "handshake_timeout, evicted (to make room).",
       Kind::kCounter, {"reason"}, {}},
      [this](metrics::SeriesSink& sink) {
        for (size_t i = 0; i < Router::kNumCloseReasons; ++i) {
          sink.Add({Router::CloseReasonName(static_cast<Router::CloseReason>(i))},
                   static_cast<double>(transport_closed_by_[i].load(std::memory_order_relaxed)));
        }
      }));
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_zmtp_connections_rejected_total",
       "New connections closed at once, by the bound they met (per_address, total, descriptors) "
       "with no unfinished handshake to evict.",
       Kind::kCounter, {"reason"}, {}},
      [this](metrics::SeriesSink& sink) {
        for (size_t i = 0; i < Router::kNumRejectReasons; ++i) {
          sink.Add({Router::RejectReasonName(static_cast<Router::RejectReason>(i))},
                   static_cast<double>(transport_rejected_[i].load(std::memory_order_relaxed)));
        }
      }));
}

}  // namespace kvd::server
