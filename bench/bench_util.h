// kvd-bench shared utilities: clock, log lines, errors, an ordered JSON value, latency
// statistics, /proc readers and the command-line options every suite reads.
// Header-only; used by the driver's suites (bench/suite_*.cc). Log is thread-safe; the rest
// are plain values or stateless functions.
#pragma once

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <msgpack.hpp>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "keys/blake3.h"
#include "keys/chunk_hasher.h"
#include "keys/token_hash.h"
#include "wire/ops.h"


namespace kvd::bench {

// ---------------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------------

using SteadyClock = std::chrono::steady_clock;

inline double Now() {
  return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count();
}

void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void Log(const char* fmt, ...) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fputs("[kvd-bench] ", stdout);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}


struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr double kGB = 1e9;  // throughput is reported in decimal GB/s

// ---------------------------------------------------------------------------------------
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// Minimal ordered JSON value (no third-party dependency)
// ---------------------------------------------------------------------------------------

class Json {
 public:
  using Arr = std::vector<Json>;
  using Obj = std::vector<std::pair<std::string, Json>>;

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : v_(b) {}
  Json(int i) : v_(static_cast<int64_t>(i)) {}
  Json(long i) : v_(static_cast<int64_t>(i)) {}
  Json(long long i) : v_(static_cast<int64_t>(i)) {}
  Json(unsigned i) : v_(static_cast<int64_t>(i)) {}
  Json(unsigned long i) : v_(static_cast<int64_t>(i)) {}
  Json(unsigned long long i) : v_(static_cast<int64_t>(i)) {}
  Json(double d) : v_(d) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string s) : v_(std::move(s)) {}

  static Json Array() {
    Json j;
    j.v_ = Arr{};
    return j;
  }
  static Json Object() {
    Json j;
    j.v_ = Obj{};
    return j;
  }

  // Object member (created if absent).
  Json& operator[](const std::string& key) {
    if (!std::holds_alternative<Obj>(v_)) v_ = Obj{};
    auto& o = std::get<Obj>(v_);
    for (auto& [k, v] : o) {
      if (k == key) return v;
    }
    o.emplace_back(key, Json());
    return o.back().second;
  }
  void push_back(Json v) {
    if (!std::holds_alternative<Arr>(v_)) v_ = Arr{};
    std::get<Arr>(v_).push_back(std::move(v));
  }

  std::string Dump() const {
    std::string out;
    DumpTo(out, 0);
    out += '\n';
    return out;
  }

 private:
  static void Escape(std::string& out, const std::string& s) {
    out += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
    }
    out += '"';
  }
  void DumpTo(std::string& out, int indent) const {
    const std::string pad(indent + 2, ' '), end_pad(indent, ' ');
    if (std::holds_alternative<std::monostate>(v_)) {
      out += "null";
    } else if (auto* b = std::get_if<bool>(&v_)) {
      out += *b ? "true" : "false";
    } else if (auto* i = std::get_if<int64_t>(&v_)) {
      out += std::to_string(*i);
    } else if (auto* d = std::get_if<double>(&v_)) {
      if (!std::isfinite(*d)) {
        out += "null";
      } else {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.10g", *d);
        out += buf;
      }
    } else if (auto* s = std::get_if<std::string>(&v_)) {
      Escape(out, *s);
    } else if (auto* a = std::get_if<Arr>(&v_)) {
      if (a->empty()) {
        out += "[]";
        return;
      }
      out += "[\n";
      for (size_t k = 0; k < a->size(); ++k) {
        out += pad;
        (*a)[k].DumpTo(out, indent + 2);
        out += k + 1 < a->size() ? ",\n" : "\n";
      }
      out += end_pad + "]";
    } else if (auto* o = std::get_if<Obj>(&v_)) {
      if (o->empty()) {
        out += "{}";
        return;
      }
      out += "{\n";
      for (size_t k = 0; k < o->size(); ++k) {
        out += pad;
        Escape(out, (*o)[k].first);
        out += ": ";
        (*o)[k].second.DumpTo(out, indent + 2);
        out += k + 1 < o->size() ? ",\n" : "\n";
      }
      out += end_pad + "}";
    }
  }

  std::variant<std::monostate, bool, int64_t, double, std::string, Arr, Obj> v_;
};

// ---------------------------------------------------------------------------------------
// Latency statistics
// ---------------------------------------------------------------------------------------

struct Stats {
  uint64_t n = 0;
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, max = 0, min = 0;
};

inline Stats Summarize(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto pct = [&](double q) {
    size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
    return v[std::min(i, v.size() - 1)];
  };
  s.p50 = pct(0.50);
  s.p90 = pct(0.90);
  s.p99 = pct(0.99);
  s.min = v.front();
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

inline Json StatsJsonUs(const Stats& s) {
  Json j = Json::Object();
  j["n"] = s.n;
  j["p50_us"] = s.p50 * 1e6;
  j["p90_us"] = s.p90 * 1e6;
  j["p99_us"] = s.p99 * 1e6;
  j["mean_us"] = s.mean * 1e6;
  j["min_us"] = s.min * 1e6;
  j["max_us"] = s.max * 1e6;
  return j;
}

// ---------------------------------------------------------------------------------------
// /proc readers
// ---------------------------------------------------------------------------------------

struct ProcMem {
  bool ok = false;
  int64_t vm_rss = 0, rss_anon = 0, rss_file = 0, rss_shmem = 0, vm_hwm = 0;  // bytes
};

inline ProcMem ReadProcMem(int pid) {
  ProcMem m;
  if (pid <= 0) return m;
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    auto take = [&](const char* key, int64_t* out) {
      size_t n = std::strlen(key);
      if (line.compare(0, n, key) == 0) {
        *out = std::atoll(line.c_str() + n) * 1024;
        m.ok = true;
      }
    };
    take("VmRSS:", &m.vm_rss);
    take("RssAnon:", &m.rss_anon);
    take("RssFile:", &m.rss_file);
    take("RssShmem:", &m.rss_shmem);
    take("VmHWM:", &m.vm_hwm);
  }
  return m;
}

// CPU time and page faults of a process (all its threads), from /proc/<pid>/stat.
struct ProcCpu {
  bool ok = false;
  double cpu_s = 0;        // utime + stime
  int64_t minflt = 0, majflt = 0;
};

inline ProcCpu ReadProcCpu(int pid) {
  ProcCpu c;
  if (pid <= 0) return c;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return c;
  auto rp = line.rfind(')');
  if (rp == std::string::npos) return c;
  std::istringstream in(line.substr(rp + 2));
  std::vector<std::string> v;
  for (std::string t; in >> t;) v.push_back(t);
  // Fields after the command: state(3) ... minflt(10) cminflt majflt(12) cmajflt utime(14)
  // stime(15); v[0] is field 3.
  if (v.size() < 13) return c;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  c.minflt = std::atoll(v[7].c_str());
  c.majflt = std::atoll(v[9].c_str());
  c.cpu_s = (std::atof(v[11].c_str()) + std::atof(v[12].c_str())) / tick;
  c.ok = true;
  return c;
}

inline Json ProcMemJson(const ProcMem& m) {
  if (!m.ok) return Json();
  Json j = Json::Object();
  j["vm_rss_bytes"] = m.vm_rss;
  j["rss_anon_bytes"] = m.rss_anon;
  j["rss_file_bytes"] = m.rss_file;
  j["rss_shmem_bytes"] = m.rss_shmem;
  j["vm_hwm_bytes"] = m.vm_hwm;
  return j;
}

inline Json MachineJson() {
  Json j = Json::Object();
  j["nproc"] = static_cast<int64_t>(std::thread::hardware_concurrency());
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) j["cpu_model"] = line.substr(p + 2);
      break;
    }
  }
  std::ifstream mem("/proc/meminfo");
  while (std::getline(mem, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      j["mem_total_bytes"] = static_cast<int64_t>(std::atoll(line.c_str() + 9)) * 1024;
      break;
    }
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  j["hostname"] = std::string(host);
  return j;
}

// ---------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------

struct Options {
  std::string url;
  int server_pid = 0;
  std::string suites = "all";
  bool quick = false;
  std::string json_path;
  std::string label;
  // control
  std::vector<int> concurrency;
  int64_t ctl_requests = 0;  // per (case, concurrency), all clients together
  double ctl_seconds = 0;    // per (case, concurrency)
  double ctl_timeout = 30;
  bool transport_floor = true;
  std::vector<std::string> ctl_cases;  // empty: all
  // data
  double data_gb = 0;        // bytes stored per model (all ranks), GiB
  int data_chunks_per_request = 0;
  int data_passes = 0;
  bool data_minimax = true;
  double data_timeout = 600;
  // scale
  std::vector<int64_t> scale_entries;
  int64_t scale_chunks_per_request = 0;
  double scale_fill_seconds = 0;
  int64_t scale_lookups = 0;
  int scale_tp = 1;             // ranks of the tiny model (one worker each)
  int64_t scale_head_dim = 4;   // its head size: objects of 4 x head_dim x chunk bytes
  std::vector<std::string> startup_cmds;  // "label::command with {port}"
  int startup_runs = 0;
  // hash
  int64_t hash_tokens = 0;
};

}  // namespace kvd::bench
