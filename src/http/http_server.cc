#include "http/http_server.h"

#include "http/httplib_wrap.h"
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <string>
#include <nlohmann/json.hpp>

#include "http/dashboard.h"
#include "http/json_views.h"
#include "http/lmcache_api.h"
#include "http/openapi.h"
#include "http/prometheus.h"
#include "http/quota_routes.h"
#include "http/routes.h"

namespace kvd::http {
namespace {

constexpr const char* kJson = "application/json";

void NoStore(httplib::Response& res) { res.set_header("Cache-Control", "no-store"); }

void SendJson(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  NoStore(res);
  res.set_content(body, kJson);
}

void Send(httplib::Response& res, const Reply& r) {
  res.status = r.status;
  NoStore(res);
  for (const auto& [name, value] : r.headers) res.set_header(name.c_str(), value);
  res.set_content(r.body, r.content_type);
}

std::string ErrorJson(const std::string& error) {
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double MonoSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The names a Host header may give this server besides IP literals and localhost (see
// admin_guard.h): the --http-host name and this machine's hostname.
AdminPolicy PolicyFor(const HttpOptions& o) {
  AdminPolicy p;
  p.token = o.admin_token;
  if (!o.host.empty()) p.host_names.push_back(o.host);
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') p.host_names.emplace_back(name);
  return p;
}

}  // namespace

struct HttpServer::Impl {
  explicit Impl(const HttpOptions& o) : router(server, PolicyFor(o)), loop(&server, o.connections) {}
  RoutedServer server;
  Router router;
  ConnectionLoop loop;
};

HttpServer::HttpServer(HttpOptions options, StatsSource* source, AdminPort* admin)
    : options_(std::move(options)),
      source_(source),
      admin_(admin),
      series_(options_.history_samples),
      impl_(std::make_unique<Impl>(options_)) {
  httplib::Server& svr = impl_->server;
  Router& routes = impl_->router;

  // Browsers get the dashboard; other clients lmcache's JSON (content negotiation).
  routes.Get("/", [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Vary", "Accept");
    if (!WantsHtml(req.get_header_value("Accept"))) {
      Send(res, RootReply());
      return;
    }
    NoStore(res);
    res.set_content(std::string(DashboardHtml()), "text/html; charset=utf-8");
  });
  routes.Get("/dashboard", [](const httplib::Request&, httplib::Response& res) {
    NoStore(res);
    res.set_content(std::string(DashboardHtml()), "text/html; charset=utf-8");
  });
  routes.Get("/healthcheck", [this](const httplib::Request&, httplib::Response& res) {
    Health h = source_->CheckHealth();
    if (h.healthy) {
      SendJson(res, 200, R"({"status":"healthy"})");
    } else {
      SendJson(res, 503,
               nlohmann::json{{"status", "unhealthy"}, {"reason", h.reason}}.dump(
                   -1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  });
  routes.Get("/status", [this](const httplib::Request&, httplib::Response& res) {
    Snapshot s = source_->Collect();
    Health h = source_->CheckHealth();
    SendJson(res, 200, StatusJson(s, h, options_.version));
  });
  routes.Post("/clear-cache", [this](const httplib::Request& req, httplib::Response& res,
                                     const std::string&) {
    uint64_t n = admin_->ClearCache();
    spdlog::info("http: L1 cleared on request from {} ({} entries)", req.remote_addr, n);
    SendJson(res, 200, nlohmann::json{{"status", "ok"}, {"cleared_entries", n}}.dump());
  });
  // lmcache's routes and shapes (lmcache_api.h).
  auto with_body = [](auto handler) {
    return [handler](const httplib::Request& req, httplib::Response& res, const std::string& body) {
      Send(res, handler(req, body));
    };
  };
  routes.Post("/cache/clear", with_body([this](const httplib::Request& req, const std::string& body) {
             spdlog::info("http: POST /cache/clear from {}", req.remote_addr);
             return ClearCacheReply(*admin_, body);
           }));
  routes.Get("/cache/objects", [this](const httplib::Request& req, httplib::Response& res) {
    Send(res, ListObjectsReply(*source_, req.params));
  });
  routes.Delete("/cache/objects", with_body([this](const httplib::Request&, const std::string& body) {
               return DeleteObjectsReply(*source_, *admin_, body);
             }));
  routes.Post("/cache/prefetches", with_body([this](const httplib::Request&, const std::string& body) {
             return SubmitPrefetchReply(*source_, body);
           }));
  routes.Get("/cache/prefetches/{request_id}", [](const httplib::Request& req, httplib::Response& res) {
    Send(res, PrefetchStatusReply(req.matches[1].str()));
  });
  routes.Get("/loglevel", [](const httplib::Request& req, httplib::Response& res) {
    Send(res, LogLevelReply(req.params));
  });
  routes.Post("/loglevel", with_body([](const httplib::Request& req, const std::string&) {
             return SetLogLevelReply(req.params);  // a body, if any, is read and ignored
           }));
  routes.Get("/threads", [](const httplib::Request& req, httplib::Response& res) {
    Send(res, ThreadsReply(req.params));
  });
  routes.Get("/lmc_version", [](const httplib::Request&, httplib::Response& res) {
    Send(res, LmcVersionReply());
  });
  routes.Get("/commit_id", [this](const httplib::Request&, httplib::Response& res) {
    Send(res, CommitIdReply(options_.version));
  });
  routes.Post("/metrics/reset", [this](const httplib::Request& req, httplib::Response& res,
                                       const std::string&) {
    admin_->ResetMetrics();
    spdlog::info("http: metrics reset on request from {}", req.remote_addr);
    res.status = 200;
    res.set_content("ok", "text/plain; charset=utf-8");
  });
  auto conf = [this](const httplib::Request&, httplib::Response& res) {
    SendJson(res, 200, options_.config_json);
  };
  routes.Get("/conf", conf);
  routes.Get("/config", conf);
  routes.Get("/version", [this](const httplib::Request&, httplib::Response& res) {
    Send(res, VersionStringReply(options_.version));  // lmcache's shape: a JSON string
  });
  routes.Get("/api/version", [this](const httplib::Request&, httplib::Response& res) {
    SendJson(res, 200, VersionJson(options_.version));
  });
  // This server's OpenAPI document (docs/openapi.json, embedded at build time).
  routes.Get("/openapi.json", [](const httplib::Request&, httplib::Response& res) {
    NoStore(res);
    res.set_content(std::string(OpenApiDocument()), kJson);
  });
  routes.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    if (!options_.metrics_enabled) {
      res.status = 404;
      res.set_content("metrics are disabled (--disable-metrics)\n", "text/plain");
      return;
    }
    NoStore(res);
    res.set_content(RenderPrometheus(source_->Collect()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  AddQuotaRoutes(routes, source_, admin_);
  routes.Get("/api/timeseries", [this](const httplib::Request& req, httplib::Response& res) {
    size_t points = 0;
    if (req.has_param("points")) {
      // Digits only: no sign, blanks or trailing text; a count past size_t is refused too.
      const std::string v = req.get_param_value("points");
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), points);
      if (v.empty() || v.front() == '-' || ec != std::errc() || end != v.data() + v.size()) {
        SendJson(res, 400, ErrorJson("points must be a non-negative integer"));
        return;
      }
    }
    SendJson(res, 200, series_.ToJson(points, options_.sample_interval_seconds));
  });
  // Last: the answers for what no route serves (405 with Allow, 404).
  routes.AddFallbacks();
  // Errors without a body (404 from the fallbacks, what httplib refuses itself) get a JSON one.
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    NoStore(res);
    switch (res.status) {
      case 404: res.set_content(ErrorJson("no such endpoint: " + req.method + " " + req.path), kJson); break;
      case 413: res.set_content(nlohmann::json{{"detail", "request body too large"}}.dump(), kJson); break;
      case 414: res.set_content(ErrorJson("request URI too long"), kJson); break;
      default: res.set_content(ErrorJson("malformed request (HTTP " + std::to_string(res.status) + ")"), kJson);
    }
  });
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("http: {} {}: {}", req.method, req.path, what);
        SendJson(res, 500, ErrorJson(what));
      });
}

HttpServer::~HttpServer() { Stop(); }

const std::vector<Route>& HttpServer::routes() const { return impl_->router.routes(); }

Status HttpServer::Start() {
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  if (Status st = impl_->loop.Listen(options_.host, options_.port); !st.ok()) {
    return Status::Unavailable("cannot listen for HTTP on " + where + ": " + st.message() +
                               " (choose another --http-port / --http-host)");
  }
  bound_port_ = impl_->loop.port();
  SampleNow();
  impl_->loop.Start();
  sampler_ = std::thread([this] { SamplerLoop(); });
  return Status::Ok();
}

void HttpServer::Stop() {
  {
    MutexLock lock(&stop_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_cv_.NotifyAll();
  impl_->loop.Stop();
  if (sampler_.joinable()) sampler_.join();
}

const ConnectionStats& HttpServer::connection_stats() const { return impl_->loop.stats(); }

std::string HttpServer::ServeForTest(std::string_view request) {
  return ConnectionLoop::ServeBuffered(&impl_->server, request);
}

void HttpServer::RegisterMetrics(metrics::Registry& registry) {
  using metrics::Kind;
  struct Family {
    const char* name;
    Kind kind;
    const char* help;
    const std::atomic<uint64_t> ConnectionStats::*value;
  };
  static constexpr Family kFamilies[] = {
      {"kvd_http_connections", Kind::kGauge, "Connections open on the HTTP port.", &ConnectionStats::open},
      {"kvd_http_connections_accepted_total", Kind::kCounter, "HTTP connections accepted.",
       &ConnectionStats::accepted},
      {"kvd_http_connections_closed_total", Kind::kCounter, "HTTP connections closed (by the client or kvd).",
       &ConnectionStats::closed},
      {"kvd_http_request_timeouts_total", Kind::kCounter,
       "HTTP requests answered 408: not arrived whole within the request timeout.", &ConnectionStats::timed_out},
      {"kvd_http_requests_refused_total", Kind::kCounter,
       "HTTP requests refused before routing: over a bound (414, 431, 413), malformed (400, 501) or "
       "no buffer room (503).",
       &ConnectionStats::refused},
      {"kvd_http_connections_evicted_total", Kind::kCounter,
       "HTTP connections waiting for a request closed to make room for a new connection.",
       &ConnectionStats::evicted},
      {"kvd_http_connections_rejected_total", Kind::kCounter,
       "New HTTP connections closed at once: at the connection bound with every connection busy.",
       &ConnectionStats::rejected},
  };
  const ConnectionStats* stats = &impl_->loop.stats();
  for (const Family& f : kFamilies) {
    const std::atomic<uint64_t>* v = &(stats->*f.value);
    metric_handles_.push_back(registry.AddCollected(
        {f.name, f.help, f.kind, {}, {}},
        [v](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(v->load(std::memory_order_relaxed))); }));
  }
  const std::atomic<uint64_t>* refused = &impl_->router.admin_refusals();
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_http_admin_refused_total",
       "Requests to routes that change state refused by the admin rules (401, 403, 415).",
       Kind::kCounter, {}, {}},
      [refused](metrics::SeriesSink& sink) {
        sink.Add(static_cast<double>(refused->load(std::memory_order_relaxed)));
      }));
}

void HttpServer::SampleNow() {
  series_.Add(Sample::From(source_->Collect(), UnixMillis(), MonoSeconds()));
}

void HttpServer::SamplerLoop() {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.05, options_.sample_interval_seconds)));
  auto next = std::chrono::steady_clock::now() + interval;
  stop_mu_.Lock();
  while (true) {
    // Sleeps until `next` unless Stop() comes first.
    while (!stopping_) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= next) break;
      stop_cv_.WaitFor(&stop_mu_, next - now);
    }
    if (stopping_) break;
    stop_mu_.Unlock();
    SampleNow();
    stop_mu_.Lock();
    next += interval;
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now + interval;  // fell behind (suspended?): do not burst
  }
  stop_mu_.Unlock();
}

}  // namespace kvd::http
