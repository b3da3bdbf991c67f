// kvd command line: `kvd server …` takes every flag of `lmcache server` 0.5.6 (same names and
// defaults; the table and what kvd does with each flag are in flags_table_lmcache.cc,
// flags_table_kvd.cc and docs/cli.md), validates them, and runs the server until SIGINT/SIGTERM. A refused flag or
// a bad value stops startup with one line naming it, exit status 2, before anything starts.
//
// Process layout: the main thread runs the ZMQ loop; a maintenance thread calls
// KvService::Maintain every second (sessions, TTLs, worker reaping, eviction); the HTTP
// server (operator endpoints, metrics, dashboard) has its own threads and sees the
// service only through the ServiceStats adapter (cli/service_stats.h: an http::StatsSource
// and AdminPort).
//
// Shutdown: the first SIGINT/SIGTERM stops accepting requests, lets queued and in-flight
// requests finish and answers them, stops HTTP, unmaps every worker segment and removes
// the L1 shared-memory segment, then exits 0. A second signal exits at once (status 1),
// removing the segment too; the same signal again within a second is not a second one.
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

#include "cli/cli_config.h"
#include "cli/flags.h"
#include "cli/service_stats.h"
#include "cli/stale_segments.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "http/http_server.h"
#include "l2/adapter_config.h"
#include "keys/token_hash.h"
#include "kvd_version.h"
#include "server/config.h"
#include "server/kv_service.h"
#include "server/metrics.h"
#include "server/zmq_server.h"

namespace {

// Signal handling state: a handler can only reach globals. Lock-free atomics and a path set
// before the handlers are installed (never changed after).
std::atomic<bool> g_stop{false};
std::atomic<int> g_first_signal{0};
std::atomic<int64_t> g_first_signal_ns{0};
char g_l1_segment_path[300] = "";  // "/dev/shm/<name>" of the L1 pool; "" when anonymous

// The first SIGINT/SIGTERM asks for a clean stop. The same signal again within a second is
// that request delivered twice (GNU timeout and some supervisors signal the process, then
// its group), not a second one. Any later or other signal leaves at once (exit 1), still
// removing the L1 segment so that its memory does not stay behind in /dev/shm.
void OnSignal(int sig) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t now = int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  int first = 0;
  if (g_first_signal.compare_exchange_strong(first, sig)) {
    g_first_signal_ns.store(now);
    g_stop.store(true);
    return;
  }
  const int64_t first_ns = g_first_signal_ns.load();
  if (first == sig && (first_ns == 0 || now - first_ns < 1'000'000'000)) return;
  if (g_l1_segment_path[0] != '\0') unlink(g_l1_segment_path);
  _exit(1);
}

using kvd::cli::CliConfig;
using kvd::cli::HttpConfig;

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
std::string ConfigJson(const kvd::server::ServerConfig& c, const HttpConfig& h) {
  nlohmann::ordered_json j = {
      {"server", "kvd"},
      {"version", KVD_VERSION},
      {"zmq", {{"host", c.host}, {"port", c.port}, {"endpoint", c.ZmqEndpoint()},
               {"max_workers", c.max_workers}, {"copy_threads", c.copy_threads}}},
      {"http", {{"http_host", h.host}, {"http_port", h.port},
                {"metrics_enabled", h.metrics_enabled},
                {"admin_token", h.admin_token.empty() ? "none" : "set"},
                {"request_timeout_seconds", h.request_timeout_seconds}}},
      {"cache", {{"chunk_size", c.chunk_size}, {"hash_algorithm", c.hash_algorithm},
                 {"session_ttl_seconds", c.session_ttl_seconds},
                 {"supported_transfer_mode", c.supported_transfer_mode},
                 {"kv_event_log_size", c.kv_event_log_size},
                 {"instance_id", c.instance_id}}},
      {"l1", {{"l1_size_gb", c.l1_size_gb}, {"l1_size_bytes", c.l1_size_bytes()},
              {"shm_name", c.shm_name}, {"l1_use_lazy", c.l1_use_lazy},
              {"l1_use_hugepages", c.l1_use_hugepages}, {"l1_populate", c.l1_populate},
              {"eviction_policy", c.eviction_policy},
              {"eviction_trigger_watermark", c.eviction_trigger_watermark},
              {"eviction_ratio", c.eviction_ratio},
              {"l1_read_ttl_seconds", c.l1_read_ttl_seconds},
              {"l1_write_ttl_seconds", c.l1_write_ttl_seconds}}},
      {"workers", {{"worker_reap_timeout_seconds", c.worker_reap_timeout_seconds},
                   {"worker_registration_grace_seconds", c.worker_registration_grace_seconds}}},
      {"log_level", c.log_level},
  };
  nlohmann::ordered_json adapters = nlohmann::ordered_json::array();
  for (size_t i = 0; i < c.l2_adapters.size(); ++i) {
    auto a = kvd::l2::ParseAdapterConfig(c.l2_adapters[i], static_cast<int>(i));
    if (a.ok()) adapters.push_back(nlohmann::ordered_json::parse(a->RedactedJson()));
  }
  j["l2"] = {{"l2_adapter", adapters},
             {"l2_store_policy", c.l2_store_policy},
             {"l2_prefetch_policy", c.l2_prefetch_policy},
             {"l2_prefetch_max_in_flight", c.l2_prefetch_max_in_flight}};
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

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

// --enable-extra-logging: every interval, the store/retrieve throughput and the L1 usage.
class ExtraLogger {
 public:
  explicit ExtraLogger(double interval_seconds) : interval_(interval_seconds) {}
  void Tick(const kvd::server::ServiceCounters& c, const kvd::l1::L1Stats& l1) {
    const auto now = std::chrono::steady_clock::now();
    const uint64_t stored = c.stored_bytes.load(), retrieved = c.retrieved_bytes.load();
    const uint64_t stored_chunks = c.stored_chunks.load(), retrieved_chunks = c.retrieved_chunks.load();
    if (!started_) {
      started_ = true;
      last_ = now;
    } else if (std::chrono::duration<double>(now - last_).count() >= interval_) {
      const double dt = std::chrono::duration<double>(now - last_).count();
      spdlog::info("extra logging: store {:.3f} GB/s ({} chunks), retrieve {:.3f} GB/s ({} chunks) "
                   "over {:.1f} s; L1 {:.2f} of {:.2f} GiB used ({:.1f}%), {} entries",
                   static_cast<double>(stored - stored_) / dt / 1e9, stored_chunks - stored_chunks_,
                   static_cast<double>(retrieved - retrieved_) / dt / 1e9,
                   retrieved_chunks - retrieved_chunks_, dt,
                   static_cast<double>(l1.used_bytes) / (1ull << 30),
                   static_cast<double>(l1.capacity_bytes) / (1ull << 30),
                   l1.capacity_bytes ? 100.0 * static_cast<double>(l1.used_bytes) /
                                           static_cast<double>(l1.capacity_bytes)
                                     : 0.0,
                   l1.entries);
      last_ = now;
    } else {
      return;
    }
    stored_ = stored;
    retrieved_ = retrieved;
    stored_chunks_ = stored_chunks;
    retrieved_chunks_ = retrieved_chunks;
  }

 private:
  const double interval_;
  bool started_ = false;
  std::chrono::steady_clock::time_point last_{};
  uint64_t stored_ = 0, retrieved_ = 0, stored_chunks_ = 0, retrieved_chunks_ = 0;
};

// Descriptors: the soft RLIMIT_NOFILE is raised to the hard limit (as servers commonly do;
// nothing here uses select(), so descriptors past 1024 are fine), so that the connection
// bounds (--max-connections, --fd-reserve), not a low default, decide what a flood of
// connections can take. Logged either way.
void RaiseDescriptorLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t was = rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    // An unlimited hard limit is not a number setrlimit takes for descriptors (fs.nr_open caps it).
    if (want.rlim_max == RLIM_INFINITY) want.rlim_max = rlim_t{1} << 20;
    want.rlim_cur = want.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  if (rl.rlim_cur != was) {
    spdlog::info("descriptors: RLIMIT_NOFILE raised from {} to {} (the hard limit)", static_cast<uint64_t>(was),
                 static_cast<uint64_t>(rl.rlim_cur));
  } else {
    spdlog::info("descriptors: RLIMIT_NOFILE is {} (the hard limit is {})", static_cast<uint64_t>(rl.rlim_cur),
                 rl.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(rl.rlim_max));
  }
}

int RunServer(const CliConfig& cli) {
  const kvd::server::ServerConfig& cfg = cli.server;
  const HttpConfig& http_flags = cli.http;
  // A segment of this name left by a crashed kvd is replaced by the L1 pool (it logs a
  // warning); one that a *running* kvd still uses must not be taken from under it.
  if (int owner = cfg.shm_name.empty() ? 0 : LiveKvdUsingSegment(cfg.shm_name); owner > 0) {
    spdlog::error("cannot start: shared-memory segment /{} is in use by kvd (pid {}); choose "
                  "another --shm-name", cfg.shm_name, owner);
    return 1;
  }
  // From here on a signal means "stop cleanly" (also during the rest of startup).
  if (!cfg.shm_name.empty() && cfg.shm_name.size() + 10 < sizeof(g_l1_segment_path)) {
    std::snprintf(g_l1_segment_path, sizeof(g_l1_segment_path), "/dev/shm/%s", cfg.shm_name.c_str());
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  RaiseDescriptorLimit();
  kvd::cli::ReclaimDeadKvdSegments();  // what crashed kvds left in /dev/shm (stale_segments.h)
  kvd::SteadyClock clock;
  {
    // Every owner registers its own metric families here; declared first, so it outlives them.
    kvd::metrics::Registry registry;
    auto created = kvd::server::KvService::Create(cfg, &clock);
    if (!created.ok()) {
      spdlog::error("cannot start: {}", created.status().ToString());
      return 1;
    }
    std::unique_ptr<kvd::server::KvService> svc = std::move(created).value();
    const auto l1 = svc->l1_stats();
    svc->RegisterMetrics(registry);
    kvd::server::RequestMetrics metrics;
    metrics.RegisterMetrics(registry);
    // The server uses the service until it is destroyed: it goes first (below).
    auto server = std::make_unique<kvd::server::ZmqServer>(cfg, svc.get(), &metrics);
    if (auto st = server->Bind(); !st.ok()) {
      spdlog::error("cannot start: {}", st.message());
      return 1;
    }
    if (IsWildcard(cfg.host)) {
      spdlog::warn("listening on all interfaces ({}): any host that can reach this port can "
                   "read and write the cache", cfg.host);
    }

    std::atomic<int64_t> beat_ns{clock.NowNanos()};
    kvd::cli::ServiceStatsParts parts;
    parts.service = svc.get();
    parts.version = KVD_VERSION;
    parts.registry = &registry;
    parts.config = &cfg;
    {
      // The healthcheck probes the request loop at its bind address (loopback for a wildcard).
      kvd::server::ServerConfig probe = cfg;
      if (IsWildcard(probe.host)) probe.host = probe.host.find(':') != std::string::npos ? "::1" : "127.0.0.1";
      parts.probe_endpoint = probe.ZmqEndpoint();
    }
    parts.stopping = &g_stop;
    parts.maintenance_beat_ns = &beat_ns;
    std::unique_ptr<kvd::cli::ServiceStats> stats = kvd::cli::NewServiceStats(std::move(parts));
    kvd::http::HttpOptions ho;
    ho.host = http_flags.host;
    ho.port = http_flags.port;
    ho.metrics_enabled = http_flags.metrics_enabled;
    ho.version = KVD_VERSION;
    ho.config_json = ConfigJson(cfg, http_flags);
    ho.admin_token = http_flags.admin_token;
    ho.connections.request_timeout_seconds = http_flags.request_timeout_seconds;
    std::unique_ptr<kvd::http::HttpServer> http;
    if (http_flags.port != 0) {
      http = std::make_unique<kvd::http::HttpServer>(ho, stats.get(), stats.get());
      if (auto st = http->Start(); !st.ok()) {
        spdlog::error("cannot start: {}", st.message());
        return 1;
      }
      http->RegisterMetrics(registry);
      if (!IsLoopback(http_flags.host) && http_flags.admin_token.empty()) {
        spdlog::warn("HTTP on {} is reachable from other hosts: any of them can clear the "
                     "cache (POST /clear-cache) without credentials; set --admin-token-file",
                     http_flags.host);
      }
    }
    const auto page_kind = svc->l1().page_kind();
    spdlog::info("listening on {}; L1 {:.2f} GiB in {}; {}", cfg.ZmqEndpoint(),
                 static_cast<double>(l1.capacity_bytes) / (1ull << 30),
                 !cfg.shm_name.empty() ? "shared memory /" + cfg.shm_name
                 : page_kind == kvd::l1::PageKind::kHugeTlb
                     ? std::string("private memory, reserved 2 MiB huge pages")
                 : page_kind == kvd::l1::PageKind::kTransparentHuge
                     ? std::string("private memory, transparent huge pages")
                     : std::string("private memory"),
                 http ? "HTTP on http://" + http_flags.host + ":" + std::to_string(http->port()) +
                            " (dashboard /, metrics " +
                            (http_flags.metrics_enabled ? "/metrics" : "disabled") + ")"
                      : std::string("HTTP disabled (--http-port 0)"));
    std::thread maintenance([&] {
      EvictionReporter evictions;
      ExtraLogger extra(cli.extra_logging_interval);
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
        if (cli.extra_logging) extra.Tick(svc->counters(), after);
        beat_ns.store(clock.NowNanos());
      }
    });
    server->Run(g_stop);  // returns after in-flight requests were answered
    spdlog::info("shutting down: requests drained; stopping HTTP and releasing memory");
    maintenance.join();
    if (http) http->Stop();
    server.reset();  // before the service it points to
    const size_t instances = svc->num_instances();
    svc.reset();  // unmaps worker segments, removes the L1 segment
    if (cfg.shm_name.empty()) {
      spdlog::info("released {} worker registration(s) and L1", instances);
    } else {
      spdlog::info("released {} worker registration(s) and L1 segment /{}", instances, cfg.shm_name);
    }
  }
  spdlog::info("kvd stopped");
  return 0;
}

void PrintUsage(std::FILE* to) {
  std::fprintf(to,
               "usage: kvd server --l1-size-gb X --eviction-policy LRU [options]\n"
               "       kvd server --help | kvd --version\n"
               "kvd: native KV-cache server, wire-compatible with the lmcache 0.5.6 client\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--version" || args[0] == "-V")) {
    std::printf("kvd %s\n", KVD_VERSION);
    return 0;
  }
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    PrintUsage(stdout);
    return 0;
  }
  if (args.empty() || args[0] != "server") {
    if (!args.empty()) std::fprintf(stderr, "kvd: %s: unknown command (kvd has `server`)\n", args[0].c_str());
    PrintUsage(stderr);
    return 2;
  }
  args.erase(args.begin());
  if (std::find(args.begin(), args.end(), "--version") != args.end()) {
    std::printf("kvd %s\n", KVD_VERSION);
    return 0;
  }
  auto parsed = kvd::cli::ParseServerCommandLine(args, [](const char* name) { return std::getenv(name); });
  if (!parsed.ok()) {
    std::fprintf(stderr, "kvd: %s\n", parsed.status().message().c_str());
    return 2;
  }
  if (parsed->help) {
    std::fputs(kvd::cli::ServerHelp().c_str(), stdout);
    return 0;
  }
  CliConfig cli = std::move(parsed->config);
  if (cli.list_flags == "json") {
    std::puts(kvd::cli::FlagsJson().c_str());
    return 0;
  }
  if (cli.list_flags == "markdown") {
    std::fputs(kvd::cli::FlagsMarkdown().c_str(), stdout);
    return 0;
  }
  kvd::server::ServerConfig& cfg = cli.server;
  // Tier JSON is checked here, in one line, before anything starts (an unreachable server
  // is not an error: its tier keeps retrying).
  for (size_t i = 0; i < cfg.l2_adapters.size(); ++i) {
    auto a = kvd::l2::ParseAdapterConfig(cfg.l2_adapters[i], static_cast<int>(i));
    if (!a.ok()) {
      std::fprintf(stderr, "kvd: %s\n", a.status().message().c_str());
      return 2;
    }
  }
  // --admin-token-file: its first line is the token, read now so that --check-config checks it.
  if (!cli.http.admin_token_file.empty()) {
    std::ifstream f(cli.http.admin_token_file);
    if (!f.is_open()) {
      std::fprintf(stderr, "kvd: --admin-token-file %s: %s\n", cli.http.admin_token_file.c_str(),
                   std::strerror(errno));
      return 2;
    }
    std::string token;
    std::getline(f, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) {
      token.pop_back();
    }
    if (!kvd::cli::ValidAdminToken(token)) {
      std::fprintf(stderr, "kvd: --admin-token-file %s: the token must be 1 to 4096 visible ASCII "
                           "characters without blanks\n", cli.http.admin_token_file.c_str());
      return 2;
    }
    cli.http.admin_token = std::move(token);
  }
  cfg.log_level = cli.log_level;
  // L1 is shared memory unless it is in huge pages (private memory, no segment).
  if (cfg.shm_name.empty() && !cfg.l1_use_hugepages) {
    cfg.shm_name = "kvd_l1_pool_" + std::to_string(getpid());
  }
  if (!cfg.shm_name.empty() && cfg.shm_name[0] == '/') cfg.shm_name = cfg.shm_name.substr(1);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [kvd] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::from_str(cli.log_level));
  spdlog::info("kvd {} {}", KVD_VERSION, cli.check_only ? "configuration check" : "starting");
  for (const auto& line : kvd::cli::StartupSummary(cli)) spdlog::info("{}", line);
  for (const auto& note : parsed->notes) spdlog::info("{}", note);
  for (const auto& ig : parsed->ignored) {
    spdlog::info("accepted, no effect in kvd: {}{}{} ({})", ig.flag, ig.value.empty() ? "" : " ",
                 ig.value, ig.why);
  }
  if (cli.check_only) {
    spdlog::info("configuration OK; not starting (--check-config)");
    return 0;
  }
  // Times the one-chain hash kernels now, before any thread of kvd's own competes for the CPU.
  spdlog::info("chunk hashing: BLAKE3 {}", kvd::keys::TokenChainDescription());
  return RunServer(cli);
}
