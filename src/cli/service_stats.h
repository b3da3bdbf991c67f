// ServiceStats: the HTTP module's view of this process, an http::StatsSource and AdminPort
// over the running KvService, its L1 cache and tiers, the request metrics and the metrics
// registry. Collect hands the routes the registry's families (counters net of the last
// POST /metrics/reset) and the registered workers; it registers kvd_build_info and
// kvd_uptime_seconds itself. CheckHealth
// proves the request loop answers by sending it a NOOP (at most once a second); the admin
// routes (clear, quotas, object deletes, metrics reset) act on the service.
//
// Threads: every method may be called from any HTTP worker thread and the HTTP sampler at
// once (see http/stats_source.h); it takes its own small locks, never the request path's.
// Ownership: borrows everything in ServiceStatsParts; all of it must outlive the object.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "http/stats_source.h"
#include "server/config.h"
#include "server/kv_service.h"

namespace kvd::cli {

struct ServiceStatsParts {
  server::KvService* service = nullptr;
  metrics::Registry* registry = nullptr;
  const server::ServerConfig* config = nullptr;
  std::string version;                                  // kvd_build_info's version label
  std::string probe_endpoint;                           // the request socket (a NOOP is sent)
  const std::atomic<bool>* stopping = nullptr;          // true once shutdown began
  const std::atomic<int64_t>* maintenance_beat_ns = nullptr;  // the maintenance loop's last round
};

class ServiceStats : public http::StatsSource, public http::AdminPort {};

std::unique_ptr<ServiceStats> NewServiceStats(ServiceStatsParts parts);

}  // namespace kvd::cli
