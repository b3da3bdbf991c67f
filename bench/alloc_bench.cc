// kvd-alloc-bench: heap allocations per request of the short operations, counted.
//
// Runs kvd's real request loop (KvService + ZmqServer on a loopback port) in this process
// and a DEALER client on its own thread, and counts every malloc/calloc/realloc/aligned
// allocation (C and C++: operator new goes through malloc) per thread: this binary
// interposes the allocator entry points and forwards them to glibc's. For each of PING,
// QUERY_PREFETCH_STATUS and END_SESSION it runs a warm-up, then N requests, and reports the
// allocations of the loop's thread (the request path: decoding, the handler, the reply)
// and of the rest of the process except the client thread (libzmq's I/O threads) per
// request. With --check it exits 1 unless the loop's thread allocated nothing per request
// in steady state (the claim of issue 13: none for PING / QUERY / END_SESSION).
//
//   build/kvd-alloc-bench [--requests N] [--check] [--json FILE]
//
// LOOKUP (which allocates: the token buffer, the session, its hashes) creates the sessions
// QUERY and END_SESSION then use; it is reported too, for reference. Single process; the
// L1 pool is a shared-memory segment named kvd_alloc_bench_<pid>, removed at exit.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/clock.h"
#include "server/kv_service.h"
#include "server/metrics.h"
#include "server/zmq_server.h"
#include "wire/ops.h"
#include "wire/request_encoder.h"

// ---- allocation counting (interposed allocator entry points) -------------------------

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
thread_local uint64_t t_allocs = 0;      // this thread's allocations
std::atomic<uint64_t> g_allocs{0};       // every thread's
inline void Count() {
  ++t_allocs;
  g_allocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

extern "C" {
void* malloc(size_t n) {
  Count();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  Count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  Count();
  return __libc_realloc(p, n);
}
void free(void* p) { __libc_free(p); }
void* memalign(size_t align, size_t n) {
  Count();
  return __libc_memalign(align, n);
}
void* aligned_alloc(size_t align, size_t n) {
  Count();
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  Count();
  void* p = __libc_memalign(align, n);
  if (!p) return 12;  // ENOMEM
  *out = p;
  return 0;
}
void* valloc(size_t n) {
  Count();
  return __libc_memalign(static_cast<size_t>(sysconf(_SC_PAGESIZE)), n);
}
}

namespace {

using namespace kvd;

// Counters of the request loop's thread, readable from the main thread (the loop thread
// publishes the address of its thread-local counter).
std::atomic<const uint64_t*> g_loop_allocs{nullptr};

struct Client {
  zmq::socket_t sock;
  uint64_t uid = 0;
  Client(zmq::context_t& ctx, const std::string& url) : sock(ctx, zmq::socket_type::dealer) {
    sock.set(zmq::sockopt::linger, 0);
    sock.connect(url);
  }
  // One round trip; returns the reply frame.
  std::string Call(int op, const std::vector<std::string>& payloads) {
    const std::string u = wire::EncodeRequestInt(static_cast<int64_t>(++uid));
    const std::string o = wire::EncodeRequestInt(op);
    sock.send(zmq::buffer(u), zmq::send_flags::sndmore);
    sock.send(zmq::buffer(o), payloads.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < payloads.size(); ++i) {
      sock.send(zmq::buffer(payloads[i]),
                i + 1 < payloads.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    std::vector<zmq::message_t> reply;
    (void)zmq::recv_multipart(sock, std::back_inserter(reply));
    return reply.empty() ? std::string() : reply.back().to_string();
  }
};

int OpId(const char* name) { return wire::FindOpByName(name)->legacy_id; }

struct OpAllocs {
  std::string op;
  uint64_t requests = 0;
  double loop_allocs_per_request = 0;
  double io_allocs_per_request = 0;  // the rest of the process, client thread excluded
};

}  // namespace

int main(int argc, char** argv) {
  int requests = 20000;
  bool check = false;
  std::string json_path;
  CLI::App app{"kvd-alloc-bench: heap allocations per PING / QUERY / END_SESSION on kvd's request loop"};
  app.add_option("--requests", requests, "Requests per operation (after a warm-up of 2,000)")
      ->capture_default_str();
  app.add_flag("--check", check, "Exit 1 unless the loop's thread allocates nothing per request");
  app.add_option("--json", json_path, "Write the results as JSON");
  CLI11_PARSE(app, argc, argv);

  server::ServerConfig cfg;
  cfg.host = "127.0.0.1";
  cfg.port = 0;
  {  // a free loopback port
    zmq::context_t probe_ctx(1);
    zmq::socket_t probe(probe_ctx, zmq::socket_type::router);
    probe.bind("tcp://127.0.0.1:*");
    const std::string ep = probe.get(zmq::sockopt::last_endpoint);
    cfg.port = std::stoi(ep.substr(ep.rfind(':') + 1));
  }
  cfg.l1_size_gb = 0.0625;
  cfg.eviction_policy = "LRU";
  cfg.shm_name = "kvd_alloc_bench_" + std::to_string(getpid());
  SteadyClock clock;
  auto svc = server::KvService::Create(cfg, &clock);
  if (!svc.ok()) {
    std::fprintf(stderr, "kvd-alloc-bench: %s\n", svc.status().ToString().c_str());
    return 2;
  }
  // One registered CPU worker of the model the lookups name, so that LOOKUP hashes its
  // tokens into the session and END_SESSION refreshes those chunks in L1.
  constexpr int64_t kBlocks = 64, kBlock = 16, kHead = 64;
  const std::string seg = "/kvd_alloc_bench_kv_" + std::to_string(getpid());
  const uint64_t seg_bytes = 2 * kBlocks * kBlock * kHead * 2;
  {
    int fd = shm_open(seg.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(seg_bytes)) != 0) {
      std::fprintf(stderr, "kvd-alloc-bench: cannot create %s\n", seg.c_str());
      return 2;
    }
    close(fd);
  }
  struct Unlink {
    std::string name;
    ~Unlink() { shm_unlink(name.c_str()); }
  } unlink_seg{seg};
  {
    wire::RegisterKvCacheRequest r;
    r.instance_id = 1;
    r.model_name = "alloc-bench-model";
    r.world_size = 1;
    r.engine_type = "vllm";
    r.layout_hints.kv_layout = "NHD";
    wire::TensorDescriptor t;
    t.dtype = "bfloat16";
    t.shape = {2, kBlocks, kBlock, 1, kHead};
    t.stride = {kBlocks * kBlock * kHead, kBlock * kHead, kHead, kHead, 1};
    t.shm_name = seg;
    t.nbytes = seg_bytes;
    t.device_uuid = "cpu";
    r.tensors.push_back(t);
    if (Status st = (*svc)->RegisterKvCache(r); !st.ok()) {
      std::fprintf(stderr, "kvd-alloc-bench: register: %s\n", st.ToString().c_str());
      return 2;
    }
  }
  server::RequestMetrics metrics;
  server::ZmqServer srv(cfg, svc->get(), &metrics);
  if (Status st = srv.Bind(); !st.ok()) {
    std::fprintf(stderr, "kvd-alloc-bench: %s\n", st.ToString().c_str());
    return 2;
  }
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    g_loop_allocs.store(&t_allocs);
    srv.Run(stop);
  });
  while (!g_loop_allocs.load()) std::this_thread::yield();

  zmq::context_t ctx(1);
  Client c(ctx, cfg.ZmqEndpoint());
  const std::string nil(1, '\xc0');
  std::vector<OpAllocs> results;
  auto measure = [&](const char* op_name, int n, auto&& one) {
    for (int i = 0; i < 2000; ++i) one(i);  // warm-up: buffers reach their steady size
    const uint64_t loop0 = *g_loop_allocs.load();
    const uint64_t all0 = g_allocs.load();
    const uint64_t client0 = t_allocs;
    for (int i = 0; i < n; ++i) one(2000 + i);
    const uint64_t loop = *g_loop_allocs.load() - loop0;
    const uint64_t client = t_allocs - client0;
    const uint64_t all = g_allocs.load() - all0;
    OpAllocs r;
    r.op = op_name;
    r.requests = static_cast<uint64_t>(n);
    r.loop_allocs_per_request = static_cast<double>(loop) / n;
    r.io_allocs_per_request = static_cast<double>(all - loop - client) / n;
    results.push_back(r);
    std::printf("[kvd-alloc-bench] %-22s %7d requests: %8.3f allocations/request on the loop's "
                "thread, %8.3f elsewhere in the server (libzmq)\n",
                op_name, n, r.loop_allocs_per_request, r.io_allocs_per_request);
  };

  const int ping = OpId("ping"), query = OpId("query_prefetch_status"), end = OpId("end_session"),
            lookup = OpId("lookup");
  measure("ping", requests, [&](int) { (void)c.Call(ping, {nil}); });
  measure("ping (instance id)", requests, [&](int) { (void)c.Call(ping, {wire::EncodeRequestInt(42)}); });

  // Sessions with a pending lookup result, for QUERY (taken once) and END_SESSION.
  std::vector<int64_t> toks(1024);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int64_t>(1000 + i);
  const std::string token_array = wire::EncodeTokenArray(toks);
  const int sessions = 2000 + requests;
  std::vector<std::string> ids;
  ids.reserve(static_cast<size_t>(sessions));
  for (int i = 0; i < sessions; ++i) ids.push_back(wire::EncodeRequestStr("alloc-bench-request-" + std::to_string(i)));
  auto lookup_frame = [&](int i) {
    wire::CacheKey k;
    k.model_name = "alloc-bench-model";
    k.world_size = 1;
    k.end = 1024;
    k.request_id = "alloc-bench-request-" + std::to_string(i);
    k.num_kv_readers = 1;
    return wire::EncodeCacheKey(k, token_array);
  };
  const std::string tp = wire::EncodeRequestInt(1);
  measure("lookup (1K tokens)", requests, [&](int i) { (void)c.Call(lookup, {lookup_frame(i), tp}); });
  measure("query_prefetch_status", requests, [&](int i) { (void)c.Call(query, {ids[static_cast<size_t>(i)]}); });
  measure("query (no session)", requests, [&](int) { (void)c.Call(query, {wire::EncodeRequestStr("no-such-request-id-0123456789")}); });
  measure("end_session", requests, [&](int i) { (void)c.Call(end, {ids[static_cast<size_t>(i)]}); });
  measure("end_session (no session)", requests, [&](int) { (void)c.Call(end, {wire::EncodeRequestStr("no-such-request-id-0123456789")}); });

  stop = true;
  loop.join();

  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << "{\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      f << "    {\"op\": \"" << r.op << "\", \"requests\": " << r.requests
        << ", \"loop_thread_allocs_per_request\": " << r.loop_allocs_per_request
        << ", \"other_server_allocs_per_request\": " << r.io_allocs_per_request << "}"
        << (i + 1 < results.size() ? ",\n" : "\n");
    }
    f << "  ]\n}\n";
  }
  int rc = 0;
  if (check) {
    for (const auto& r : results) {
      const bool must_be_free = r.op.rfind("lookup", 0) != 0;
      if (must_be_free && r.loop_allocs_per_request > 0) {
        std::fprintf(stderr, "kvd-alloc-bench: %s allocates %.3f times per request on the loop's thread\n",
                     r.op.c_str(), r.loop_allocs_per_request);
        rc = 1;
      }
    }
  }
  return rc;
}
