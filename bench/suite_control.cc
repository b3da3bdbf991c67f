// kvd-bench suite "control": PING, LOOKUP (miss / hit of 1K-32K tokens), END_SESSION and
// the in-driver ZMQ echo (transport floor) at 1, 8 and 64 clients.
#include "suites.h"

#include <netinet/tcp.h>

namespace kvd::bench {
namespace {

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


// The same echo without libzmq on the server side: a thread per connection speaking ZMTP
// 3.0 (NULL mechanism) straight on a blocking TCP socket, i.e. what kvd's request loop
// would cost if it spoke ZMTP itself instead of going through libzmq's I/O thread. Only
// what a DEALER client sends is handled (greeting, READY, message frames); a measuring
// prototype, not a server.
class ZmtpEchoServer {
 public:
  ZmtpEchoServer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(listen_fd_, 128);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~ZmtpEchoServer() {
    stop_.store(true);
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    for (auto& t : conns_) t.join();
    for (int fd : fds_) close(fd);
  }
  std::string url() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

 private:
  // Buffered reads: one read() per burst of frames, as an event loop would do.
  struct Reader {
    int fd;
    std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 16);
    size_t head = 0, tail = 0;
    bool Fill(size_t need) {
      while (tail - head < need) {
        if (head > 0) {
          std::memmove(buf.data(), buf.data() + head, tail - head);
          tail -= head;
          head = 0;
        }
        if (need > buf.size()) buf.resize(need);
        ssize_t r = read(fd, buf.data() + tail, buf.size() - tail);
        if (r <= 0) return false;
        tail += static_cast<size_t>(r);
      }
      return true;
    }
    bool Take(void* out, size_t n) {
      if (!Fill(n)) return false;
      std::memcpy(out, buf.data() + head, n);
      head += n;
      return true;
    }
  };
  static bool WriteAll(int fd, const void* buf, size_t n) {
    const auto* p = static_cast<const uint8_t*>(buf);
    while (n > 0) {
      ssize_t r = write(fd, p, n);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  // One frame: flags (bit 0 more, bit 1 long size, bit 2 command), size, body.
  static bool ReadFrame(Reader& in, uint8_t* flags, std::string* body) {
    if (!in.Take(flags, 1)) return false;
    uint64_t size = 0;
    if (*flags & 2) {
      uint8_t b[8];
      if (!in.Take(b, 8)) return false;
      for (uint8_t x : b) size = (size << 8) | x;
    } else {
      uint8_t b;
      if (!in.Take(&b, 1)) return false;
      size = b;
    }
    if (size > (64u << 20)) return false;
    body->resize(size);
    return size == 0 || in.Take(body->data(), size);
  }
  static void PutFrame(std::string& out, std::string_view body, bool more, bool command = false) {
    out += static_cast<char>((more ? 1 : 0) | (command ? 4 : 0));
    out += static_cast<char>(body.size());  // short frames only (< 256 bytes)
    out += body;
  }
  void Serve(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // Greeting: signature, version 3.0, mechanism "NULL", as-server 0, filler.
    uint8_t greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    uint8_t peer[64];
    Reader in{fd};
    if (!WriteAll(fd, greeting, sizeof(greeting)) || !in.Take(peer, sizeof(peer))) return;
    std::string ready;
    std::string props = std::string("\x05READY") + std::string("\x0bSocket-Type") +
                        std::string("\x00\x00\x00\x06", 4) + "ROUTER";
    PutFrame(ready, props, false, true);
    if (!WriteAll(fd, ready.data(), ready.size())) return;
    std::vector<std::string> msg;
    std::string out, body;
    while (!stop_.load()) {
      uint8_t flags = 0;
      if (!ReadFrame(in, &flags, &body)) return;
      if (flags & 4) continue;  // the peer's READY (or another command)
      msg.push_back(body);
      if (flags & 1) continue;
      if (msg.size() >= 2) {  // [uid, op, payload...] -> [uid, op, true]
        out.clear();
        PutFrame(out, msg[0], true);
        PutFrame(out, msg[1], true);
        PutFrame(out, kTrue, false);
        if (!WriteAll(fd, out.data(), out.size())) return;
      }
      msg.clear();
    }
  }
  void Accept() {
    while (!stop_.load()) {
      int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      conns_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;             // guarded by mu_
  std::vector<std::thread> conns_;   // guarded by mu_
};

}  // namespace

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
  std::unique_ptr<ZmtpEchoServer> zmtp_echo;
  if (o.transport_floor && want("zmtp_echo_floor")) zmtp_echo = std::make_unique<ZmtpEchoServer>();
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
    if (zmtp_echo) {
      // The same frames answered by a thread speaking ZMTP on a plain TCP socket: the floor
      // a server without libzmq's I/O thread would have (the client still uses libzmq).
      Options eo = o;
      eo.url = zmtp_echo->url();
      eo.server_pid = 0;
      ClientOp fn = [&](Conn& conn, int, uint64_t, OpOut*) {
        auto r = conn.Call(op().ping, {kNil}, o.ctl_timeout);
        return r ? OpResult::kOk : OpResult::kError;
      };
      auto r = RunClients(ctx, eo, "zmtp_echo_floor", conc, warm, fn);
      LogCase("control", r);
      Json j = CaseJson(r);
      j["reference"] = "in-driver ZMTP echo on a plain TCP socket (no server-side libzmq I/O thread)";
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

}  // namespace kvd::bench
