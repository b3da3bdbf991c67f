#include "server/metrics.h"

#include <chrono>

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

void RequestMetrics::End(wire::Op op, int64_t begin_ns) {
  Finish(ops_[Index(op)], NowNs() - begin_ns);
}

void RequestMetrics::Record(wire::Op op, double seconds) {
  PerOp& p = ops_[Index(op)];
  p.begun.fetch_add(1, std::memory_order_relaxed);
  Finish(p, static_cast<int64_t>(seconds * 1e9));
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
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvd::server
