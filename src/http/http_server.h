// HttpServer: kvd's operator endpoints on one HTTP port (cpp-httplib):
//   GET  /                 dashboard for browsers (Accept: text/html), lmcache's JSON otherwise
//   GET  /dashboard        dashboard (self-contained HTML/JS/CSS, no external resources)
//   GET  /healthcheck      200 {"status":"healthy"} | 503 {"status":"unhealthy","reason":...}
//   GET  /status           instances, L1, sessions, per-op request stats (JSON)
//   POST /clear-cache      drop every L1 entry (kvd's answer)
//   POST /loglevel         set the log level (lmcache sets it on GET /loglevel; kvd's GET only reads)
//   GET  /conf             effective configuration (also /config, LMCache's path)
//   GET  /api/version      kvd's version object
//   GET  /metrics          Prometheus text; 404 when metrics are disabled
//   GET  /api/timeseries   the last minutes of 1-second samples (JSON, for the dashboard)
//   GET  /openapi.json     the OpenAPI document of all these routes (docs/openapi.json)
//   PUT|GET|DELETE /quota/{cache_salt}, GET /quota: quotas per cache salt (quota_routes.h)
//   lmcache 0.5.6's routes with its shapes (lmcache_api.h): POST /cache/clear,
//   GET|DELETE /cache/objects, POST /cache/prefetches, GET /cache/prefetches/{id},
//   POST /metrics/reset, GET /version, /lmc_version, /commit_id, /loglevel, /threads.
// A path asked with a method it does not serve answers 405 with Allow (OPTIONS: 204).
// See docs/operations.md and docs/openapi.json for the payloads.
//
// Hostile clients (docs/reliability.md, issue 27 finding 8): connections are served by a
// ConnectionLoop (connection_loop.h): requests are bounded and must arrive within a
// deadline, and a slow or idle client never holds a thread, so /healthcheck is answered
// whatever other clients do. Every route that changes state is a POST, PUT or DELETE and
// passes the admin rules first (admin_guard.h: the token of --admin-token, else a Host that
// names this kvd and no foreign Origin; a JSON body); a GET never changes state.
//
// Threads: Start binds the port (failing cleanly when it is taken) and starts the connection
// loop (one I/O thread, a few handler threads) plus one sampler thread that calls
// source->Collect() every sample_interval and appends to the ring. Handlers run on the
// handler threads and call the StatsSource and AdminPort concurrently. Stop (or the
// destructor) stops accepting, finishes the requests being served and joins every thread.
// Start/Stop are not thread-safe with respect to each other; call them from one thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "http/connection_loop.h"
#include "http/routes.h"
#include "http/stats_source.h"
#include "http/timeseries.h"

namespace kvd::http {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: an ephemeral port (tests); see port()
  bool metrics_enabled = true;        // false: /metrics answers 404 (--disable-metrics)
  std::string version;                // reported by /version, /status and the dashboard
  std::string config_json = "{}";     // GET /conf body: the effective configuration
  double sample_interval_seconds = 1.0;
  size_t history_samples = 900;       // 15 minutes at 1 s
  // Non-empty (--admin-token): the routes that change state need `Authorization: Bearer
  // <admin_token>` and nothing else; empty: they need a Host naming this kvd and no foreign
  // Origin (admin_guard.h).
  std::string admin_token;
  ConnectionLimits connections;       // deadlines, bounds, handler threads (connection_loop.h)
};

class HttpServer {
 public:
  // `source` and `admin` must outlive the server.
  HttpServer(HttpOptions options, StatsSource* source, AdminPort* admin);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts serving. Unavailable (with a one-line reason naming host:port) when
  // the address is in use or cannot be bound; nothing is left running then.
  Status Start();
  void Stop() KVD_EXCLUDES(stop_mu_);

  // The bound port (the ephemeral one when options.port was 0); 0 before Start.
  int port() const { return bound_port_; }
  // Takes one sample now (tests; the sampler thread does this every interval).
  void SampleNow();
  const TimeSeries& timeseries() const { return series_; }
  // Every route the server registered (method, OpenAPI path template): docs/openapi.json
  // describes exactly these (http_tests check it).
  const std::vector<Route>& routes() const;
  // Runs one request, given as the bytes a client would send, through the routes on the
  // calling thread and returns the response bytes: no socket, no connection bounds (tests,
  // fuzzing; works without Start).
  std::string ServeForTest(std::string_view request);
  // Counters of the connection loop (tests; /metrics after RegisterMetrics).
  const ConnectionStats& connection_stats() const;
  // Adds the kvd_http_* families (connections, refusals) to `registry`, which must outlive
  // this server's registration (it is removed when the server is destroyed).
  void RegisterMetrics(metrics::Registry& registry);

 private:
  struct Impl;
  void SamplerLoop() KVD_EXCLUDES(stop_mu_);

  const HttpOptions options_;
  StatsSource* const source_;
  AdminPort* const admin_;     // the routes that change state
  TimeSeries series_;
  std::unique_ptr<Impl> impl_;
  int bound_port_ = 0;
  std::thread sampler_;
  std::vector<metrics::CollectorHandle> metric_handles_;
  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stopping_ KVD_GUARDED_BY(stop_mu_) = false;
};

}  // namespace kvd::http
