// CliConfig: everything `kvd server` reads from its command line and environment, after
// parsing and validation (flags.h). The server part goes to KvService and the ZMQ loop,
// the HTTP part to http::HttpServer; the rest is process behaviour (logging, --check-config).
// Plain values; built once on the main thread, then read-only.
#pragma once

#include <string>

#include "server/config.h"

namespace kvd::cli {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8080;              // 0: no HTTP endpoints (a kvd extension)
  bool metrics_enabled = true;  // --disable-metrics / --disable-observability turn it off
  std::string admin_token;      // --admin-token, or the first line of --admin-token-file
  std::string admin_token_file; // --admin-token-file (read at startup, after parsing)
  double request_timeout_seconds = 10;  // --http-request-timeout-seconds
};

struct CliConfig {
  server::ServerConfig server;
  HttpConfig http;
  // --max-gpu-workers / --max-cpu-workers: kvd has one pool; the larger of the two sizes it
  // when --max-workers is not given (0: not given).
  int max_gpu_workers = 0;
  int max_cpu_workers = 0;
  bool max_workers_given = false;
  bool observability = true;    // --disable-observability: no metrics, no KV-event stream
  // --enable-extra-logging: one line every extra_logging_interval seconds with the store and
  // retrieve throughput and the L1 usage.
  bool extra_logging = false;
  double extra_logging_interval = 10.0;
  std::string log_level = "info";          // spdlog level name
  std::string log_level_source = "default"; // "--log-level", "LMCACHE_LOG_LEVEL" or "default"
  bool check_only = false;                 // --check-config: validate, print, exit 0
  std::string list_flags;                  // --list-flags FORMAT (json | markdown)
};

}  // namespace kvd::cli
