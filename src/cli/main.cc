// kvd command line: `kvd server …` takes the flags of `lmcache server` (same names and
// defaults) that matter for a native cache server, validates them, and runs the server
// until SIGINT/SIGTERM. A flag of `lmcache server` that kvd does not implement fails at
// startup with one line naming it.
//
// Process layout: the main thread runs the ZMQ loop; a maintenance thread calls
// KvService::Maintain every second (sessions, TTLs, worker reaping, eviction); the HTTP
// server (operator endpoints, metrics, dashboard) has its own threads and sees the
// service only through the ServiceStats adapter below (an http::StatsSource).
//
// Shutdown: the first SIGINT/SIGTERM stops accepting requests, lets queued and in-flight
// requests finish and answers them, stops HTTP, unmaps every worker segment and removes
// the L1 shared-memory segment, then exits 0. A second signal exits at once (status 1).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/clock.h"
#include "http/http_server.h"
#include "kvd_version.h"
#include "server/config.h"
#include "server/kv_service.h"
#include "server/metrics.h"
#include "server/zmq_server.h"
#include "wire/codec.h"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signals{0};

void OnSignal(int) {
  if (g_signals.fetch_add(1) > 0) _exit(1);  // second signal: leave at once
  g_stop.store(true);
}

// Flags of `lmcache server` 0.5.6 that kvd recognises but does not implement yet.
const char* kUnsupportedFlags[] = {
    "--instance-id", "--engine-type", "--supported-transfer-mode", "--separate-object-groups",
    "--no-separate-object-groups", "--enable-segmented-prefix",
    "--runtime-plugin-locations", "--runtime-plugin-config", "--script-allowed-imports",
    "--isolated-ipc", "--l1-init-size-gb", "--l1-align-bytes",
    "--l1-use-hugepages", "--l1-devdax-path", "--gds-l1-path", "--gds-l1-use-direct-io",
    "--gds-l1-backend", "--l1-manager", "--l2-adapter", "--l2-store-policy",
    "--l2-prefetch-policy", "--l2-prefetch-max-in-flight", "--l2-prefetch-load-timeout",
    "--periodic-notifier-interval-ms", "--p2p-advertise-url", "--p2p-listen-url",
    "--p2p-lookup-timeout", "--p2p-load-timeout", "--p2p-transfer-engine", "--p2p-rdma-device",
    "--p2p-rdma-port", "--p2p-rdma-gid-index", "--p2p-rdma-gid-indices", "--p2p-rdma-queue-depth",
    "--p2p-rdma-handshake-timeout-ms", "--coordinator-url", "--coordinator-advertise-ip",
    "--coordinator-heartbeat-interval", "--coordinator-l2-event-reporting",
    "--coordinator-l2-event-flush-interval",
    "--disable-observability", "--disable-logging", "--enable-tracing",
    "--otlp-endpoint", "--event-bus-queue-size", "--prometheus-port", "--metrics-sample-rate",
    "--trace-level", "--trace-output", "--lookup-hash-log-dir"};

struct HttpFlags {
  std::string host = "127.0.0.1";
  int port = 8080;
  bool disable_metrics = false;
};

// True when binding `host` listens on every interface. Decided on the parsed address, not
// the spelling: ZMQ also binds all interfaces for "0", "0x0" or "00.0.0.0" (inet_aton
// forms), which used to start kvd without the warning.
bool IsWildcard(const std::string& host) {
  if (host == "*") return true;
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  in_addr v4{};
  if (inet_aton(h.c_str(), &v4) != 0) return v4.s_addr == htonl(INADDR_ANY);
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_UNSPECIFIED(&v6);
  return false;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The effective configuration, as GET /conf shows it. Keys are the flag names.
std::string ConfigJson(const kvd::server::ServerConfig& c, const HttpFlags& h) {
  nlohmann::ordered_json j = {
      {"server", "kvd"},
      {"version", KVD_VERSION},
      {"zmq", {{"host", c.host}, {"port", c.port}, {"endpoint", c.ZmqEndpoint()},
               {"max_workers", c.max_workers}, {"copy_threads", c.copy_threads}}},
      {"http", {{"http_host", h.host}, {"http_port", h.port},
                {"metrics_enabled", !h.disable_metrics}}},
      {"cache", {{"chunk_size", c.chunk_size}, {"hash_algorithm", c.hash_algorithm},
                 {"session_ttl_seconds", c.session_ttl_seconds}}},
      {"l1", {{"l1_size_gb", c.l1_size_gb}, {"l1_size_bytes", c.l1_size_bytes()},
              {"shm_name", c.shm_name}, {"eviction_policy", c.eviction_policy},
              {"eviction_trigger_watermark", c.eviction_trigger_watermark},
              {"eviction_ratio", c.eviction_ratio},
              {"l1_read_ttl_seconds", c.l1_read_ttl_seconds},
              {"l1_write_ttl_seconds", c.l1_write_ttl_seconds}}},
      {"workers", {{"worker_reap_timeout_seconds", c.worker_reap_timeout_seconds},
                   {"worker_registration_grace_seconds", c.worker_registration_grace_seconds}}},
      {"log_level", c.log_level},
  };
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The HTTP module's view of this process: KvService state, L1 stats and request metrics
// copied into plain snapshots, and a health check that proves the ZMQ loop answers.
class ServiceStats final : public kvd::http::StatsSource {
 public:
  ServiceStats(kvd::server::KvService* svc, const kvd::server::RequestMetrics* metrics,
               const kvd::server::ServerConfig& cfg, const std::atomic<int64_t>* maintenance_beat_ns)
      : svc_(svc), metrics_(metrics), cfg_(cfg), beat_ns_(maintenance_beat_ns), started_(Now()) {
    // Where to probe the ZMQ loop: its bind address, or loopback for a wildcard bind.
    std::string host = cfg.host;
    if (IsWildcard(host)) host = host.find(':') != std::string::npos ? "::1" : "127.0.0.1";
    kvd::server::ServerConfig probe = cfg;
    probe.host = host;
    probe_endpoint_ = probe.ZmqEndpoint();
  }

  kvd::http::Health CheckHealth() override {
    if (g_stop.load()) return {false, "shutting down"};
    const int64_t now = Now();
    const double stalled = static_cast<double>(now - beat_ns_->load()) * 1e-9;
    if (stalled > 30) {
      return {false, "maintenance loop stalled for " + std::to_string(static_cast<int>(stalled)) +
                         " s (eviction, TTLs and worker reaping are not running)"};
    }
    std::lock_guard<std::mutex> lock(probe_mu_);
    if (now - probed_ns_ > 1'000'000'000LL) {  // probe at most once a second
      probed_ns_ = now;
      probe_ok_ = ProbeZmq();
    }
    if (!probe_ok_) return {false, "the request loop on " + probe_endpoint_ + " did not answer a NOOP within 1 s"};
    return {};
  }

  kvd::http::Snapshot Collect(bool detailed) override {
    kvd::http::Snapshot s;
    s.uptime_seconds = static_cast<double>(Now() - started_) * 1e-9;
    s.chunk_size = cfg_.chunk_size;
    const kvd::l1::L1Stats l1 = svc_->l1_stats(detailed);
    s.l1 = {l1.capacity_bytes, l1.used_bytes,      l1.entries,    l1.locked_entries,
            l1.resident_objects, l1.staging_objects, l1.pinned_objects, l1.evictions,
            l1.evicted_bytes};
    const auto& c = svc_->counters();
    const uint64_t chunk = static_cast<uint64_t>(cfg_.chunk_size);
    s.counters.lookups = c.lookups.load();
    s.counters.lookup_tokens = c.lookup_chunks.load() * chunk;
    s.counters.hit_tokens = c.hit_chunks.load() * chunk;
    s.counters.stores = c.stores.load();
    s.counters.store_failures = c.store_failures.load();
    s.counters.stored_chunks = c.stored_chunks.load();
    s.counters.stored_bytes = c.stored_bytes.load();
    s.counters.retrieves = c.retrieves.load();
    s.counters.retrieve_failures = c.retrieve_failures.load();
    s.counters.retrieved_chunks = c.retrieved_chunks.load();
    s.counters.retrieved_bytes = c.retrieved_bytes.load();
    kvd::server::ServiceStatus st = svc_->StatusSnapshot();
    for (auto& i : st.instances) {
      s.instances.push_back({i.instance_id, i.engine_driven, std::move(i.model_name), i.world_size,
                             std::move(i.layout), i.object_bytes, i.idle_seconds, i.pinged});
    }
    s.sessions = st.sessions;
    s.pending_engine_stores = st.pending_engine_stores;
    s.pending_engine_retrieves = st.pending_engine_retrieves;
    const auto& metrics = *metrics_;
    s.latency_bounds.assign(kvd::server::RequestMetrics::kLatencyBounds.begin(),
                            kvd::server::RequestMetrics::kLatencyBounds.end());
    for (auto& o : metrics.Snapshot()) {
      s.ops.push_back({std::move(o.name), o.requests, o.in_flight, std::move(o.buckets),
                       o.latency_sum_seconds});
    }
    s.unknown_ops = metrics.unknown_ops();
    return s;
  }

  uint64_t ClearCache() override {
    const uint64_t before = svc_->l1_stats().entries;
    svc_->Clear();
    const uint64_t after = svc_->l1_stats().entries;
    return before > after ? before - after : 0;
  }

 private:
  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // One NOOP through the real socket loop. Requires probe_mu_.
  bool ProbeZmq() {
    try {
      zmq::socket_t sock(ctx_, zmq::socket_type::dealer);
      sock.set(zmq::sockopt::linger, 0);
      sock.connect(probe_endpoint_);
      const std::string uid = kvd::wire::EncodeInt(++probe_uid_);
      const std::string op = kvd::wire::EncodeInt(kvd::wire::InfoOf(kvd::wire::Op::kNoop).legacy_id);
      sock.send(zmq::buffer(uid), zmq::send_flags::sndmore);
      sock.send(zmq::buffer(op), zmq::send_flags::none);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (std::chrono::steady_clock::now() < deadline) {
        zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(100));
        if (!(item.revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> reply;
        if (!zmq::recv_multipart(sock, std::back_inserter(reply), zmq::recv_flags::dontwait)) continue;
        if (!reply.empty() && reply[0].to_string() == uid) return true;
      }
    } catch (const zmq::error_t& e) {
      spdlog::debug("healthcheck probe failed: {}", e.what());
    }
    return false;
  }

  kvd::server::KvService* const svc_;
  const kvd::server::RequestMetrics* const metrics_;  // owned by RunServer
  const kvd::server::ServerConfig cfg_;
  const std::atomic<int64_t>* const beat_ns_;
  const int64_t started_;
  std::string probe_endpoint_;
  zmq::context_t ctx_{1};
  std::mutex probe_mu_;
  int64_t probed_ns_ = 0;     // guarded by probe_mu_
  bool probe_ok_ = false;     // guarded by probe_mu_
  int64_t probe_uid_ = 0;     // guarded by probe_mu_
};

// Evictions done on the allocation path (a store that did not fit) are not logged one by
// one; the maintenance loop reports them in one line at most every 10 s. Background
// eviction rounds log themselves (l1).
class EvictionReporter {
 public:
  // `before`/`after`: eviction counters around one Maintain() call.
  void Observe(uint64_t before_maintain, uint64_t after_maintain, uint64_t bytes_before,
               uint64_t bytes_after) {
    if (have_last_) {
      sync_entries_ += before_maintain - last_entries_;
      sync_bytes_ += bytes_before - last_bytes_;
    }
    have_last_ = true;
    last_entries_ = after_maintain;
    last_bytes_ = bytes_after;
    const auto now = std::chrono::steady_clock::now();
    if (sync_entries_ > 0 && now - last_report_ >= std::chrono::seconds(10)) {
      spdlog::info("l1: {} entries ({:.1f} MiB) evicted by stores that did not fit since the last report",
                   sync_entries_, static_cast<double>(sync_bytes_) / (1 << 20));
      sync_entries_ = sync_bytes_ = 0;
      last_report_ = now;
    }
  }

 private:
  bool have_last_ = false;
  uint64_t last_entries_ = 0, last_bytes_ = 0, sync_entries_ = 0, sync_bytes_ = 0;
  std::chrono::steady_clock::time_point last_report_{};
};

// The pid of another running kvd that has /dev/shm/<name> mapped, or 0.
int LiveKvdUsingSegment(const std::string& shm_name) {
  const std::string needle = "/dev/shm/" + shm_name;
  std::error_code ec;
  for (const auto& dir : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = dir.path().filename().string();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
    if (std::stoi(pid) == getpid()) continue;
    std::ifstream comm(dir.path() / "comm");
    std::string name;
    if (!std::getline(comm, name) || name != "kvd") continue;
    std::ifstream maps(dir.path() / "maps");
    for (std::string line; std::getline(maps, line);) {
      // "... /dev/shm/<name>" or "... /dev/shm/<name> (deleted)"
      const size_t at = line.find(needle);
      if (at == std::string::npos) continue;
      const size_t end = at + needle.size();
      if (end == line.size() || line[end] == ' ') {
        if (line.find("(deleted)", end) == std::string::npos) return std::stoi(pid);
      }
    }
  }
  return 0;
}

int RunServer(const kvd::server::ServerConfig& cfg, const HttpFlags& http_flags) {
  spdlog::info("kvd {} starting: {} http_host={} http_port={}{}", KVD_VERSION, cfg.Describe(),
               http_flags.host, http_flags.port, http_flags.disable_metrics ? " metrics=off" : "");
  // A segment of this name left by a crashed kvd is replaced by the L1 pool (it logs a
  // warning); one that a *running* kvd still uses must not be taken from under it.
  if (int owner = LiveKvdUsingSegment(cfg.shm_name); owner > 0) {
    spdlog::error("cannot start: shared-memory segment /{} is in use by kvd (pid {}); choose "
                  "another --shm-name", cfg.shm_name, owner);
    return 1;
  }
  // From here on a signal means "stop cleanly" (also during the rest of startup).
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  kvd::SteadyClock clock;
  {
    auto created = kvd::server::KvService::Create(cfg, &clock);
    if (!created.ok()) {
      spdlog::error("cannot start: {}", created.status().ToString());
      return 1;
    }
    std::unique_ptr<kvd::server::KvService> svc = std::move(created).value();
    const auto l1 = svc->l1_stats();
    kvd::server::RequestMetrics metrics;
    kvd::server::ZmqServer server(cfg, svc.get(), &metrics);
    if (auto st = server.Bind(); !st.ok()) {
      spdlog::error("cannot start: {}", st.message());
      return 1;
    }
    if (IsWildcard(cfg.host)) {
      spdlog::warn("listening on all interfaces ({}): any host that can reach this port can "
                   "read and write the cache", cfg.host);
    }

    std::atomic<int64_t> beat_ns{clock.NowNanos()};
    ServiceStats stats(svc.get(), &metrics, cfg, &beat_ns);
    kvd::http::HttpOptions ho;
    ho.host = http_flags.host;
    ho.port = http_flags.port;
    ho.metrics_enabled = !http_flags.disable_metrics;
    ho.version = KVD_VERSION;
    ho.config_json = ConfigJson(cfg, http_flags);
    std::unique_ptr<kvd::http::HttpServer> http;
    if (http_flags.port != 0) {
      http = std::make_unique<kvd::http::HttpServer>(ho, &stats);
      if (auto st = http->Start(); !st.ok()) {
        spdlog::error("cannot start: {}", st.message());
        return 1;
      }
      if (!IsLoopback(http_flags.host)) {
        spdlog::warn("HTTP on {} is reachable from other hosts: POST /clear-cache drops the "
                     "cache and needs no credentials", http_flags.host);
      }
    }
    spdlog::info("listening on {}; L1 {:.2f} GiB in shared memory /{}; {}", cfg.ZmqEndpoint(),
                 static_cast<double>(l1.capacity_bytes) / (1ull << 30), cfg.shm_name,
                 http ? "HTTP on http://" + http_flags.host + ":" + std::to_string(http->port()) +
                            " (dashboard /, metrics " +
                            (http_flags.disable_metrics ? "disabled" : "/metrics") + ")"
                      : std::string("HTTP disabled (--http-port 0)"));
    std::thread maintenance([&] {
      EvictionReporter evictions;
      while (!g_stop.load()) {
        for (int i = 0; i < 10 && !g_stop.load(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        if (g_stop.load()) break;
        const auto before = svc->l1_stats();
        svc->Maintain();
        const auto after = svc->l1_stats();
        evictions.Observe(before.evictions, after.evictions, before.evicted_bytes,
                          after.evicted_bytes);
        beat_ns.store(clock.NowNanos());
      }
    });
    server.Run(g_stop);  // returns after in-flight requests were answered
    spdlog::info("shutting down: requests drained; stopping HTTP and releasing memory");
    maintenance.join();
    if (http) http->Stop();
    const size_t instances = svc->num_instances();
    svc.reset();  // unmaps worker segments, removes the L1 segment
    spdlog::info("released {} worker registration(s) and L1 segment /{}", instances, cfg.shm_name);
  }
  spdlog::info("kvd stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Name an unimplemented lmcache flag before CLI11 reports it as merely unknown.
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string flag = a.substr(0, a.find('='));
    for (const char* u : kUnsupportedFlags) {
      if (flag == u) {
        std::fprintf(stderr, "kvd: %s (an lmcache server flag) is not supported by kvd yet\n",
                     flag.c_str());
        return 2;
      }
    }
  }

  CLI::App app{"kvd: native KV-cache server, wire-compatible with the lmcache 0.5.6 client"};
  app.set_version_flag("--version", std::string("kvd ") + KVD_VERSION);
  app.require_subcommand(1);
  kvd::server::ServerConfig cfg;
  HttpFlags http;
  auto* srv = app.add_subcommand("server", "Run the cache server (drop-in for `lmcache server`)");
  srv->add_option("--host", cfg.host, "ZMQ bind host")->capture_default_str();
  srv->add_option("--port", cfg.port, "ZMQ bind port")->capture_default_str()->check(CLI::Range(1, 65535));
  srv->add_option("--chunk-size", cfg.chunk_size, "Tokens per chunk")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  srv->add_option("--l1-size-gb", cfg.l1_size_gb, "L1 (host memory) size in GiB")->required()->check(CLI::PositiveNumber);
  srv->add_option("--eviction-policy", cfg.eviction_policy, "Eviction policy")->required()->check(CLI::IsMember({"LRU"}, CLI::ignore_case));
  srv->add_option("--eviction-trigger-watermark", cfg.eviction_trigger_watermark, "L1 usage fraction that triggers eviction")->capture_default_str()->check(CLI::Range(0.01, 1.0));
  srv->add_option("--eviction-ratio", cfg.eviction_ratio, "Fraction of L1 freed per eviction round")->capture_default_str()->check(CLI::Range(0.001, 1.0));
  srv->add_option("--l1-read-ttl-seconds", cfg.l1_read_ttl_seconds, "Read-lock TTL")->capture_default_str()->check(CLI::PositiveNumber);
  srv->add_option("--l1-write-ttl-seconds", cfg.l1_write_ttl_seconds, "Write-lock TTL")->capture_default_str()->check(CLI::PositiveNumber);
  int gpu_workers = 0, cpu_workers = 0;
  srv->add_option("--max-workers", cfg.max_workers, "Worker threads (0: from the core count)")->capture_default_str()->check(CLI::Range(0, 256));
  srv->add_option("--max-gpu-workers", gpu_workers, "Accepted for compatibility; kvd sizes one pool from --max-workers")->check(CLI::Range(0, 256));
  srv->add_option("--max-cpu-workers", cpu_workers, "Accepted for compatibility; kvd sizes one pool from --max-workers")->check(CLI::Range(0, 256));
  srv->add_option("--hash-algorithm", cfg.hash_algorithm, "Chunk hash")->capture_default_str()->check(CLI::IsMember({"blake3"}));
  srv->add_option("--shm-name", cfg.shm_name, "POSIX shared-memory name of the L1 pool (default kvd_l1_pool_<pid>)");
  srv->add_option("--worker-reap-timeout-seconds", cfg.worker_reap_timeout_seconds, "Forget workers that pinged and then went silent this long (0: never)")->capture_default_str()->check(CLI::Range(0.0, 1e9));
  srv->add_option("--null-block-id", cfg.null_block_id, "Engine block id that holds no KV; chunks made only of it are not stored")->capture_default_str();
  srv->add_option("--worker-registration-grace-seconds", cfg.worker_registration_grace_seconds, "Forget workers that registered but never pinged after this long (>= the reap timeout)")->capture_default_str()->check(CLI::Range(0.0, 1e9));
  bool lazy = true;
  srv->add_flag("--l1-use-lazy,!--no-l1-use-lazy", lazy, "Accepted for compatibility: kvd's L1 is always sparse shared memory, backed as it fills");
  srv->add_option("--log-level", cfg.log_level, "trace, debug, info, warning, error")->capture_default_str()->check(CLI::IsMember({"trace", "debug", "info", "warning", "warn", "error"}));
  srv->add_option("--http-host", http.host, "HTTP bind host (dashboard, /status, /metrics)")->capture_default_str();
  srv->add_option("--http-port", http.port, "HTTP bind port (0: no HTTP endpoints; a kvd extension)")->capture_default_str()->check(CLI::Range(0, 65535));
  srv->add_flag("--disable-metrics", http.disable_metrics, "Do not serve /metrics (it answers 404)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& c : cfg.eviction_policy) c = static_cast<char>(std::toupper(c));
  if (cfg.max_workers == 0 && std::max(gpu_workers, cpu_workers) > 0) {
    cfg.max_workers = std::max(gpu_workers, cpu_workers);
  }
  if (cfg.worker_reap_timeout_seconds > 0 && cfg.worker_reap_timeout_seconds < 30) {
    std::fprintf(stderr, "kvd: --worker-reap-timeout-seconds must be 0 (off) or at least 30\n");
    return 2;
  }
  if (cfg.worker_registration_grace_seconds < cfg.worker_reap_timeout_seconds) {
    std::fprintf(stderr, "kvd: --worker-registration-grace-seconds (%g) must be at least "
                 "--worker-reap-timeout-seconds (%g)\n",
                 cfg.worker_registration_grace_seconds, cfg.worker_reap_timeout_seconds);
    return 2;
  }
  if (cfg.shm_name.empty()) cfg.shm_name = "kvd_l1_pool_" + std::to_string(getpid());
  if (!cfg.shm_name.empty() && cfg.shm_name[0] == '/') cfg.shm_name = cfg.shm_name.substr(1);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [kvd] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::from_str(cfg.log_level == "warning" ? "warn" : cfg.log_level));
  return RunServer(cfg, http);
}
