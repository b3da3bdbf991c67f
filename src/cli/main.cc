// kvd command line: `kvd server …` takes the flags of `lmcache server` (same names and
// defaults) that matter for a native cache server, validates them, and runs the server
// until SIGINT/SIGTERM. A flag of `lmcache server` that kvd does not implement fails at
// startup with one line naming it.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>
#include <unistd.h>

#include "common/clock.h"
#include "kvd_version.h"
#include "server/config.h"
#include "server/kv_service.h"
#include "server/zmq_server.h"

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
    "--no-separate-object-groups", "--enable-segmented-prefix", "--worker-registration-grace-seconds",
    "--runtime-plugin-locations", "--runtime-plugin-config", "--script-allowed-imports",
    "--null-block-id", "--isolated-ipc", "--l1-init-size-gb", "--l1-align-bytes",
    "--l1-use-hugepages", "--l1-devdax-path", "--gds-l1-path", "--gds-l1-use-direct-io",
    "--gds-l1-backend", "--l1-manager", "--l2-adapter", "--l2-store-policy",
    "--l2-prefetch-policy", "--l2-prefetch-max-in-flight", "--l2-prefetch-load-timeout",
    "--periodic-notifier-interval-ms", "--p2p-advertise-url", "--p2p-listen-url",
    "--p2p-lookup-timeout", "--p2p-load-timeout", "--p2p-transfer-engine", "--p2p-rdma-device",
    "--p2p-rdma-port", "--p2p-rdma-gid-index", "--p2p-rdma-gid-indices", "--p2p-rdma-queue-depth",
    "--p2p-rdma-handshake-timeout-ms", "--coordinator-url", "--coordinator-advertise-ip",
    "--coordinator-heartbeat-interval", "--coordinator-l2-event-reporting",
    "--coordinator-l2-event-flush-interval", "--http-host", "--http-port",
    "--disable-observability", "--disable-metrics", "--disable-logging", "--enable-tracing",
    "--otlp-endpoint", "--event-bus-queue-size", "--prometheus-port", "--metrics-sample-rate",
    "--trace-level", "--trace-output", "--lookup-hash-log-dir"};

int RunServer(const kvd::server::ServerConfig& cfg) {
  spdlog::info("kvd {} starting: {}", KVD_VERSION, cfg.Describe());
  kvd::SteadyClock clock;
  auto svc = kvd::server::KvService::Create(cfg, &clock);
  if (!svc.ok()) {
    spdlog::error("cannot start: {}", svc.status().ToString());
    return 1;
  }
  auto stats = (*svc)->l1_stats();
  kvd::server::ZmqServer server(cfg, svc->get());
  if (auto st = server.Bind(); !st.ok()) {
    spdlog::error("cannot start: {}", st.message());
    return 1;
  }
  if (cfg.host == "0.0.0.0" || cfg.host == "*" || cfg.host == "::") {
    spdlog::warn("listening on all interfaces ({}): any host that can reach this port can "
                 "read and write the cache", cfg.host);
  }
  spdlog::info("listening on {}; L1 {:.2f} GiB in shared memory /{}", cfg.ZmqEndpoint(),
               static_cast<double>(stats.capacity_bytes) / (1ull << 30), cfg.shm_name);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::thread maintenance([&] {
    while (!g_stop.load()) {
      for (int i = 0; i < 10 && !g_stop.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (!g_stop.load()) (*svc)->Maintain();
    }
  });
  server.Run(g_stop);
  maintenance.join();
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
  srv->add_option("--worker-reap-timeout-seconds", cfg.worker_reap_timeout_seconds, "Forget workers silent this long (0: never)")->capture_default_str()->check(CLI::Range(0.0, 1e9));
  bool lazy = true;
  srv->add_flag("--l1-use-lazy,!--no-l1-use-lazy", lazy, "Accepted for compatibility: kvd's L1 is always sparse shared memory, backed as it fills");
  srv->add_option("--log-level", cfg.log_level, "trace, debug, info, warning, error")->capture_default_str()->check(CLI::IsMember({"trace", "debug", "info", "warning", "warn", "error"}));

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
  if (cfg.shm_name.empty()) cfg.shm_name = "kvd_l1_pool_" + std::to_string(getpid());
  if (!cfg.shm_name.empty() && cfg.shm_name[0] == '/') cfg.shm_name = cfg.shm_name.substr(1);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [kvd] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::from_str(cfg.log_level == "warning" ? "warn" : cfg.log_level));
  return RunServer(cfg);
}
