// kvd-tier-bench: throughput of kvd's tiers against the raw speed of the same back-end, in
// one process run. Prints one JSON object per measurement.
//
//   kvd-tier-bench --dir DIR [--redis HOST:PORT] [--object-mib 11.06] [--objects N]
//                  [--workers W]
//
// dir:   raw sequential write / read of N files of the object size (one thread, write()
//        then close, read() into one buffer), then kvd's fs tier storing and loading the same
//        number of objects with W workers, as store-behind and prefetch do.
// redis: kvd's resp tier SET / GET of N objects with W workers (redis-benchmark and
//        lmcache's adapters are measured by bench/tiers/run_tier_bench.py in the same run).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "l2/fs_tier.h"
#include "l2/resp_tier.h"

namespace {

using Clock = std::chrono::steady_clock;
double Secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void Report(const char* what, uint64_t bytes, double s) {
  std::printf("{\"what\": \"%s\", \"bytes\": %llu, \"seconds\": %.6f, \"gb_per_s\": %.4f}\n", what,
              static_cast<unsigned long long>(bytes), s, static_cast<double>(bytes) / s / 1e9);
  std::fflush(stdout);
}

kvd::l2::ObjectKey Key(int i) {
  kvd::l2::ObjectKey k;
  k.model_name = "bench/model";
  k.kv_rank = kvd::l2::KvRank(8, static_cast<uint32_t>(i % 8));
  for (int b = 0; b < 32; ++b) k.chunk_hash[b] = static_cast<uint8_t>(b * 13);
  std::memcpy(k.chunk_hash.data(), &i, sizeof i);
  return k;
}

std::vector<kvd::l2::ItemResult> Wait(std::function<void(kvd::l2::Tier::Done)> call) {
  std::promise<std::vector<kvd::l2::ItemResult>> p;
  auto f = p.get_future();
  call([&p](std::vector<kvd::l2::ItemResult> r) { p.set_value(std::move(r)); });
  return f.get();
}

void TierRun(kvd::l2::Tier& tier, const char* name, const std::vector<uint8_t*>& bufs, uint64_t size,
             std::vector<uint8_t*>& outs) {
  const int n = static_cast<int>(bufs.size());
  std::vector<kvd::l2::StoreItem> items;
  for (int i = 0; i < n; ++i) items.push_back({Key(i), bufs[i], size});
  auto t0 = Clock::now();
  auto r = Wait([&](kvd::l2::Tier::Done d) { tier.Store(items, d); });
  auto t1 = Clock::now();
  int ok = 0;
  for (auto& x : r) ok += x.status.ok() && x.bytes == size;
  if (ok != n) std::fprintf(stderr, "%s store: %d of %d ok (%s)\n", name, ok, n, r[0].status.ToString().c_str());
  Report((std::string(name) + "_store").c_str(), size * n, Secs(t0, t1));
  std::vector<kvd::l2::LoadItem> loads;
  for (int i = 0; i < n; ++i) loads.push_back({Key(i), outs[i], size, false});
  t0 = Clock::now();
  auto l = Wait([&](kvd::l2::Tier::Done d) { tier.Load(loads, d); });
  t1 = Clock::now();
  ok = 0;
  for (int i = 0; i < n; ++i) ok += l[i].status.ok() && std::memcmp(outs[i], bufs[i], size) == 0;
  if (ok != n) std::fprintf(stderr, "%s load: %d of %d byte-exact\n", name, ok, n);
  Report((std::string(name) + "_load").c_str(), size * n, Secs(t0, t1));
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, redis;
  double object_mib = 11599872.0 / (1 << 20);  // MiniMax-M3 TP=8, one rank's chunk
  int n = 64, workers = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    else if (a == "--redis") redis = argv[i + 1];
    else if (a == "--object-mib") object_mib = std::stod(argv[i + 1]);
    else if (a == "--objects") n = std::stoi(argv[i + 1]);
    else if (a == "--workers") workers = std::stoi(argv[i + 1]);
  }
  const uint64_t size = static_cast<uint64_t>(object_mib * (1 << 20)) / 4096 * 4096;
  std::vector<uint8_t*> bufs, outs;
  std::mt19937_64 gen(1);
  for (int i = 0; i < n; ++i) {
    bufs.push_back(static_cast<uint8_t*>(std::aligned_alloc(4096, size)));
    outs.push_back(static_cast<uint8_t*>(std::aligned_alloc(4096, size)));
    for (uint64_t j = 0; j < size; j += 8) {
      uint64_t v = gen();
      std::memcpy(bufs[i] + j, &v, 8);
    }
    std::memset(outs[i], 0, size);
  }
  if (!dir.empty()) {
    // Raw sequential speed of the directory.
    const std::string raw = dir + "/raw";
    std::filesystem::create_directories(raw);
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      std::string p = raw + "/f" + std::to_string(i);
      int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (uint64_t off = 0; off < size;) off += static_cast<uint64_t>(::write(fd, bufs[i] + off, size - off));
      ::close(fd);
    }
    auto t1 = Clock::now();
    Report("raw_sequential_write", size * n, Secs(t0, t1));
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      std::string p = raw + "/f" + std::to_string(i);
      int fd = ::open(p.c_str(), O_RDONLY);
      for (uint64_t off = 0; off < size;) off += static_cast<uint64_t>(::read(fd, outs[i] + off, size - off));
      ::close(fd);
    }
    t1 = Clock::now();
    Report("raw_sequential_read", size * n, Secs(t0, t1));
    std::filesystem::remove_all(raw);
    for (auto* o : outs) std::memset(o, 0, size);
    kvd::l2::FsTierOptions o;
    o.type = "fs_native";
    o.base_path = dir + "/kvd";
    o.num_workers = workers;
    auto tier = kvd::l2::FsTier::Create(o);
    if (!tier.ok()) {
      std::fprintf(stderr, "%s\n", tier.status().ToString().c_str());
      return 1;
    }
    TierRun(**tier, "kvd_fs", bufs, size, outs);
    (*tier)->Close();
    std::filesystem::remove_all(dir + "/kvd");
  }
  if (!redis.empty()) {
    for (auto* o : outs) std::memset(o, 0, size);
    kvd::l2::RespTierOptions o;
    const size_t colon = redis.rfind(':');
    o.seeds = {{redis.substr(0, colon), std::stoi(redis.substr(colon + 1))}};
    o.num_workers = workers;
    auto tier = kvd::l2::RespTier::Create(o);
    if (!tier.ok()) return 1;
    TierRun(**tier, "kvd_resp", bufs, size, outs);
    (*tier)->Close();
  }
  for (auto* b : bufs) std::free(b);
  for (auto* b : outs) std::free(b);
  return 0;
}
