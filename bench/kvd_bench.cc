// kvd-bench: a benchmark driver that speaks the lmcache 0.5.6 multiprocess wire protocol
// (ZMQ DEALER -> ROUTER, frames [uid, op, payload...], each a msgpack document) to any
// server URL, so the same workloads run against kvd and against `lmcache server`.
//
// Suites (--suite control|data|scale|hash|all, comma-separated lists allowed):
//   control  PING, LOOKUP (miss; hit for 1K / 8K / 32K-token prefixes; every lookup is
//            followed by QUERY_PREFETCH_STATUS until non-nil, then a fire-and-forget
//            END_SESSION as vLLM's scheduler does) and END_SESSION round trips at 1, 8 and
//            64 concurrent clients (one DEALER socket each), bounded by count and time.
//   data     STORE and RETRIEVE GB/s over CPU shared memory for a Llama-8B-like TP1 model
//            and a MiniMax-M3-like TP8 model (8 workers), next to single- and multi-thread
//            memcpy of the same number of bytes measured in the same run.
//   scale    server RSS (from /proc/<pid>/status) per cached chunk entry and lookup latency
//            as the cache fills with small (4 KiB) objects; server startup time for given
//            command lines (--startup-cmd).
//   hash     kvd's BLAKE3 chained chunk hashing, in-process (tokens/s and GB/s).
//
// Output: progress lines on stdout, machine-readable results with --json FILE.
// Every POSIX shared-memory segment the driver creates is named /kvdbench_<pid>_<n> and is
// unlinked on exit, on error and on SIGINT/SIGTERM.
//
// Layout: bench_util.h (JSON, stats, /proc, options), bench_client.h (the wire client; request
// frames come from src/wire/request_encoder.h), bench_models.h (shared-memory KV tensors,
// registration), one suite_<name>.cc per suite, this file (command line, suite order).
#include "suites.h"

namespace kvd::bench {
namespace {

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

bool Wants(const std::string& suites, const std::string& s) {
  if (suites == "all") return true;
  std::stringstream ss(suites);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == s || item == "all") return true;
  }
  return false;
}

}  // namespace

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvd-bench: benchmarks any lmcache 0.5.6 multiprocess-protocol server (kvd or "
               "`lmcache server`) over ZMQ"};
  app.add_option("--server-url", o.url, "Server URL, e.g. tcp://127.0.0.1:5555");
  app.add_option("--server-pid", o.server_pid, "Server process id (for RSS in the scale suite)");
  app.add_option("--suite", o.suites,
                 "control|data|scale|hash|all (comma-separated); `startup` alone times "
                 "--startup-cmd without a server")
      ->capture_default_str();
  app.add_flag("--quick", o.quick, "Tiny configuration (CI smoke test)");
  app.add_option("--json", o.json_path, "Write results as JSON to this file");
  app.add_option("--label", o.label, "Name of the server under test, stored in the JSON");
  app.add_option("--concurrency", o.concurrency, "Control-path client counts")->delimiter(',');
  app.add_option("--ctl-requests", o.ctl_requests, "Control: max requests per case and client count");
  app.add_option("--ctl-seconds", o.ctl_seconds, "Control: max seconds per case and client count");
  app.add_option("--ctl-timeout", o.ctl_timeout, "Control: per-request timeout (s)")->capture_default_str();
  app.add_option("--ctl-cases", o.ctl_cases,
                 "Control: only these cases (ping, lookup_miss_1k, lookup_hit_1k, lookup_hit_8k, "
                 "lookup_hit_32k, end_session, zmq_echo_floor)")
      ->delimiter(',');
  app.add_flag("!--no-transport-floor", o.transport_floor,
               "Control: skip the in-driver ZMQ echo (transport floor) reference case");
  app.add_option("--data-gb", o.data_gb, "Data: GiB stored per model (all ranks); the server's L1 "
                 "must hold it below its eviction watermark");
  app.add_option("--data-chunks-per-request", o.data_chunks_per_request, "Data: chunks per STORE/RETRIEVE");
  app.add_option("--data-passes", o.data_passes,
                 "Data: passes of steady-state STORE and of RETRIEVE (best one reported)");
  app.add_flag("!--no-minimax", o.data_minimax, "Data: skip the MiniMax-M3 TP8 model");
  app.add_option("--data-timeout", o.data_timeout, "Data: per-request timeout (s)")->capture_default_str();
  app.add_option("--scale-entries", o.scale_entries, "Scale: entry counts to measure at")->delimiter(',');
  app.add_option("--scale-chunks-per-request", o.scale_chunks_per_request, "Scale: chunks per STORE");
  app.add_option("--scale-fill-seconds", o.scale_fill_seconds, "Scale: time limit for filling");
  app.add_option("--scale-lookups", o.scale_lookups, "Scale: lookups timed per kind and level");
  app.add_option("--scale-tp", o.scale_tp,
                 "Scale: ranks of the tiny model (each chunk is this many objects, one per "
                 "rank; metadata is reported per entry and per object)")
      ->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--scale-head-dim", o.scale_head_dim,
                 "Scale: head size of the tiny model; an object is 4 x head_dim x chunk_size "
                 "bytes (4 KiB at the defaults)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--startup-cmd", o.startup_cmds,
                 "Scale: 'label::command' started to time its readiness; {port} is replaced by a "
                 "free loopback port (repeatable)");
  app.add_option("--startup-runs", o.startup_runs, "Scale: runs per startup command");
  app.add_option("--hash-tokens", o.hash_tokens, "Hash: tokens per hashed sequence");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Defaults: full run, or tiny with --quick.
  if (o.concurrency.empty()) o.concurrency = o.quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 64};
  if (o.ctl_requests <= 0) o.ctl_requests = o.quick ? 200 : 20000;
  if (o.ctl_seconds <= 0) o.ctl_seconds = o.quick ? 0.4 : 3.0;
  if (o.data_gb <= 0) o.data_gb = o.quick ? 0.05 : 3.0;
  if (o.data_chunks_per_request <= 0) o.data_chunks_per_request = o.quick ? 1 : 8;
  if (o.data_passes <= 0) o.data_passes = o.quick ? 1 : 3;
  if (o.scale_entries.empty()) {
    o.scale_entries = o.quick ? std::vector<int64_t>{1024, 2048} : std::vector<int64_t>{1000000};
  }
  std::sort(o.scale_entries.begin(), o.scale_entries.end());
  if (o.scale_chunks_per_request <= 0) o.scale_chunks_per_request = o.quick ? 256 : 4096;
  if (o.scale_fill_seconds <= 0) o.scale_fill_seconds = o.quick ? 20 : 300;
  if (o.scale_lookups <= 0) o.scale_lookups = o.quick ? 30 : 2000;
  if (o.startup_runs <= 0) o.startup_runs = o.quick ? 1 : 3;
  if (o.hash_tokens <= 0) o.hash_tokens = o.quick ? 65536 : 1 << 20;

  const bool scale_fill = Wants(o.suites, "scale") && o.scale_entries.back() > 0;
  const bool need_server = Wants(o.suites, "control") || Wants(o.suites, "data") || scale_fill;
  if (need_server && o.url.empty()) {
    std::fprintf(stderr, "kvd-bench: --server-url is required for the control, data and scale "
                         "suites (use --scale-entries 0 to time only --startup-cmd)\n");
    return 2;
  }

  signal(SIGINT, OnFatalSignal);
  signal(SIGTERM, OnFatalSignal);
  signal(SIGHUP, OnFatalSignal);
  std::atexit(UnlinkAllSegments);

  Json root = Json::Object();
  root["tool"] = "kvd-bench";
  root["format_version"] = 1;
  root["label"] = o.label;
  root["server_url"] = o.url;
  root["quick"] = o.quick;
  root["suites"] = o.suites;
  root["machine"] = MachineJson();
  {
    std::time_t t = std::time(nullptr);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    root["started_at"] = std::string(buf);
  }
  auto loadavg = [] {
    std::ifstream f("/proc/loadavg");
    std::string l;
    std::getline(f, l);
    return l;
  };
  root["loadavg_at_start"] = loadavg();
  const double t_start = Now();
  int rc = 0;
  zmq::context_t ctx(1);
  try {
    int64_t chunk = 256;
    if (need_server) {
      Conn c(ctx, o.url);
      auto r = c.Call(op().get_chunk_size, {}, 120);
      if (!r || !AsInt(*r)) throw BenchError("no GET_CHUNK_SIZE reply from " + o.url);
      chunk = *AsInt(*r);
      Log("server %s answers; chunk size %" PRId64 "%s", o.url.c_str(), chunk,
          o.server_pid > 0 ? (", pid " + std::to_string(o.server_pid)).c_str() : "");
      // The data models' blocks are 16 (Llama) and 128 (MiniMax-M3) tokens; the scale suite's
      // tiny model needs only 16 (small chunks keep a scale run's L1 small).
      const bool big_blocks = Wants(o.suites, "data") || Wants(o.suites, "control");
      if (chunk % (big_blocks ? 128 : 16) != 0) {
        throw BenchError(big_blocks ? "the models need a chunk size that is a multiple of 128"
                                    : "the scale suite needs a chunk size that is a multiple of 16");
      }
      Json s = Json::Object();
      s["chunk_size"] = chunk;
      s["pid"] = o.server_pid;
      s["rss_at_start"] = ProcMemJson(ReadProcMem(o.server_pid));
      root["server"] = std::move(s);
    }
    auto suite = [&](const char* name, const std::function<Json()>& fn) {
      if (!Wants(o.suites, name)) return;
      const double t0 = Now();
      try {
        root[name] = fn();
      } catch (const BenchError& e) {
        Log("%s suite failed: %s", name, e.what());
        Json j = Json::Object();
        j["error"] = e.what();
        root[name] = std::move(j);
        rc = 1;
      }
      root[name]["suite_seconds"] = Now() - t0;
    };
    suite("hash", [&] { return RunHash(o, chunk); });
    suite("control", [&] { return RunControl(ctx, o, chunk); });
    suite("data", [&] { return RunData(ctx, o, chunk); });
    if (scale_fill) suite("scale", [&] { return RunScale(ctx, o, chunk); });
    // Startup timing is part of the scale suite; `--suite startup` runs it alone.
    if (!o.startup_cmds.empty() &&
        (Wants(o.suites, "scale") || Wants(o.suites, "startup"))) {
      suite("startup", [&] { return RunStartup(ctx, o); });
    }
    if (need_server) root["server"]["rss_at_end"] = ProcMemJson(ReadProcMem(o.server_pid));
  } catch (const std::exception& e) {
    Log("error: %s", e.what());
    root["error"] = e.what();
    rc = 1;
  }
  root["total_seconds"] = Now() - t_start;
  root["loadavg_at_end"] = loadavg();
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << root.Dump();
    if (!f) {
      std::fprintf(stderr, "kvd-bench: cannot write %s\n", o.json_path.c_str());
      rc = 1;
    } else {
      Log("results written to %s", o.json_path.c_str());
    }
  }
  UnlinkAllSegments();
  return rc;
}

}  // namespace kvd::bench

int main(int argc, char** argv) { return kvd::bench::Main(argc, argv); }
