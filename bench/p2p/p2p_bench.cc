// kvd-p2p-bench: the P2P data path (src/p2p/ucx_transport.h) between two processes on one
// host: a serving node (a forked child, objects in registered memory) and a reading node that
// reads batches of objects into registered memory, as kvd reads a peer's chunks into its L1.
// Every item names its object (--name-bytes, as an L1 key would) and both nodes share a secret,
// so each ask carries a name and a token, and the serving node checks both.
// Prints one JSON line: GB/s of whole batches, and the round trip of one small item. With
// --redis-port, also the fleet directory's lookup latency (p2p/fleet_directory.h) against a
// redis-server on 127.0.0.1: the time a directory probe adds to a LOOKUP that misses locally.
// bench/p2p/p2p_bench.sh runs it beside ucx_perftest on the same transport (docs/benchmarks.md).
//
//   kvd-p2p-bench [--tls tcp] [--object-bytes 11862016] [--objects 16] [--batch 8] [--seconds 5]
//                 [--name-bytes 128] [--redis-port P]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "p2p/fleet_directory.h"
#include "p2p/ucx_transport.h"

namespace {

using namespace kvd::p2p;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string tls;
  size_t object_bytes = 11862016;  // one MiniMax-M3 chunk of one TP=8 rank (256 tokens)
  size_t objects = 16;
  size_t batch = 8;
  double seconds = 5;
  size_t name_bytes = 128;  // about an lmcache key string with its model path and hash
  int redis_port = 0;
};

constexpr const char* kSecret = "kvd-p2p-bench shared secret";

// The name of object `i`: "kvd-p2p-bench@<i>@" padded with '#', or cut, to exactly `bytes`.
std::string NameOf(size_t i, size_t bytes) {
  std::string name = "kvd-p2p-bench@" + std::to_string(i) + "@";
  name.resize(bytes, '#');
  return name;
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "kvd-p2p-bench: %s\nusage: kvd-p2p-bench [--tls T] [--object-bytes N] "
                       "[--objects N] [--batch N] [--seconds S] [--name-bytes N] [--redis-port P]\n", why);
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) Usage(("missing value of " + flag).c_str());
    std::string v = argv[++i];
    if (flag == "--tls") a.tls = v;
    else if (flag == "--object-bytes") a.object_bytes = std::stoull(v);
    else if (flag == "--objects") a.objects = std::stoull(v);
    else if (flag == "--batch") a.batch = std::stoull(v);
    else if (flag == "--seconds") a.seconds = std::stod(v);
    else if (flag == "--name-bytes") a.name_bytes = std::stoull(v);
    else if (flag == "--redis-port") a.redis_port = std::stoi(v);
    else Usage(("unknown flag " + flag).c_str());
  }
  if (a.object_bytes == 0 || a.objects == 0 || a.batch == 0 || a.batch > UcxPeer::kMaxItems) {
    Usage("sizes must be positive (batch at most 4096)");
  }
  if (a.name_bytes > UcxPeer::kMaxNameBytes) Usage("names are at most 1024 bytes");
  return a;
}

// The child: serves `objects` objects until killed; writes its port to `port_fd`.
[[noreturn]] void Serve(const Args& a, int port_fd) {
  std::vector<uint8_t> memory(a.objects * a.object_bytes);
  for (size_t i = 0; i < memory.size(); i += 4096) memory[i] = static_cast<uint8_t>(i >> 12);
  std::vector<std::string> names;
  for (size_t i = 0; i < a.objects; ++i) names.push_back(NameOf(i, a.name_bytes));
  auto serve = [&](uint64_t, const ServeAsk& ask) -> kvd::Result<ServedBytes> {
    if (ask.object >= a.objects || ask.name != names[ask.object] || ask.offset > a.object_bytes ||
        ask.length > a.object_bytes - ask.offset) {
      return kvd::Status::NotFound("no such object");
    }
    return ServedBytes{memory.data() + ask.object * a.object_bytes + ask.offset, ask.length, nullptr};
  };
  auto node = UcxNode::Create({.listen_host = "127.0.0.1", .tls = a.tls, .serve = serve, .secret = kSecret});
  if (!node.ok()) {
    std::fprintf(stderr, "serving node: %s\n", node.status().ToString().c_str());
    _exit(1);
  }
  auto region = (*node)->Register(memory.data(), memory.size());
  if (!region.ok()) _exit(1);
  int port = (*node)->listen_port();
  if (write(port_fd, &port, sizeof(port)) != sizeof(port)) _exit(1);
  for (;;) (*node)->ProgressFor(std::chrono::milliseconds(100));
}

// The directory's Lookup of `n` keys that another node published, `rounds` times: p50 in µs.
double DirectoryLookupP50(int port, size_t n, int rounds) {
  FleetDirectory::Options o;
  o.endpoint = {"127.0.0.1", port};
  auto a = FleetDirectory::Connect(o, {"bench-a", 1, "127.0.0.1:1"});
  auto b = FleetDirectory::Connect(o, {"bench-b", 1, "127.0.0.1:2"});
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "directory: %s\n", (a.ok() ? b.status() : a.status()).ToString().c_str());
    return -1;
  }
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(std::string(24, 'k') + std::to_string(1000000 + i));
  if (!(*a)->Heartbeat().ok() || !(*a)->Publish(keys).ok()) return -1;
  std::vector<double> us;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    auto owners = (*b)->Lookup(keys);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!owners.ok() || owners->size() != n || (*owners)[n - 1].empty()) return -1;
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t child = fork();
  if (child == 0) Serve(a, fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) {
    std::fprintf(stderr, "kvd-p2p-bench: the serving node did not start\n");
    return 1;
  }
  int rc = 0;
  {
    auto node = UcxNode::Create({.listen_host = "", .tls = a.tls, .serve = nullptr, .secret = kSecret});
    if (!node.ok()) {
      std::fprintf(stderr, "reading node: %s\n", node.status().ToString().c_str());
      kill(child, SIGKILL);
      return 1;
    }
    std::vector<uint8_t> local(a.batch * a.object_bytes);
    auto region = (*node)->Register(local.data(), local.size());
    auto peer = (*node)->Connect("127.0.0.1", port);
    if (!region.ok() || !peer.ok()) {
      kill(child, SIGKILL);
      return 1;
    }
    auto deadline = [] { return Clock::now() + std::chrono::seconds(30); };
    std::vector<ReadItem> items(a.batch);
    size_t next = 0;
    auto fill = [&] {
      for (size_t i = 0; i < a.batch; ++i) {
        size_t object = (next++) % a.objects;
        items[i] = {object, 0, a.object_bytes, local.data() + i * a.object_bytes, NameOf(object, a.name_bytes)};
      }
    };
    // Warm up (connection, registration caches), then measure whole batches.
    fill();
    ReadAnswer warm = (*peer)->Read(items, deadline());
    if (!warm.first_error.ok()) {
      std::fprintf(stderr, "read: %s\n", warm.first_error.ToString().c_str());
      rc = 1;
    }
    size_t batches = 0;
    auto start = Clock::now();
    while (rc == 0 && Clock::now() - start < std::chrono::duration<double>(a.seconds)) {
      fill();
      ReadAnswer r = (*peer)->Read(items, deadline());
      if (r.completed_prefix != items.size()) {
        std::fprintf(stderr, "read: %s\n", r.first_error.ToString().c_str());
        rc = 1;
      }
      ++batches;
    }
    double took = std::chrono::duration<double>(Clock::now() - start).count();
    // One 4 KiB item, many times: the round trip a lookup's probe of a peer costs at least.
    ReadItem small[] = {{0, 0, 4096, local.data(), NameOf(0, a.name_bytes)}};
    const int kSmall = 2000;
    auto small_start = Clock::now();
    for (int i = 0; i < kSmall && rc == 0; ++i) {
      if ((*peer)->Read(small, deadline()).completed_prefix != 1) rc = 1;
    }
    double small_us = std::chrono::duration<double, std::micro>(Clock::now() - small_start).count() / kSmall;
    std::string directory;
    if (a.redis_port > 0) {
      double one = DirectoryLookupP50(a.redis_port, 1, 500);
      double many = DirectoryLookupP50(a.redis_port, 128, 500);
      if (one < 0 || many < 0) rc = 1;
      char buf[160];
      std::snprintf(buf, sizeof(buf), ", \"directory_lookup_1_us\": %.1f, \"directory_lookup_128_us\": %.1f",
                    one, many);
      directory = buf;
    }
    std::printf("{\"tls\": \"%s\", \"object_bytes\": %zu, \"batch\": %zu, \"batches\": %zu, "
                "\"name_bytes\": %zu, \"gb_per_s\": %.3f, \"small_read_us\": %.1f%s}\n",
                a.tls.empty() ? "ucx-choice" : a.tls.c_str(), a.object_bytes, a.batch, batches, a.name_bytes,
                batches * a.batch * static_cast<double>(a.object_bytes) / took / 1e9, small_us,
                directory.c_str());
    peer->reset();
    region->reset();
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return rc;
}
