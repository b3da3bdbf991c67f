// kvd-bench suites "scale" (metadata per cached entry, lookups as the table grows) and
// "startup" (time to the first reply of a server command).
#include "suites.h"

namespace kvd::bench {
namespace {

// Scale: RSS per cached entry, lookup latency as the table grows, startup time
// ---------------------------------------------------------------------------------------

Stats TimeLookups(Conn& c, const std::string& model, int world_size, int64_t n, double seconds,
                  const std::function<std::vector<int64_t>(uint64_t)>& tokens_of, int64_t chunk,
                  int64_t expected, uint64_t* mismatches, uint64_t* errors) {
  std::vector<double> lats;
  const std::string tp = PackInt(world_size);
  const double until = Now() + seconds;
  for (int64_t i = 0; i < n && Now() < until; ++i) {
    std::vector<int64_t> t = tokens_of(static_cast<uint64_t>(i));
    const std::string blob = PackTokens(t);
    const std::string rid = "bench-scale-lk-" + Hex(RunNonce()) + "-" + std::to_string(i) + "-" +
                            std::to_string(t.size());
    KeyArgs k;
    k.model = model;
    k.world_size = world_size;
    k.tokens_blob = blob;
    k.end = static_cast<int64_t>(t.size()) / chunk * chunk;
    k.request_id = rid;
    const std::string key = PackKey(k), ridf = PackString(rid);
    int polls = 0;
    double t0 = Now();
    auto h = LookupAndWait(c, key, tp, ridf, 60, &polls);
    double t1 = Now();
    // A probe: its read locks go now (as a scheduler's that retrieves nothing), not after
    // the read TTL, so they do not count as metadata of the entries stored afterwards.
    c.Send(op().free_lookup_locks, {key, tp});
    c.Send(op().end_session, {ridf});
    if (!h) {
      (*errors)++;
      continue;
    }
    if (*h != expected) (*mismatches)++;
    lats.push_back(t1 - t0);
  }
  return Summarize(std::move(lats));
}


// Starts `cmd` ({port}, {port2}, {port3} replaced by free loopback ports) in its own process group, times
// the first GET_CHUNK_SIZE reply, reads its RSS, then stops it (SIGTERM, then SIGKILL).
Json MeasureStartup(zmq::context_t& ctx, const std::string& label, std::string cmd, int runs) {
  Json j = Json::Object();
  j["label"] = label;
  j["command"] = cmd;
  std::vector<double> times, stops;
  Json rss = Json::Array();
  for (int run = 0; run < runs; ++run) {
    const int port = FreeLoopbackPort();
    std::string c = cmd;
    for (size_t p; (p = c.find("{port}")) != std::string::npos;) {
      c.replace(p, 6, std::to_string(port));
    }
    // Extra free ports for servers that open more listeners (lmcache: HTTP, Prometheus).
    for (const char* ph : {"{port2}", "{port3}"}) {
      for (size_t p; (p = c.find(ph)) != std::string::npos;) {
        c.replace(p, 7, std::to_string(FreeLoopbackPort()));
      }
    }
    // Everything the child needs is prepared before fork (no allocation after it).
    const std::string shell_cmd = "exec " + c;
    char log_path[] = "/tmp/kvd-bench-startup-XXXXXX";
    const int log_fd = mkstemp(log_path);
    const double t0 = Now();
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
      if (log_fd >= 0) {
        dup2(log_fd, 1);
        dup2(log_fd, 2);
      }
      execl("/bin/sh", "sh", "-c", shell_cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    auto log_tail = [&]() -> std::string {
      std::ifstream f(log_path);
      std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      return all.size() > 600 ? all.substr(all.size() - 600) : all;
    };
    auto drop_log = [&] {
      if (log_fd >= 0) {
        close(log_fd);
        unlink(log_path);
      }
    };
    if (pid < 0) {
      drop_log();
      throw BenchError("fork failed");
    }
    setpgid(pid, pid);
    Conn conn(ctx, "tcp://127.0.0.1:" + std::to_string(port));
    std::optional<std::string> reply;
    const double deadline = t0 + 180;
    uint64_t uid = conn.Send(op().get_chunk_size, {});
    while (!reply && Now() < deadline) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        break;
      }
      reply = conn.Wait(uid, 0.05);
    }
    const double ready = Now() - t0;
    if (!reply) {
      if (pid > 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      j["error"] = "server did not answer GET_CHUNK_SIZE within 180 s (or exited); output: " +
                   log_tail();
      Log("startup %s: no answer; server output:\n%s", label.c_str(), log_tail().c_str());
      drop_log();
      break;
    }
    times.push_back(ready);
    rss.push_back(ProcMemJson(ReadProcMem(pid)));
    const double s0 = Now();
    kill(-pid, SIGTERM);
    bool exited = false;
    while (Now() - s0 < 30) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!exited) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    stops.push_back(Now() - s0);
    drop_log();
    Log("startup %s: ready in %.3f s, stopped in %.3f s%s", label.c_str(), ready, stops.back(),
        exited ? "" : " (SIGKILL)");
  }
  Json t = Json::Array();
  for (double x : times) t.push_back(x);
  j["ready_seconds"] = std::move(t);
  if (!times.empty()) {
    std::vector<double> s = times;
    std::sort(s.begin(), s.end());
    j["ready_seconds_median"] = s[s.size() / 2];
    j["ready_seconds_min"] = s.front();
  }
  Json st = Json::Array();
  for (double x : stops) st.push_back(x);
  j["stop_seconds"] = std::move(st);
  j["rss_after_ready"] = std::move(rss);
  return j;
}

}  // namespace

Json RunScale(zmq::context_t& ctx, const Options& o, int64_t chunk) {
  Json out = Json::Object();
  // object = 2 (K, V) * chunk * head_dim * 2 bytes: 4 KiB at chunk 256 and head_dim 4.
  const int64_t head = o.scale_head_dim;
  const int tp = o.scale_tp;
  const int64_t cpr = o.scale_chunks_per_request;
  const int64_t tokens_per_req = cpr * chunk;
  // Block 0 is vLLM's null block (a chunk of null blocks only is not stored, which a
  // 16-token chunk of block 0 would be): the requests use blocks 1.. of the tensor.
  ModelSpec m = TinyModel(tp == 1 ? "kvdbench/scale-tiny" : "kvdbench/scale-tiny-tp" + std::to_string(tp),
                          head, tokens_per_req / 16 + 1);
  m.world_size = tp;
  const int64_t obj = m.ObjectBytes(chunk);
  out["model"] = m.name;
  out["tp"] = tp;
  out["objects_per_entry"] = tp;
  out["object_bytes"] = obj;
  out["chunks_per_request"] = cpr;
  out["fill_seconds_limit"] = o.scale_fill_seconds;
  out["server_pid"] = o.server_pid;
  if (o.server_pid <= 0) out["rss_note"] = "no --server-pid: RSS not measured";

  if (!o.scale_entries.empty() && o.scale_entries.back() > 0) {
    Log("scale: object %" PRId64 " bytes, %" PRId64 " chunks per STORE; levels up to %" PRId64
        " entries",
        obj, cpr, o.scale_entries.back());
    auto reg = RegisterModel(ctx, o.url, m, 60);
    Conn sched(ctx, o.url);
    const std::string ev = PackBin("stub_ipc_handle"), ids = PackBlockIds(1, 1, tokens_per_req / 16);
    // Token space: request r covers [base + r*T, base + (r+1)*T), all < 2^32.
    const int64_t base = 1000 + static_cast<int64_t>(RunNonce() % 16) * 7;
    int64_t entries = 0, requests = 0, failures = 0;
    double fill_time = 0;
    auto store_one = [&]() {
      const std::vector<int64_t> t = Tokens(base + requests * tokens_per_req, tokens_per_req);
      const std::string blob = PackTokens(t);
      const std::string rid = "bench-scale-" + Hex(RunNonce()) + "-" + std::to_string(requests);
      const std::string ridf = PackString(rid);
      // Every rank stores its object of each chunk; the ranks' STOREs run concurrently.
      std::vector<std::string> keys, insts;
      for (const auto& w : reg->workers) {
        KeyArgs k;
        k.model = m.name;
        k.world_size = tp;
        k.worker_id = w->rank;
        k.tokens_blob = blob;
        k.end = tokens_per_req;
        k.request_id = rid;
        keys.push_back(PackKey(k));
        insts.push_back(PackInt(w->instance_id));
      }
      double t0 = Now();
      std::vector<uint64_t> uids;
      for (size_t i = 0; i < reg->workers.size(); ++i) {
        uids.push_back(reg->workers[i]->conn->Send(op().store, {keys[i], insts[i], ids, ev}));
      }
      bool ok = true;
      for (size_t i = 0; i < reg->workers.size(); ++i) {
        auto r = reg->workers[i]->conn->Wait(uids[i], o.data_timeout);
        ok = ok && r && HandleOk(*r);
      }
      // End the session like vLLM does when the request finishes (frees its token list).
      reg->workers[0]->conn->Call(op().end_session, {ridf}, o.data_timeout);
      fill_time += Now() - t0;
      requests++;
      if (ok) {
        entries += cpr;
      } else {
        failures++;
      }
    };
    // The first request maps and touches the client tensor in the server: baseline after it.
    store_one();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const ProcMem base_mem = ReadProcMem(o.server_pid);
    const int64_t base_entries = entries;
    out["baseline"] = ProcMemJson(base_mem);
    out["baseline_entries"] = base_entries;
    Json levels = Json::Array();
    const double fill_start = Now();
    int64_t last_entries = entries;
    double last_time = fill_time;
    ProcMem prev_mem = base_mem;
    int64_t prev_entries = base_entries;
    bool out_of_time = false;
    for (int64_t target : o.scale_entries) {
      while (entries < target && failures < 3) {
        if (Now() - fill_start > o.scale_fill_seconds) {
          out_of_time = true;
          break;
        }
        store_one();
        if (requests % 64 == 0) {
          Log("scale: %" PRId64 " entries stored (%.0f entries/s overall, %.0f entries/s in the "
              "last %" PRId64 ")",
              entries, static_cast<double>(entries - base_entries) / std::max(1e-9, fill_time),
              static_cast<double>(entries - last_entries) / std::max(1e-9, fill_time - last_time),
              entries - last_entries);
          last_entries = entries;
          last_time = fill_time;
        }
      }
      if (failures >= 3) Log("scale: STORE failed %" PRId64 " times; stopping the fill", failures);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      Json lv = Json::Object();
      lv["target_entries"] = target;
      lv["entries"] = entries;
      lv["reached"] = entries >= target;
      lv["store_failures"] = failures;
      lv["fill_seconds"] = fill_time;
      lv["fill_entries_per_s"] =
          fill_time > 0 ? static_cast<double>(entries - base_entries) / fill_time : 0.0;
      const ProcMem mem = ReadProcMem(o.server_pid);
      lv["rss"] = ProcMemJson(mem);
      if (mem.ok && base_mem.ok && entries > base_entries) {
        const double n = static_cast<double>(entries - base_entries);
        const double anon = static_cast<double>(mem.rss_anon - base_mem.rss_anon);
        const double shm = static_cast<double>(mem.rss_shmem - base_mem.rss_shmem);
        const double total = static_cast<double>(mem.vm_rss - base_mem.vm_rss);
        // Anonymous memory is where a server keeps its table, locks and LRU. kvd's L1 is
        // shared memory (RssShmem); lmcache's CPU L1 is anonymous memory it touches at
        // startup, so for both the anonymous growth is the per-entry metadata.
        lv["metadata_bytes_per_entry"] = anon / n;
        lv["metadata_bytes_per_object"] = anon / n / tp;
        lv["rss_anon_bytes_per_entry"] = anon / n;
        lv["rss_shmem_bytes_per_entry"] = shm / n;
        lv["rss_bytes_per_entry"] = total / n;
        // Growth since the previous level only: insensitive to one-off allocations made
        // while the first entries were stored (pools, arenas, lazily built structures).
        if (prev_mem.ok && entries > prev_entries) {
          lv["metadata_bytes_per_entry_marginal"] =
              static_cast<double>(mem.rss_anon - prev_mem.rss_anon) /
              static_cast<double>(entries - prev_entries);
          lv["metadata_bytes_per_object_marginal"] =
              static_cast<double>(mem.rss_anon - prev_mem.rss_anon) /
              static_cast<double>(entries - prev_entries) / tp;
        }
      }
      prev_mem = mem;
      prev_entries = entries;
      // Lookup latency at this size: a stored 1K and 32K prefix of a random request, and a
      // 1K miss.
      std::mt19937_64 rng(42 + static_cast<uint64_t>(target));
      const int64_t stored_reqs = std::max<int64_t>(1, entries / cpr);
      uint64_t mism = 0, errs = 0;
      const double lk_secs = o.quick ? 0.5 : 3.0;
      auto hit_tokens = [&](int64_t n) {
        return [&, n](uint64_t) {
          int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(stored_reqs));
          return Tokens(base + r * tokens_per_req, n);
        };
      };
      Json lk = Json::Object();
      const int64_t n32 = std::min<int64_t>(32768, tokens_per_req);
      Stats s1 = TimeLookups(sched, m.name, tp, o.scale_lookups, lk_secs, hit_tokens(1024), chunk,
                             1024 / chunk, &mism, &errs);
      Stats s32 = TimeLookups(sched, m.name, tp, o.scale_lookups, lk_secs, hit_tokens(n32), chunk,
                              n32 / chunk, &mism, &errs);
      Stats sm = TimeLookups(
          sched, m.name, tp, o.scale_lookups, lk_secs,
          [&](uint64_t i) {
            auto t = Tokens(0, 1024);
            t[0] = 3900000000ll + static_cast<int64_t>((RunNonce() + i) % 90000000ull);
            return t;
          },
          chunk, 0, &mism, &errs);
      lk["lookup_hit_1k"] = StatsJsonUs(s1);
      lk["lookup_hit_32k"] = StatsJsonUs(s32);
      lk["lookup_hit_32k_tokens"] = n32;
      lk["lookup_miss_1k"] = StatsJsonUs(sm);
      lk["mismatches"] = mism;
      lk["errors"] = errs;
      lv["lookup"] = std::move(lk);
      Log("scale: %" PRId64 " entries: RSS %.1f MiB (anon %.1f MiB, shmem %.1f MiB)%s; lookup "
          "p50 hit1k %.1f us, hit32k %.1f us, miss1k %.1f us%s",
          entries, static_cast<double>(mem.vm_rss) / kMiB, static_cast<double>(mem.rss_anon) / kMiB,
          static_cast<double>(mem.rss_shmem) / kMiB,
          (mem.ok && base_mem.ok && entries > base_entries)
              ? (", anon growth " +
                 std::to_string(static_cast<int64_t>(
                     static_cast<double>(mem.rss_anon - base_mem.rss_anon) /
                     static_cast<double>(entries - base_entries))) +
                 " B/entry (" + std::to_string(tp) + " object(s) each)")
                    .c_str()
              : "",
          s1.p50 * 1e6, s32.p50 * 1e6, sm.p50 * 1e6,
          mism ? " (UNEXPECTED HIT COUNTS)" : "");
      levels.push_back(std::move(lv));
      if (out_of_time || failures >= 3) break;
    }
    if (out_of_time) {
      out["fill_note"] = "fill stopped at the time limit (--scale-fill-seconds) before the last "
                         "level";
    }
    out["levels"] = std::move(levels);
    sched.Call(op().clear, {kTrue}, 300);
    UnregisterModel(*reg, 60);
  }
  return out;
}

Json RunStartup(zmq::context_t& ctx, const Options& o) {
  Json out = Json::Object();
  Json st = Json::Array();
  for (const auto& spec : o.startup_cmds) {
    auto p = spec.find("::");
    std::string label = p == std::string::npos ? "server" : spec.substr(0, p);
    std::string cmd = p == std::string::npos ? spec : spec.substr(p + 2);
    st.push_back(MeasureStartup(ctx, label, cmd, o.startup_runs));
  }
  out["servers"] = std::move(st);
  if (o.startup_cmds.empty()) out["note"] = "no --startup-cmd given";
  return out;
}

// ---------------------------------------------------------------------------------------

}  // namespace kvd::bench
