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
#include "wire/ops.h"

namespace {

// ---------------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------------

using SteadyClock = std::chrono::steady_clock;

double Now() {
  return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count();
}

void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Log(const char* fmt, ...) {
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

int FreeLoopbackPort();

struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr double kGB = 1e9;  // throughput is reported in decimal GB/s

// ---------------------------------------------------------------------------------------
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
// POSIX shared memory segments, unlinked on every exit path
// ---------------------------------------------------------------------------------------

constexpr int kMaxSegments = 8192;
char g_seg_names[kMaxSegments][64];
std::atomic<bool> g_seg_live[kMaxSegments];
std::atomic<int> g_seg_count{0};

void UnlinkAllSegments() {
  const int n = std::min(g_seg_count.load(), kMaxSegments);
  for (int i = 0; i < n; ++i) {
    if (g_seg_live[i].exchange(false)) shm_unlink(g_seg_names[i]);
  }
}

void OnFatalSignal(int sig) {
  UnlinkAllSegments();  // shm_unlink is async-signal-safe
  signal(sig, SIG_DFL);
  raise(sig);
}

class ShmSegment {
 public:
  ShmSegment() = default;
  explicit ShmSegment(size_t bytes) : size_(bytes) {
    slot_ = g_seg_count.fetch_add(1);
    if (slot_ >= kMaxSegments) throw BenchError("too many shared-memory segments");
    std::snprintf(g_seg_names[slot_], sizeof(g_seg_names[slot_]), "/kvdbench_%d_%d",
                  static_cast<int>(getpid()), slot_);
    name_ = g_seg_names[slot_];
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw BenchError("shm_open " + name_ + ": " + std::strerror(errno));
    g_seg_live[slot_].store(true);
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      close(fd);
      Release();
      throw BenchError("ftruncate " + name_ + ": " + std::strerror(e));
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      int e = errno;
      Release();
      throw BenchError("mmap " + name_ + ": " + std::strerror(e));
    }
    ptr_ = static_cast<uint8_t*>(p);
  }
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept {
    if (this != &o) {
      Release();
      slot_ = std::exchange(o.slot_, -1);
      name_ = std::move(o.name_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~ShmSegment() { Release(); }

  void Release() {
    if (ptr_) munmap(ptr_, size_);
    ptr_ = nullptr;
    if (slot_ >= 0 && g_seg_live[slot_].exchange(false)) shm_unlink(name_.c_str());
    slot_ = -1;
  }
  uint8_t* data() const { return ptr_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  int slot_ = -1;
  std::string name_;
  uint8_t* ptr_ = nullptr;
  size_t size_ = 0;
};

void FillPattern(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t* w = reinterpret_cast<uint64_t*>(p);
  const size_t words = n / 8;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < words; ++i) w[i] = x + i * 0xD1B54A32D192ED03ull;
  for (size_t i = words * 8; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i);
}

uint64_t Checksum(const uint8_t* p, size_t n) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  const size_t words = n / 8;
  uint64_t a = 1, b = 2, c = 3, d = 4;
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    a = (a ^ w[i]) * 0x100000001B3ull;
    b = (b ^ w[i + 1]) * 0x100000001B3ull;
    c = (c ^ w[i + 2]) * 0x100000001B3ull;
    d = (d ^ w[i + 3]) * 0x100000001B3ull;
  }
  for (; i < words; ++i) a = (a ^ w[i]) * 0x100000001B3ull;
  for (size_t k = words * 8; k < n; ++k) b = (b ^ p[k]) * 0x100000001B3ull;
  return a ^ (b << 1) ^ (c << 2) ^ (d << 3);
}

// ---------------------------------------------------------------------------------------
// msgpack encoding of requests (what the lmcache 0.5.6 client sends)
// ---------------------------------------------------------------------------------------

using Packer = msgpack::packer<msgpack::sbuffer>;

template <typename Fn>
std::string Pack(Fn&& fn, size_t reserve = 64) {
  msgpack::sbuffer buf(reserve);
  Packer pk(buf);
  fn(pk, buf);
  return std::string(buf.data(), buf.size());
}

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

std::string PackInt(int64_t v) {
  return Pack([&](Packer& pk, msgpack::sbuffer&) { pk.pack_int64(v); });
}
std::string PackString(std::string_view s) {
  return Pack([&](Packer& pk, msgpack::sbuffer&) { PackStr(pk, s); });
}
std::string PackBin(std::string_view s) {
  return Pack([&](Packer& pk, msgpack::sbuffer&) {
    pk.pack_bin(static_cast<uint32_t>(s.size()));
    pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
  });
}
const std::string kNil(1, '\xc0');
const std::string kTrue(1, '\xc3');

// A token list as a msgpack array (smallest int encodings, as msgspec writes them).
std::string PackTokens(const std::vector<int64_t>& tokens) {
  return Pack(
      [&](Packer& pk, msgpack::sbuffer&) {
        pk.pack_array(static_cast<uint32_t>(tokens.size()));
        for (int64_t t : tokens) pk.pack_uint64(static_cast<uint64_t>(t));
      },
      tokens.size() * 5 + 8);
}

// IPCCacheServerKey: a map with every field, in the dataclass's declaration order.
struct KeyArgs {
  std::string_view model;
  int64_t world_size = 1;
  std::optional<int64_t> worker_id;
  std::string_view tokens_blob;  // PackTokens() of the token ids
  int64_t start = 0;
  int64_t end = 0;
  std::string_view request_id;
  int64_t num_kv_readers = 1;
};

std::string PackKey(const KeyArgs& k) {
  return Pack(
      [&](Packer& pk, msgpack::sbuffer& buf) {
        pk.pack_map(10);
        PackStr(pk, "model_name");
        PackStr(pk, k.model);
        PackStr(pk, "world_size");
        pk.pack_int64(k.world_size);
        PackStr(pk, "worker_id");
        if (k.worker_id) {
          pk.pack_int64(*k.worker_id);
        } else {
          pk.pack_nil();
        }
        PackStr(pk, "token_ids");
        buf.write(k.tokens_blob.data(), k.tokens_blob.size());
        PackStr(pk, "start");
        pk.pack_int64(k.start);
        PackStr(pk, "end");
        pk.pack_int64(k.end);
        PackStr(pk, "request_id");
        PackStr(pk, k.request_id);
        PackStr(pk, "cache_salt");
        PackStr(pk, "");
        PackStr(pk, "request_configs");
        pk.pack_nil();
        PackStr(pk, "num_kv_readers");
        pk.pack_int64(k.num_kv_readers);
      },
      k.tokens_blob.size() + 256);
}

// block_ids: `lists` copies of [first, first + count) (one list per LMCache KV group).
std::string PackBlockIds(int lists, int64_t first, int64_t count) {
  return Pack(
      [&](Packer& pk, msgpack::sbuffer&) {
        pk.pack_array(static_cast<uint32_t>(lists));
        for (int l = 0; l < lists; ++l) {
          pk.pack_array(static_cast<uint32_t>(count));
          for (int64_t i = 0; i < count; ++i) pk.pack_int64(first + i);
        }
      },
      static_cast<size_t>(lists * count * 3 + 16));
}

// ---------------------------------------------------------------------------------------
// The wire client: one DEALER socket, one outstanding request at a time
// ---------------------------------------------------------------------------------------

int OpId(std::string_view name) {
  const auto* info = kvd::wire::FindOpByName(name);
  if (!info || info->legacy_id < 0) throw BenchError("no wire id for op " + std::string(name));
  return info->legacy_id;
}

struct Ops {
  int register_kv_cache = OpId("register_kv_cache");
  int unregister_kv_cache = OpId("unregister_kv_cache");
  int store = OpId("store");
  int retrieve = OpId("retrieve");
  int lookup = OpId("lookup");
  int query_prefetch_status = OpId("query_prefetch_status");
  int end_session = OpId("end_session");
  int clear = OpId("clear");
  int get_chunk_size = OpId("get_chunk_size");
  int ping = OpId("ping");
};
const Ops& op() {
  static const Ops ops;
  return ops;
}

class Conn {
 public:
  Conn(zmq::context_t& ctx, const std::string& url) : sock_(ctx, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::reconnect_ivl, 20);
    sock_.set(zmq::sockopt::sndhwm, 0);
    sock_.set(zmq::sockopt::rcvhwm, 0);
    sock_.connect(url);
  }

  // Sends [uid, op, payloads...]; returns the uid.
  uint64_t Send(int op_id, const std::vector<std::string_view>& payloads) {
    const uint64_t uid = next_uid_++;
    const std::string uid_frame = PackInt(static_cast<int64_t>(uid));
    const std::string op_frame = PackInt(op_id);
    sock_.send(zmq::buffer(uid_frame), zmq::send_flags::sndmore);
    sock_.send(zmq::buffer(op_frame),
               payloads.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < payloads.size(); ++i) {
      sock_.send(zmq::buffer(payloads[i].data(), payloads[i].size()),
                 i + 1 < payloads.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    return uid;
  }

  // The reply frame for `uid`; replies to other (fire-and-forget) requests are dropped.
  // nullopt on timeout.
  std::optional<std::string> Wait(uint64_t uid, double timeout_s) {
    const std::string want = PackInt(static_cast<int64_t>(uid));
    const double deadline = Now() + timeout_s;
    std::vector<zmq::message_t> frames;
    for (;;) {
      double left = deadline - Now();
      if (left <= 0) return std::nullopt;
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(static_cast<long>(left * 1000) + 1));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      frames.clear();
      if (!zmq::recv_multipart(sock_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        continue;
      }
      // [uid, op, reply]; a server may leave the reply frame out for None (lmcache 0.5.6
      // does), which the client reads as nil.
      if (frames.size() >= 2 && frames[0].to_string_view() == want) {
        return frames.size() >= 3 ? frames.back().to_string() : kNil;
      }
    }
  }

  std::optional<std::string> Call(int op_id, const std::vector<std::string_view>& payloads,
                                  double timeout_s) {
    return Wait(Send(op_id, payloads), timeout_s);
  }

 private:
  zmq::socket_t sock_;
  uint64_t next_uid_ = 0;
};

// ---- reply decoding ----

bool IsNil(const std::string& r) { return r.size() == 1 && static_cast<uint8_t>(r[0]) == 0xc0; }

std::optional<int64_t> AsInt(const std::string& r) {
  try {
    auto oh = msgpack::unpack(r.data(), r.size());
    const auto& o = oh.get();
    if (o.type == msgpack::type::POSITIVE_INTEGER) return static_cast<int64_t>(o.via.u64);
    if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

bool AsTrue(const std::string& r) { return r == kTrue; }

// STORE / RETRIEVE reply: [event_handle: bin, ok: bool].
bool HandleOk(const std::string& r) {
  try {
    auto oh = msgpack::unpack(r.data(), r.size());
    const auto& o = oh.get();
    return o.type == msgpack::type::ARRAY && o.via.array.size == 2 &&
           o.via.array.ptr[1].type == msgpack::type::BOOLEAN && o.via.array.ptr[1].via.boolean;
  } catch (const std::exception&) {
    return false;
  }
}

// ---------------------------------------------------------------------------------------
// Latency statistics
// ---------------------------------------------------------------------------------------

struct Stats {
  uint64_t n = 0;
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, max = 0, min = 0;
};

Stats Summarize(std::vector<double> v) {
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

Json StatsJsonUs(const Stats& s) {
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

ProcMem ReadProcMem(int pid) {
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

ProcCpu ReadProcCpu(int pid) {
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

Json ProcMemJson(const ProcMem& m) {
  if (!m.ok) return Json();
  Json j = Json::Object();
  j["vm_rss_bytes"] = m.vm_rss;
  j["rss_anon_bytes"] = m.rss_anon;
  j["rss_file_bytes"] = m.rss_file;
  j["rss_shmem_bytes"] = m.rss_shmem;
  j["vm_hwm_bytes"] = m.vm_hwm;
  return j;
}

Json MachineJson() {
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
// Models: KV tensors in shared memory, registered the way the lmcache CPU client does
// ---------------------------------------------------------------------------------------

struct TensorSpec {
  std::vector<int64_t> shape;  // bf16, contiguous; shape[0] is the block dimension
                               // except for kv-first tensors (shape[1])
  int block_dim = 0;
};

struct ModelSpec {
  std::string name;        // model_name on the wire
  std::string label;       // name in the results
  int world_size = 1;      // TP ranks, each one worker (instance)
  int block_size = 16;     // tokens per vLLM block
  std::string kv_layout;   // layout_hints.kv_layout
  std::vector<TensorSpec> tensors;            // per rank, registration order
  std::vector<std::vector<int>> group_infos;  // layer indices per engine_group_info
                                              // (all of engine group 0)
  int64_t num_blocks = 0;

  int64_t TensorElems(const TensorSpec& t) const {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    return n;
  }
  // Bytes of one block of one tensor.
  int64_t BlockBytes(const TensorSpec& t) const {
    return TensorElems(t) * 2 / t.shape[t.block_dim];
  }
  // Bytes of one chunk object of one rank (what a STORE copies per chunk).
  int64_t ObjectBytes(int64_t chunk_tokens) const {
    int64_t sum = 0;
    for (const auto& t : tensors) sum += BlockBytes(t) * (chunk_tokens / block_size);
    return sum;
  }
  int64_t RankBufferBytes() const {
    int64_t sum = 0;
    for (const auto& t : tensors) sum += TensorElems(t) * 2;
    return sum;
  }
};

// Llama-3-8B-like: 32 layers x [2, NB, 16, 8, 128] bf16 (vLLM FlashAttention, NHD), TP1.
ModelSpec LlamaModel(int layers, int64_t num_blocks) {
  ModelSpec m;
  m.name = "kvdbench/llama-8b-like";
  m.label = "llama8b_tp1";
  m.world_size = 1;
  m.block_size = 16;
  m.kv_layout = "NHD";
  m.num_blocks = num_blocks;
  std::vector<int> all;
  for (int l = 0; l < layers; ++l) {
    m.tensors.push_back({{2, num_blocks, 16, 8, 128}, 1});
    all.push_back(l);
  }
  m.group_infos = {all};
  return m;
}

// MiniMax-M3-like, per rank at TP8 (vllm_side.md §3.4): 60 main K/V tensors
// [NB, 1, 128, 256] (one KV head, K|V packed) and 57 key-only indexer tensors
// [NB, 128, 128] for layers 3..59, interleaved in vLLM's layer order, block size 128.
// The lmcache client splits them into two group infos of engine group 0.
ModelSpec MiniMaxModel(int layers, int dense_layers, int tp, int64_t num_blocks) {
  ModelSpec m;
  m.name = "kvdbench/minimax-m3-like";
  m.label = "minimax_m3_tp" + std::to_string(tp);
  m.world_size = tp;
  m.block_size = 128;
  m.kv_layout = "HND";
  m.num_blocks = num_blocks;
  std::vector<int> main_idx, indexer_idx;
  for (int l = 0; l < layers; ++l) {
    main_idx.push_back(static_cast<int>(m.tensors.size()));
    m.tensors.push_back({{num_blocks, 1, 128, 256}, 0});
    if (l >= dense_layers) {
      indexer_idx.push_back(static_cast<int>(m.tensors.size()));
      m.tensors.push_back({{num_blocks, 128, 128}, 0});
    }
  }
  m.group_infos = {main_idx};
  if (!indexer_idx.empty()) m.group_infos.push_back(indexer_idx);
  return m;
}

// A tiny model: 1 layer [2, NB, 16, 1, head] bf16; an object is 2*256*head*2 bytes.
ModelSpec TinyModel(const std::string& name, int64_t head, int64_t num_blocks) {
  ModelSpec m;
  m.name = name;
  m.label = name;
  m.world_size = 1;
  m.block_size = 16;
  m.kv_layout = "NHD";
  m.num_blocks = num_blocks;
  m.tensors.push_back({{2, num_blocks, 16, 1, head}, 1});
  m.group_infos = {{0}};
  return m;
}

std::string PackTensorDescriptor(const ShmSegment& seg, const TensorSpec& t) {
  std::vector<int64_t> stride(t.shape.size(), 1);
  for (int d = static_cast<int>(t.shape.size()) - 2; d >= 0; --d) {
    stride[d] = stride[d + 1] * t.shape[d + 1];
  }
  std::string body = Pack([&](Packer& pk, msgpack::sbuffer&) {
    pk.pack_map(5);
    PackStr(pk, "type");
    PackStr(pk, "cpu_shm");
    PackStr(pk, "shm_name");
    PackStr(pk, seg.name());
    PackStr(pk, "nbytes");
    pk.pack_uint64(seg.size());
    PackStr(pk, "version");
    pk.pack_int64(1);
    PackStr(pk, "metadata");
    pk.pack_map(5);
    PackStr(pk, "dtype");
    PackStr(pk, "bfloat16");
    PackStr(pk, "shape");
    pk.pack_array(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) pk.pack_int64(d);
    PackStr(pk, "stride");
    pk.pack_array(static_cast<uint32_t>(stride.size()));
    for (int64_t d : stride) pk.pack_int64(d);
    PackStr(pk, "storage_offset");
    pk.pack_int64(0);
    PackStr(pk, "device_uuid");
    PackStr(pk, "cpu");
  });
  return body;
}

// One TP rank: its KV tensors (one shm segment each, like the lmcache CPU client) and its
// own DEALER socket.
struct Worker {
  int rank = 0;
  int64_t instance_id = 0;
  std::vector<ShmSegment> segments;
  std::unique_ptr<Conn> conn;

  uint64_t BufferChecksum() const {
    uint64_t c = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      c ^= Checksum(segments[i].data(), segments[i].size()) * (2 * i + 1);
    }
    return c;
  }
};

struct Registered {
  ModelSpec model;
  std::vector<std::unique_ptr<Worker>> workers;
};

int64_t NewInstanceId() {
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(getpid()));
  return static_cast<int64_t>(rng() >> 2);
}

// Creates, fills and registers every rank's tensors. Throws on failure.
std::unique_ptr<Registered> RegisterModel(zmq::context_t& ctx, const std::string& url,
                                          const ModelSpec& m, double timeout_s) {
  auto reg = std::make_unique<Registered>();
  reg->model = m;
  for (int r = 0; r < m.world_size; ++r) {
    auto w = std::make_unique<Worker>();
    w->rank = r;
    w->instance_id = NewInstanceId();
    w->conn = std::make_unique<Conn>(ctx, url);
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      ShmSegment seg(static_cast<size_t>(m.TensorElems(m.tensors[t]) * 2));
      FillPattern(seg.data(), seg.size(), (static_cast<uint64_t>(r) << 32) + t + 1);
      w->segments.push_back(std::move(seg));
    }
    std::string descs = Pack([&](Packer& pk, msgpack::sbuffer&) {
      pk.pack_array(static_cast<uint32_t>(m.tensors.size()));
      for (size_t t = 0; t < m.tensors.size(); ++t) {
        std::string body = PackTensorDescriptor(w->segments[t], m.tensors[t]);
        pk.pack_ext(body.size(), 1);
        pk.pack_ext_body(body.data(), static_cast<uint32_t>(body.size()));
      }
    });
    std::string groups = Pack([&](Packer& pk, msgpack::sbuffer&) {
      pk.pack_array(static_cast<uint32_t>(m.group_infos.size()));
      for (const auto& g : m.group_infos) {
        pk.pack_map(6);
        PackStr(pk, "engine_group_id");
        pk.pack_int64(0);
        PackStr(pk, "layer_indices");
        pk.pack_array(static_cast<uint32_t>(g.size()));
        for (int i : g) pk.pack_int64(i);
        PackStr(pk, "tokens_per_block");
        pk.pack_int64(0);
        PackStr(pk, "sw_size_tokens");
        pk.pack_int64(-1);
        PackStr(pk, "extra_object_group_tag");
        pk.pack_int64(0);
        PackStr(pk, "recurrent_state");
        pk.pack_false();
      }
    });
    std::string hints = Pack([&](Packer& pk, msgpack::sbuffer&) {
      pk.pack_map(1);
      PackStr(pk, "kv_layout");
      PackStr(pk, m.kv_layout);
    });
    const std::string p_inst = PackInt(w->instance_id), p_model = PackString(m.name),
                      p_ws = PackInt(m.world_size), p_engine = PackString("vllm");
    auto reply = w->conn->Call(op().register_kv_cache,
                               {p_inst, descs, p_model, p_ws, p_engine, hints, groups}, timeout_s);
    if (!reply) {
      throw BenchError("register_kv_cache of " + m.label + " rank " + std::to_string(r) +
                       ": no reply within " + std::to_string(timeout_s) + " s");
    }
    reg->workers.push_back(std::move(w));
  }
  return reg;
}

void UnregisterModel(Registered& reg, double timeout_s) {
  for (auto& w : reg.workers) {
    const std::string p = PackInt(w->instance_id);
    (void)w->conn->Call(op().unregister_kv_cache, {p}, timeout_s);
  }
  reg.workers.clear();  // unmaps and unlinks the segments
}

// A request's tokens: `n` distinct ids starting at `base` (< 2^32).
std::vector<int64_t> Tokens(int64_t base, int64_t n) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (base + i) % 4000000000ll;
  return t;
}

uint64_t RunNonce() {
  static uint64_t nonce = (static_cast<uint64_t>(std::random_device{}()) << 16) ^
                          static_cast<uint64_t>(getpid()) ^
                          static_cast<uint64_t>(Now() * 1e6);
  return nonce;
}

std::string Hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "%" PRIx64, v);
  return b;
}

// LOOKUP then QUERY_PREFETCH_STATUS until non-nil. Returns hit chunks (or nullopt on
// timeout / bad reply); *polls counts the QUERY requests.
std::optional<int64_t> LookupAndWait(Conn& c, const std::string& key_frame,
                                     const std::string& tp_frame, const std::string& rid_frame,
                                     double timeout_s, int* polls, double* ack_s = nullptr) {
  const double t0 = Now();
  auto ack = c.Call(op().lookup, {key_frame, tp_frame}, timeout_s);
  if (!ack) return std::nullopt;
  if (ack_s) *ack_s = Now() - t0;
  const double deadline = Now() + timeout_s;
  int n = 0;
  for (;;) {
    auto r = c.Call(op().query_prefetch_status, {rid_frame}, timeout_s);
    ++n;
    if (!r) return std::nullopt;
    if (!IsNil(*r)) {
      if (polls) *polls = n;
      return AsInt(*r);
    }
    if (Now() > deadline) return std::nullopt;
    // Back off gently: the first re-polls are immediate, later ones sleep (vLLM polls once
    // per scheduler step).
    if (n > 2) std::this_thread::sleep_for(std::chrono::microseconds(std::min(n * 20, 1000)));
  }
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
  std::vector<std::string> startup_cmds;  // "label::command with {port}"
  int startup_runs = 0;
  // hash
  int64_t hash_tokens = 0;
};

// ---------------------------------------------------------------------------------------
// Control path
// ---------------------------------------------------------------------------------------

enum class OpResult { kOk, kError, kMismatch, kDone };

// What an operation reports besides its result: QUERY requests sent and, for lookups, the
// round trip of the LOOKUP acknowledgement alone.
struct OpOut {
  int polls = 0;
  double ack_s = -1;
};

// One client's per-operation function: runs operation number `i` of client `c` on its
// connection and fills *out.
using ClientOp = std::function<OpResult(Conn&, int c, uint64_t i, OpOut* out)>;

struct CaseResult {
  std::string name;
  int concurrency = 0;
  uint64_t ops = 0, errors = 0, mismatches = 0, polls = 0;
  double seconds = 0;
  double server_cpu_s = -1;  // server CPU time (user + system) during the timed window
  Stats lat;
  Stats ack;                 // lookups: the LOOKUP acknowledgement round trip alone
};

CaseResult RunClients(zmq::context_t& ctx, const Options& o, const std::string& name, int conc,
                      int warmup_per_client, const ClientOp& fn,
                      const std::function<void(Conn&, int)>& prep = nullptr) {
  CaseResult res;
  res.name = name;
  res.concurrency = conc;
  std::atomic<int64_t> budget{o.ctl_requests};
  std::atomic<bool> go{false};
  std::latch ready(conc);
  std::vector<std::vector<double>> lats(conc), acks(conc);
  std::vector<uint64_t> errors(conc, 0), mism(conc, 0), polls(conc, 0);
  std::vector<double> ends(conc, 0);
  double start = 0, deadline = 0;
  std::vector<std::thread> threads;
  std::atomic<double> start_a{0}, deadline_a{0};
  for (int c = 0; c < conc; ++c) {
    threads.emplace_back([&, c] {
      Conn conn(ctx, o.url);
      uint64_t i = 0;
      OpOut p;
      if (prep) prep(conn, c);
      for (int w = 0; w < warmup_per_client; ++w) {
        if (fn(conn, c, i++, &p) == OpResult::kDone) break;
      }
      ready.count_down();
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const double dl = deadline_a.load();
      lats[c].reserve(4096);
      for (;;) {
        if (budget.fetch_sub(1) <= 0) break;
        double t0 = Now();
        if (t0 > dl) break;
        p = OpOut();
        OpResult r = fn(conn, c, i++, &p);
        double t1 = Now();
        if (r == OpResult::kDone) break;
        polls[c] += static_cast<uint64_t>(p.polls);
        if (p.ack_s >= 0 && r != OpResult::kError) acks[c].push_back(p.ack_s);
        if (r == OpResult::kError) {
          errors[c]++;
          continue;
        }
        if (r == OpResult::kMismatch) mism[c]++;
        lats[c].push_back(t1 - t0);
      }
      ends[c] = Now();
    });
  }
  ready.wait();
  const ProcCpu cpu0 = ReadProcCpu(o.server_pid);
  start = Now();
  deadline = start + o.ctl_seconds;
  start_a.store(start);
  deadline_a.store(deadline);
  go.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();
  const ProcCpu cpu1 = ReadProcCpu(o.server_pid);
  if (cpu0.ok && cpu1.ok) res.server_cpu_s = cpu1.cpu_s - cpu0.cpu_s;
  double end = start;
  std::vector<double> all, all_acks;
  for (int c = 0; c < conc; ++c) {
    all_acks.insert(all_acks.end(), acks[c].begin(), acks[c].end());
    end = std::max(end, ends[c]);
    all.insert(all.end(), lats[c].begin(), lats[c].end());
    res.errors += errors[c];
    res.mismatches += mism[c];
    res.polls += polls[c];
  }
  res.ops = all.size();
  res.seconds = end - start;
  res.lat = Summarize(std::move(all));
  res.ack = Summarize(std::move(all_acks));
  return res;
}

Json CaseJson(const CaseResult& r) {
  Json j = Json::Object();
  j["name"] = r.name;
  j["concurrency"] = r.concurrency;
  j["ops"] = r.ops;
  j["errors"] = r.errors;
  j["mismatches"] = r.mismatches;
  j["seconds"] = r.seconds;
  j["rps"] = r.seconds > 0 ? static_cast<double>(r.ops) / r.seconds : 0.0;
  j["p50_us"] = r.lat.p50 * 1e6;
  j["p90_us"] = r.lat.p90 * 1e6;
  j["p99_us"] = r.lat.p99 * 1e6;
  j["mean_us"] = r.lat.mean * 1e6;
  j["max_us"] = r.lat.max * 1e6;
  j["queries_per_op"] = r.ops ? static_cast<double>(r.polls) / static_cast<double>(r.ops) : 0.0;
  if (r.ack.n > 0) {
    j["lookup_ack_p50_us"] = r.ack.p50 * 1e6;
    j["lookup_ack_p99_us"] = r.ack.p99 * 1e6;
  }
  if (r.server_cpu_s >= 0) {
    j["server_cpu_s"] = r.server_cpu_s;
    // Server CPU per operation (clock-tick resolution: meaningful for long windows only).
    j["server_cpu_us_per_op"] =
        r.ops ? r.server_cpu_s / static_cast<double>(r.ops) * 1e6 : 0.0;
  }
  return j;
}

void LogCase(const char* suite, const CaseResult& r) {
  Log("%s %-16s c=%-3d %7" PRIu64 " ops in %5.2f s  %9.0f req/s  p50 %8.1f us  p99 %8.1f us"
      "%s%s",
      suite, r.name.c_str(), r.concurrency, r.ops, r.seconds,
      r.seconds > 0 ? static_cast<double>(r.ops) / r.seconds : 0.0, r.lat.p50 * 1e6,
      r.lat.p99 * 1e6, r.errors ? "  ERRORS " : "",
      r.errors ? std::to_string(r.errors).c_str() : "");
  if (r.mismatches) Log("%s %s c=%d: %" PRIu64 " replies had an unexpected value", suite,
                        r.name.c_str(), r.concurrency, r.mismatches);
}

// A lookup workload: fixed token blob (hits) or a fresh miss sequence per operation.
ClientOp LookupOp(const Options& o, const std::string& model, const std::string& case_name,
                  std::shared_ptr<const std::string> hit_tokens, int64_t num_tokens,
                  int64_t expected_hits, int64_t chunk) {
  const std::string tp = PackInt(1);
  const uint64_t nonce = RunNonce();
  return [=, &o](Conn& conn, int c, uint64_t i, OpOut* out) -> OpResult {
    std::string rid = "bench-" + case_name + "-" + Hex(nonce) + "-" + std::to_string(c) + "-" +
                      std::to_string(i);
    std::string miss_blob;
    if (!hit_tokens) {
      // Never-stored tokens: the first token makes the chain unique per operation.
      std::vector<int64_t> t = Tokens(0, num_tokens);
      t[0] = 3000000000ll + static_cast<int64_t>((nonce + static_cast<uint64_t>(c) * 1000003ull +
                                                   i * 7919ull) % 900000000ull);
      miss_blob = PackTokens(t);
    }
    KeyArgs k;
    k.model = model;
    k.world_size = 1;
    k.tokens_blob = hit_tokens ? std::string_view(*hit_tokens) : std::string_view(miss_blob);
    k.start = 0;
    k.end = num_tokens / chunk * chunk;
    k.request_id = rid;
    const std::string key = PackKey(k), rid_frame = PackString(rid);
    auto hits = LookupAndWait(conn, key, tp, rid_frame, o.ctl_timeout, &out->polls, &out->ack_s);
    // vLLM's scheduler ends the session without waiting for the reply.
    conn.Send(op().end_session, {rid_frame});
    if (!hits) return OpResult::kError;
    return *hits == expected_hits ? OpResult::kOk : OpResult::kMismatch;
  };
}

// A ROUTER on a loopback port that answers every request with `true`, in this process:
// the round-trip floor of ZMQ over TCP loopback on this machine (no server work at all).
class EchoServer {
 public:
  explicit EchoServer(zmq::context_t& ctx) : sock_(ctx, zmq::socket_type::router) {
    sock_.set(zmq::sockopt::linger, 0);
    port_ = FreeLoopbackPort();
    sock_.bind("tcp://127.0.0.1:" + std::to_string(port_));
    thread_ = std::thread([this] { Loop(); });
  }
  ~EchoServer() {
    stop_.store(true);
    thread_.join();
  }
  std::string url() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

 private:
  void Loop() {
    std::vector<zmq::message_t> frames;
    while (!stop_.load()) {
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      for (int i = 0; i < 256; ++i) {
        frames.clear();
        if (!zmq::recv_multipart(sock_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          break;
        }
        if (frames.size() < 3) continue;
        sock_.send(frames[0], zmq::send_flags::sndmore);
        sock_.send(frames[1], zmq::send_flags::sndmore);
        sock_.send(frames[2], zmq::send_flags::sndmore);
        sock_.send(zmq::buffer(kTrue), zmq::send_flags::none);
      }
    }
  }
  zmq::socket_t sock_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Json RunControl(zmq::context_t& ctx, const Options& o, int64_t chunk) {
  Json out = Json::Object();
  Json cases = Json::Array();
  // Setup: a tiny registered model with one stored 32K-token prefix (128 chunks).
  const int64_t max_tokens = 32768;
  const int64_t blocks = max_tokens / 16;
  ModelSpec m = TinyModel("kvdbench/control-tiny", 64, blocks);
  Log("control: registering %s and storing a %" PRId64 "-token prefix", m.name.c_str(),
      max_tokens);
  auto reg = RegisterModel(ctx, o.url, m, 60);
  Worker& w = *reg->workers[0];
  // Deterministic tokens so that reruns against one server hit the same chunks.
  const std::vector<int64_t> seq = Tokens(1000000, max_tokens);
  {
    const std::string blob = PackTokens(seq);
    KeyArgs k;
    k.model = m.name;
    k.worker_id = 0;
    k.tokens_blob = blob;
    k.end = max_tokens / chunk * chunk;
    const std::string rid = "bench-control-setup-" + Hex(RunNonce());
    k.request_id = rid;
    const std::string key = PackKey(k), inst = PackInt(w.instance_id),
                      ids = PackBlockIds(1, 0, k.end / 16), ev = PackBin("stub_ipc_handle");
    auto r = w.conn->Call(op().store, {key, inst, ids, ev}, 120);
    if (!r || !HandleOk(*r)) throw BenchError("control setup: STORE of the prefix failed");
    w.conn->Call(op().end_session, {PackString(rid)}, 30);
  }
  out["model"] = m.name;
  out["requests_limit"] = o.ctl_requests;
  out["seconds_limit"] = o.ctl_seconds;

  struct HitCase {
    std::string name;
    int64_t tokens;
  };
  std::vector<HitCase> hit_cases = {{"lookup_hit_1k", 1024}, {"lookup_hit_8k", 8192},
                                    {"lookup_hit_32k", 32768}};
  std::map<int64_t, std::shared_ptr<const std::string>> blobs;
  for (const auto& h : hit_cases) {
    blobs[h.tokens] = std::make_shared<const std::string>(
        PackTokens(std::vector<int64_t>(seq.begin(), seq.begin() + h.tokens)));
  }

  auto want = [&](const std::string& name) {
    return o.ctl_cases.empty() ||
           std::find(o.ctl_cases.begin(), o.ctl_cases.end(), name) != o.ctl_cases.end();
  };
  std::unique_ptr<EchoServer> echo;
  if (o.transport_floor && want("zmq_echo_floor")) echo = std::make_unique<EchoServer>(ctx);
  for (int conc : o.concurrency) {
    const int warm = o.quick ? 2 : 5;
    if (echo) {
      // Same frames as PING, answered by the driver's own ROUTER (not the server under test).
      Options eo = o;
      eo.url = echo->url();
      eo.server_pid = 0;
      ClientOp fn = [&](Conn& conn, int, uint64_t, OpOut*) {
        auto r = conn.Call(op().ping, {kNil}, o.ctl_timeout);
        return r ? OpResult::kOk : OpResult::kError;
      };
      auto r = RunClients(ctx, eo, "zmq_echo_floor", conc, warm, fn);
      LogCase("control", r);
      Json j = CaseJson(r);
      j["reference"] = "in-driver ZMQ ROUTER echo: transport round-trip floor, not the server";
      cases.push_back(std::move(j));
    }
    // ping (the scheduler's heartbeat form: instance_id nil)
    if (want("ping")) {
      ClientOp fn = [&](Conn& conn, int, uint64_t, OpOut*) {
        auto r = conn.Call(op().ping, {kNil}, o.ctl_timeout);
        if (!r) return OpResult::kError;
        return AsTrue(*r) ? OpResult::kOk : OpResult::kMismatch;
      };
      auto r = RunClients(ctx, o, "ping", conc, warm, fn);
      LogCase("control", r);
      cases.push_back(CaseJson(r));
    }
    if (want("lookup_miss_1k")) {
      auto fn = LookupOp(o, m.name, "miss1k", nullptr, 1024, 0, chunk);
      auto r = RunClients(ctx, o, "lookup_miss_1k", conc, warm, fn);
      LogCase("control", r);
      cases.push_back(CaseJson(r));
    }
    for (const auto& h : hit_cases) {
      if (!want(h.name)) continue;
      auto fn = LookupOp(o, m.name, h.name, blobs[h.tokens], h.tokens, h.tokens / chunk, chunk);
      auto r = RunClients(ctx, o, h.name, conc, warm, fn);
      LogCase("control", r);
      cases.push_back(CaseJson(r));
    }
    // end_session of sessions that a 1K-token lookup created (prepared per client before
    // the clock starts, bounded by count and time).
    if (want("end_session")) {
      const uint64_t per_client =
          static_cast<uint64_t>(std::max<int64_t>(1, (o.ctl_requests + conc - 1) / conc));
      std::vector<std::vector<std::string>> sessions(conc);
      auto lookup = LookupOp(o, m.name, "es-prep", blobs[1024], 1024, 1024 / chunk, chunk);
      const std::string tp = PackInt(1);
      auto prep = [&](Conn& conn, int c) {
        const double until = Now() + o.ctl_seconds;
        for (uint64_t i = 0; i < per_client + static_cast<uint64_t>(warm) && Now() < until;
             ++i) {
          std::string rid = "bench-es-" + Hex(RunNonce()) + "-" + std::to_string(conc) + "-" +
                            std::to_string(c) + "-" + std::to_string(i);
          KeyArgs k;
          k.model = m.name;
          k.tokens_blob = *blobs[1024];
          k.end = 1024 / chunk * chunk;
          k.request_id = rid;
          int polls = 0;
          if (LookupAndWait(conn, PackKey(k), tp, PackString(rid), o.ctl_timeout, &polls)) {
            sessions[c].push_back(PackString(rid));
          }
        }
      };
      ClientOp fn = [&](Conn& conn, int c, uint64_t i, OpOut*) {
        if (i >= sessions[c].size()) return OpResult::kDone;
        auto r = conn.Call(op().end_session, {sessions[c][i]}, o.ctl_timeout);
        return r ? OpResult::kOk : OpResult::kError;
      };
      auto r = RunClients(ctx, o, "end_session", conc, warm, fn, prep);
      LogCase("control", r);
      cases.push_back(CaseJson(r));
    }
  }
  out["cases"] = std::move(cases);
  UnregisterModel(*reg, 30);
  return out;
}

// ---------------------------------------------------------------------------------------
// Data path
// ---------------------------------------------------------------------------------------

// memcpy of `total` bytes from `src` pieces into a destination ring, on `threads` threads.
// `fresh`: the destination is newly mapped (first-touch page faults included, as for a
// server writing into L1 pages for the first time); otherwise it is pre-faulted.
double MemcpyGBps(const std::vector<std::pair<const uint8_t*, size_t>>& src, uint64_t total,
                  int threads, bool fresh) {
  if (src.empty() || total == 0) return 0;
  size_t piece_max = 0;
  for (const auto& s : src) piece_max = std::max(piece_max, s.second);
  const uint64_t ring = fresh ? total : std::min<uint64_t>(total, uint64_t{1} << 30);
  const uint64_t ring_bytes = std::max<uint64_t>(ring, piece_max) + piece_max;
  void* p = mmap(nullptr, ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  uint8_t* dst = static_cast<uint8_t*>(p);
  if (!fresh) std::memset(dst, 1, ring_bytes);
  // The job list: pieces in order, cycling over the sources, until `total` bytes.
  struct Job {
    const uint8_t* s;
    size_t n;
    uint64_t off;
  };
  std::vector<Job> jobs;
  uint64_t done = 0, off = 0;
  for (size_t k = 0; done < total; k = (k + 1) % src.size()) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(src[k].second, total - done));
    if (off + n > ring_bytes) off = 0;
    jobs.push_back({src[k].first, n, off});
    off += n;
    done += n;
  }
  // Pre-faulted: best of three passes (the machine may be shared). Fresh: one pass, since
  // the second would find the pages already mapped.
  double best = 0;
  for (int pass = 0; pass < (fresh ? 1 : 3); ++pass) {
    std::atomic<size_t> next{0};
    double t0 = Now();
    auto run = [&] {
      for (;;) {
        size_t j = next.fetch_add(1);
        if (j >= jobs.size()) return;
        std::memcpy(dst + jobs[j].off, jobs[j].s, jobs[j].n);
      }
    };
    if (threads <= 1) {
      run();
    } else {
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) ts.emplace_back(run);
      for (auto& t : ts) t.join();
    }
    double secs = Now() - t0;
    if (secs > 0) best = std::max(best, static_cast<double>(total) / secs / kGB);
  }
  munmap(p, ring_bytes);
  return best;
}

struct PhaseResult {
  uint64_t bytes = 0;
  uint64_t requests = 0, failures = 0;
  double seconds = 0;
  Stats lat;
  bool have_server = false;
  double server_cpu_s = 0;
  int64_t server_minflt = 0;
};

Json PhaseJson(const PhaseResult& p) {
  Json j = Json::Object();
  j["bytes"] = p.bytes;
  j["requests"] = p.requests;
  j["failures"] = p.failures;
  j["seconds"] = p.seconds;
  j["gbps"] = p.seconds > 0 ? static_cast<double>(p.bytes) / p.seconds / kGB : 0.0;
  j["request_latency"] = StatsJsonUs(p.lat);
  if (p.have_server) {
    j["server_cpu_s"] = p.server_cpu_s;
    j["server_minor_faults"] = p.server_minflt;
  }
  return j;
}

// Runs one STORE or RETRIEVE per (request, rank); each rank's worker runs its requests in
// order on its own socket, ranks run concurrently (as vLLM's TP workers do).
PhaseResult TransferPhase(Registered& reg, int server_pid, bool store,
                          const std::vector<std::string>& token_blobs,
                          const std::vector<std::string>& request_ids, int64_t tokens_per_req,
                          int64_t chunk, double timeout_s) {
  const ModelSpec& m = reg.model;
  const int64_t blocks = tokens_per_req / m.block_size;
  const std::string ids = PackBlockIds(static_cast<int>(m.group_infos.size()), 0, blocks);
  const std::string ev = PackBin("stub_ipc_handle");
  const std::string skip = PackInt(0);
  PhaseResult res;
  std::vector<std::vector<double>> lats(reg.workers.size());
  std::vector<uint64_t> fails(reg.workers.size(), 0);
  std::latch ready(static_cast<ptrdiff_t>(reg.workers.size()));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  // Keys are encoded before the clock starts (the client's own cost is not the server's).
  std::vector<std::vector<std::string>> keys(reg.workers.size());
  for (size_t wi = 0; wi < reg.workers.size(); ++wi) {
    for (size_t r = 0; r < token_blobs.size(); ++r) {
      KeyArgs k;
      k.model = m.name;
      k.world_size = m.world_size;
      k.worker_id = reg.workers[wi]->rank;
      k.tokens_blob = token_blobs[r];
      k.end = tokens_per_req / chunk * chunk;
      k.request_id = request_ids[r];
      keys[wi].push_back(PackKey(k));
    }
  }
  for (size_t wi = 0; wi < reg.workers.size(); ++wi) {
    threads.emplace_back([&, wi] {
      Worker& w = *reg.workers[wi];
      const std::string inst = PackInt(w.instance_id);
      ready.count_down();
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (size_t r = 0; r < token_blobs.size(); ++r) {
        double t0 = Now();
        std::optional<std::string> reply;
        if (store) {
          reply = w.conn->Call(op().store, {keys[wi][r], inst, ids, ev}, timeout_s);
        } else {
          reply = w.conn->Call(op().retrieve, {keys[wi][r], inst, ids, ev, skip}, timeout_s);
        }
        lats[wi].push_back(Now() - t0);
        if (!reply || !HandleOk(*reply)) fails[wi]++;
      }
    });
  }
  ready.wait();
  const ProcCpu cpu0 = ReadProcCpu(server_pid);
  double t0 = Now();
  go.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();
  res.seconds = Now() - t0;
  const ProcCpu cpu1 = ReadProcCpu(server_pid);
  if (cpu0.ok && cpu1.ok) {
    res.have_server = true;
    res.server_cpu_s = cpu1.cpu_s - cpu0.cpu_s;
    res.server_minflt = cpu1.minflt - cpu0.minflt;
  }
  std::vector<double> all;
  for (size_t wi = 0; wi < reg.workers.size(); ++wi) {
    all.insert(all.end(), lats[wi].begin(), lats[wi].end());
    res.failures += fails[wi];
  }
  res.requests = all.size();
  res.lat = Summarize(std::move(all));
  res.bytes = static_cast<uint64_t>(token_blobs.size()) *
              static_cast<uint64_t>(tokens_per_req / chunk) *
              static_cast<uint64_t>(m.ObjectBytes(chunk)) * static_cast<uint64_t>(m.world_size);
  return res;
}

Json RunDataModel(zmq::context_t& ctx, const Options& o, ModelSpec m, int64_t chunk,
                  int chunks_per_req, bool after_other_model) {
  const int64_t tokens_per_req = chunks_per_req * chunk;
  m.num_blocks = tokens_per_req / m.block_size;
  for (auto& t : m.tensors) t.shape[t.block_dim] = m.num_blocks;
  const int64_t obj = m.ObjectBytes(chunk);
  const int64_t chunk_all_ranks = obj * m.world_size;
  int64_t total_chunks = static_cast<int64_t>(o.data_gb * kGiB / static_cast<double>(chunk_all_ranks));
  int64_t num_requests = std::max<int64_t>(1, total_chunks / chunks_per_req);
  Json j = Json::Object();
  j["model"] = m.label;
  j["model_name"] = m.name;
  j["tp"] = m.world_size;
  j["tensors_per_rank"] = static_cast<int64_t>(m.tensors.size());
  j["block_size"] = m.block_size;
  j["chunk_bytes_per_rank"] = obj;
  j["chunks_per_request"] = chunks_per_req;
  j["requests"] = num_requests;
  j["chunks"] = num_requests * chunks_per_req;
  j["client_buffer_bytes"] = m.RankBufferBytes() * m.world_size;
  // A server whose L1 pages were touched by an earlier model (then CLEARed) does not pay
  // first-touch page faults in this model's first pass.
  j["first_pass_after_other_model"] = after_other_model;
  Log("data %s: TP%d, %zu tensors/rank, %.2f MiB per chunk per rank, %" PRId64
      " requests x %d chunks = %.2f GiB per pass",
      m.label.c_str(), m.world_size, m.tensors.size(), static_cast<double>(obj) / kMiB,
      num_requests, chunks_per_req,
      static_cast<double>(num_requests * chunks_per_req * chunk_all_ranks) / kGiB);

  auto reg = RegisterModel(ctx, o.url, m, 120);
  uint64_t expected = 0;
  for (auto& w : reg->workers) expected ^= w->BufferChecksum() * (2 * w->rank + 1);

  // Token ids: fresh for this run so nothing is already cached.
  const int64_t base = static_cast<int64_t>(RunNonce() % 1000000000ull) * 2 + 10000000;
  std::vector<std::string> blobs, rids;
  for (int64_t r = 0; r < num_requests; ++r) {
    blobs.push_back(PackTokens(Tokens(base + r * tokens_per_req + m.world_size * 7, tokens_per_req)));
    rids.push_back("bench-data-" + m.label + "-" + Hex(RunNonce()) + "-" + std::to_string(r));
  }
  Conn sched(ctx, o.url);
  auto end_sessions = [&] {
    for (const auto& rid : rids) sched.Call(op().end_session, {PackString(rid)}, 60);
  };

  // 1) STORE into L1 pages that were never touched (a fresh server).
  auto cold = TransferPhase(*reg, o.server_pid, true, blobs, rids, tokens_per_req, chunk, o.data_timeout);
  Log("data %s: store (first touch of L1) %.2f GiB in %.3f s = %.2f GB/s%s", m.label.c_str(),
      static_cast<double>(cold.bytes) / kGiB, cold.seconds,
      static_cast<double>(cold.bytes) / cold.seconds / kGB, cold.failures ? "  FAILURES" : "");
  end_sessions();
  // 2) CLEAR and STORE again: the steady state of a running server (L1 pages reused).
  //    Best of --data-passes passes (the machine may be shared); every pass is kept.
  auto gbps_of = [](const PhaseResult& p) {
    return p.seconds > 0 ? static_cast<double>(p.bytes) / p.seconds / kGB : 0.0;
  };
  bool cleared = true;
  PhaseResult warm;
  Json warm_passes = Json::Array();
  for (int pass = 0; pass < o.data_passes && cleared; ++pass) {
    cleared = sched.Call(op().clear, {kTrue}, 120).has_value();
    if (!cleared) break;
    auto w = TransferPhase(*reg, o.server_pid, true, blobs, rids, tokens_per_req, chunk,
                           o.data_timeout);
    end_sessions();
    warm_passes.push_back(gbps_of(w));
    Log("data %s: store (L1 pages reused)  %.2f GiB in %.3f s = %.2f GB/s%s", m.label.c_str(),
        static_cast<double>(w.bytes) / kGiB, w.seconds, gbps_of(w),
        w.failures ? "  FAILURES" : "");
    if (pass == 0 || w.failures > 0 || (warm.failures == 0 && gbps_of(w) > gbps_of(warm))) {
      warm = w;
    }
  }
  // 3) The scheduler's LOOKUP (read-locks the hits), then RETRIEVE into zeroed buffers;
  //    every pass is checked byte for byte against the stored data.
  int64_t hits_ok = 0;
  bool verified = true;
  PhaseResult ret;
  Json ret_passes = Json::Array();
  const std::string tp = PackInt(m.world_size);
  for (int pass = 0; pass < std::max(1, o.data_passes); ++pass) {
    int64_t hits = 0;
    for (int64_t r = 0; r < num_requests; ++r) {
      KeyArgs k;
      k.model = m.name;
      k.world_size = m.world_size;
      k.tokens_blob = blobs[r];
      k.end = tokens_per_req;
      k.request_id = rids[r];
      int polls = 0;
      auto h = LookupAndWait(sched, PackKey(k), tp, PackString(rids[r]), 120, &polls);
      if (h && *h == chunks_per_req) hits++;
    }
    hits_ok = pass == 0 ? hits : std::min(hits_ok, hits);
    for (auto& w : reg->workers) {
      for (auto& sg : w->segments) std::memset(sg.data(), 0, sg.size());
    }
    auto rt = TransferPhase(*reg, o.server_pid, false, blobs, rids, tokens_per_req, chunk,
                            o.data_timeout);
    uint64_t got = 0;
    for (auto& w : reg->workers) got ^= w->BufferChecksum() * (2 * w->rank + 1);
    const bool ok = got == expected && rt.failures == 0;
    verified = verified && ok;
    end_sessions();
    ret_passes.push_back(gbps_of(rt));
    Log("data %s: retrieve                   %.2f GiB in %.3f s = %.2f GB/s  (lookups hit %" PRId64
        "/%" PRId64 ", bytes %s)",
        m.label.c_str(), static_cast<double>(rt.bytes) / kGiB, rt.seconds, gbps_of(rt), hits,
        num_requests, ok ? "verified" : "MISMATCH");
    if (pass == 0 || rt.failures > 0 || (ret.failures == 0 && gbps_of(rt) > gbps_of(ret))) {
      ret = rt;
    }
  }

  // memcpy of the same bytes, from the same client buffers.
  std::vector<std::pair<const uint8_t*, size_t>> src;
  const size_t piece = static_cast<size_t>(std::min<int64_t>(obj, 64ll << 20));
  for (auto& w : reg->workers) {
    for (auto& s : w->segments) {
      for (size_t off = 0; off < s.size(); off += piece) {
        src.emplace_back(s.data() + off, std::min(piece, s.size() - off));
      }
    }
  }
  const int mt = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t bytes = cold.bytes;
  double m1 = MemcpyGBps(src, bytes, 1, false);
  double mn = MemcpyGBps(src, bytes, mt, false);
  double m1f = MemcpyGBps(src, std::min<uint64_t>(bytes, uint64_t{2} << 30), 1, true);
  double mnf = MemcpyGBps(src, std::min<uint64_t>(bytes, uint64_t{2} << 30), mt, true);
  Log("data %s: memcpy same bytes: 1 thread %.2f GB/s, %d threads %.2f GB/s; into fresh pages:"
      " 1 thread %.2f GB/s, %d threads %.2f GB/s",
      m.label.c_str(), m1, mt, mn, m1f, mt, mnf);

  j["store_cold"] = PhaseJson(cold);
  j["passes"] = o.data_passes;
  j["store"] = cleared ? PhaseJson(warm) : Json();
  if (cleared) j["store"]["gbps_passes"] = std::move(warm_passes);
  if (!cleared) j["store_note"] = "CLEAR got no reply; steady-state store not measured";
  j["retrieve"] = PhaseJson(ret);
  j["retrieve"]["gbps_passes"] = std::move(ret_passes);
  j["retrieve_verified"] = verified;
  j["lookup_full_hits"] = hits_ok;
  j["memcpy_1t_gbps"] = m1;
  j["memcpy_mt_gbps"] = mn;
  j["memcpy_mt_threads"] = mt;
  j["memcpy_1t_fresh_gbps"] = m1f;
  j["memcpy_mt_fresh_gbps"] = mnf;
  auto gb = [](const PhaseResult& p) {
    return p.seconds > 0 ? static_cast<double>(p.bytes) / p.seconds / kGB : 0.0;
  };
  j["store_vs_memcpy_mt"] = mn > 0 ? gb(cleared ? warm : cold) / mn : 0.0;
  j["store_cold_vs_memcpy_mt_fresh"] = mnf > 0 ? gb(cold) / mnf : 0.0;
  j["retrieve_vs_memcpy_mt"] = mn > 0 ? gb(ret) / mn : 0.0;

  sched.Call(op().clear, {kTrue}, 120);
  UnregisterModel(*reg, 60);
  return j;
}

Json RunData(zmq::context_t& ctx, const Options& o, int64_t chunk) {
  Json out = Json::Object();
  Json models = Json::Array();
  out["data_gib_per_model"] = o.data_gb;
  const int cpr = o.data_chunks_per_request;
  try {
    models.push_back(RunDataModel(ctx, o, LlamaModel(o.quick ? 4 : 32, 0), chunk, cpr, false));
  } catch (const BenchError& e) {
    Log("data llama: %s", e.what());
    Json j = Json::Object();
    j["model"] = "llama8b_tp1";
    j["error"] = e.what();
    models.push_back(j);
  }
  if (o.data_minimax) {
    try {
      models.push_back(RunDataModel(ctx, o, o.quick ? MiniMaxModel(6, 3, 8, 0)
                                                    : MiniMaxModel(60, 3, 8, 0),
                                    chunk, cpr, true));
    } catch (const BenchError& e) {
      Log("data minimax: %s", e.what());
      Json j = Json::Object();
      j["model"] = "minimax_m3_tp8";
      j["error"] = e.what();
      models.push_back(j);
    }
  }
  out["models"] = std::move(models);
  return out;
}

// ---------------------------------------------------------------------------------------
// Scale: RSS per cached entry, lookup latency as the table grows, startup time
// ---------------------------------------------------------------------------------------

Stats TimeLookups(Conn& c, const std::string& model, int64_t n, double seconds,
                  const std::function<std::vector<int64_t>(uint64_t)>& tokens_of, int64_t chunk,
                  int64_t expected, uint64_t* mismatches, uint64_t* errors) {
  std::vector<double> lats;
  const std::string tp = PackInt(1);
  const double until = Now() + seconds;
  for (int64_t i = 0; i < n && Now() < until; ++i) {
    std::vector<int64_t> t = tokens_of(static_cast<uint64_t>(i));
    const std::string blob = PackTokens(t);
    const std::string rid = "bench-scale-lk-" + Hex(RunNonce()) + "-" + std::to_string(i) + "-" +
                            std::to_string(t.size());
    KeyArgs k;
    k.model = model;
    k.tokens_blob = blob;
    k.end = static_cast<int64_t>(t.size()) / chunk * chunk;
    k.request_id = rid;
    const std::string key = PackKey(k), ridf = PackString(rid);
    int polls = 0;
    double t0 = Now();
    auto h = LookupAndWait(c, key, tp, ridf, 60, &polls);
    double t1 = Now();
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

int FreeLoopbackPort() {
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

Json RunScale(zmq::context_t& ctx, const Options& o, int64_t chunk) {
  Json out = Json::Object();
  const int64_t head = 4;  // object = 2 * chunk * 4 * 2 bytes = 4 KiB at chunk 256
  const int64_t cpr = o.scale_chunks_per_request;
  const int64_t tokens_per_req = cpr * chunk;
  ModelSpec m = TinyModel("kvdbench/scale-tiny", head, tokens_per_req / 16);
  const int64_t obj = m.ObjectBytes(chunk);
  out["model"] = m.name;
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
    Worker& w = *reg->workers[0];
    Conn sched(ctx, o.url);
    const std::string inst = PackInt(w.instance_id), ev = PackBin("stub_ipc_handle"),
                      ids = PackBlockIds(1, 0, tokens_per_req / 16);
    // Token space: request r covers [base + r*T, base + (r+1)*T), all < 2^32.
    const int64_t base = 1000 + static_cast<int64_t>(RunNonce() % 16) * 7;
    int64_t entries = 0, requests = 0, failures = 0;
    double fill_time = 0;
    auto store_one = [&]() {
      const std::vector<int64_t> t = Tokens(base + requests * tokens_per_req, tokens_per_req);
      const std::string blob = PackTokens(t);
      const std::string rid = "bench-scale-" + Hex(RunNonce()) + "-" + std::to_string(requests);
      KeyArgs k;
      k.model = m.name;
      k.worker_id = 0;
      k.tokens_blob = blob;
      k.end = tokens_per_req;
      k.request_id = rid;
      const std::string key = PackKey(k), ridf = PackString(rid);
      double t0 = Now();
      auto r = w.conn->Call(op().store, {key, inst, ids, ev}, o.data_timeout);
      // End the session like vLLM does when the request finishes (frees its token list).
      w.conn->Call(op().end_session, {ridf}, o.data_timeout);
      fill_time += Now() - t0;
      requests++;
      if (r && HandleOk(*r)) {
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
        lv["rss_anon_bytes_per_entry"] = anon / n;
        lv["rss_shmem_bytes_per_entry"] = shm / n;
        lv["rss_bytes_per_entry"] = total / n;
        // Growth since the previous level only: insensitive to one-off allocations made
        // while the first entries were stored (pools, arenas, lazily built structures).
        if (prev_mem.ok && entries > prev_entries) {
          lv["metadata_bytes_per_entry_marginal"] =
              static_cast<double>(mem.rss_anon - prev_mem.rss_anon) /
              static_cast<double>(entries - prev_entries);
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
      Stats s1 = TimeLookups(sched, m.name, o.scale_lookups, lk_secs, hit_tokens(1024), chunk,
                             1024 / chunk, &mism, &errs);
      Stats s32 = TimeLookups(sched, m.name, o.scale_lookups, lk_secs, hit_tokens(n32), chunk,
                              n32 / chunk, &mism, &errs);
      Stats sm = TimeLookups(
          sched, m.name, o.scale_lookups, lk_secs,
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
                 " B/entry")
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
// Hashing (in-process)
// ---------------------------------------------------------------------------------------

Json RunHash(const Options& o, int64_t chunk) {
  using kvd::keys::Blake3Impl;
  Json out = Json::Object();
  const Blake3Impl original = kvd::keys::Blake3ActiveImpl();
  out["active_impl"] = kvd::keys::Blake3ImplName(original);
  out["chunk_tokens"] = chunk;
  std::mt19937_64 rng(7);
  std::vector<int64_t> tokens(static_cast<size_t>(o.hash_tokens));
  for (auto& t : tokens) t = static_cast<int64_t>(rng() % 200000);
  std::vector<uint8_t> bulk(1 << 20);
  for (auto& b : bulk) b = static_cast<uint8_t>(rng());
  const double secs = o.quick ? 0.1 : 0.5;
  Json impls = Json::Array();
  for (Blake3Impl impl : {original, Blake3Impl::kPortable, Blake3Impl::kSse41, Blake3Impl::kAvx2}) {
    if (!kvd::keys::Blake3ImplSupported(impl)) continue;
    kvd::keys::SetBlake3ImplForTesting(impl);
    // Chained chunk hashing as the server does it for a request (after one warm-up pass).
    uint64_t reps = 0;
    std::vector<kvd::keys::Hash32> hashes;
    (void)kvd::keys::AppendChainedChunkHashes(tokens, static_cast<uint32_t>(chunk), 0,
                                              kvd::keys::NoneHash(), &hashes);
    const double t0 = Now();
    double t1 = t0;
    do {
      hashes.clear();
      auto st = kvd::keys::AppendChainedChunkHashes(tokens, static_cast<uint32_t>(chunk), 0,
                                                    kvd::keys::NoneHash(), &hashes);
      if (!st.ok()) throw BenchError("hashing failed: " + st.message());
      ++reps;
      t1 = Now();
    } while (t1 - t0 < secs);
    const double chain_s = (t1 - t0) / static_cast<double>(reps);
    const double n_tokens = static_cast<double>(tokens.size() / chunk * chunk);
    const double n_chunks = static_cast<double>(tokens.size() / chunk);
    const double input_bytes = n_tokens * 4 + n_chunks * 32;
    // Plain BLAKE3 of 1 MiB (the per-core ceiling).
    uint64_t breps = 0;
    volatile uint8_t sink = 0;
    const double b0 = Now();
    double b1 = b0;
    do {
      auto h = kvd::keys::Blake3(bulk.data(), bulk.size());
      sink = sink ^ h[0];
      ++breps;
      b1 = Now();
    } while (b1 - b0 < secs);
    Json j = Json::Object();
    j["impl"] = kvd::keys::Blake3ImplName(impl);
    j["active"] = impl == original;
    j["chain_tokens_per_s"] = n_tokens / chain_s;
    j["chain_input_gbps"] = input_bytes / chain_s / kGB;
    j["chain_ns_per_chunk"] = chain_s / n_chunks * 1e9;
    j["bulk_1mib_gbps"] = static_cast<double>(bulk.size()) * static_cast<double>(breps) /
                          (b1 - b0) / kGB;
    Log("hash %-8s chained chunks: %.1f M tokens/s (%.2f GB/s of hash input, %.0f ns/chunk); "
        "bulk 1 MiB: %.2f GB/s",
        kvd::keys::Blake3ImplName(impl), n_tokens / chain_s / 1e6, input_bytes / chain_s / kGB,
        chain_s / n_chunks * 1e9,
        static_cast<double>(bulk.size()) * static_cast<double>(breps) / (b1 - b0) / kGB);
    impls.push_back(std::move(j));
    if (impl == original && o.quick) break;
  }
  kvd::keys::SetBlake3ImplForTesting(original);
  out["tokens"] = o.hash_tokens;
  out["impls"] = std::move(impls);
  return out;
}

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
      if (chunk % 128 != 0) throw BenchError("the models need a chunk size that is a multiple of 128");
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

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
