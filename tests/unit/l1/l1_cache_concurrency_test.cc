// Concurrency: several threads write, commit, abort, look up, lock, pin, clear and evict on
// a small pool (so eviction runs constantly). Every object holds a byte pattern derived from
// its (key, slot); a reader verifies the whole object right after pinning and again after
// yielding. If a pinned object's memory were ever freed, reused or overwritten, the pattern
// would break. At the end the accounting must balance: nothing leaked, nothing freed twice.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "l1/l1_cache.h"
#include "l1_test_util.h"

namespace kvd::l1 {
namespace {

using testing::CheckPattern;
using testing::FillPattern;
using testing::Key;

constexpr uint64_t kPage = 4096;
constexpr uint32_t kSlots = 2;
constexpr int kKeys = 96;

uint64_t ObjectSize(const ChunkKey& key, uint32_t slot) {
  return (ChunkKeyHash{}(key) + slot) % 3 * kPage + kPage - 100;
}

// Key(i) of the tests lives in namespace 0; this interns it.
void InternTestNamespace(L1Cache& cache) { ASSERT_EQ(testing::Ns(cache, "m", kSlots), 0u); }

struct Shared {
  L1Cache* cache = nullptr;
  FakeClock* clock = nullptr;
  std::vector<ChunkKey> keys;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> corrupt{0};
  std::atomic<uint64_t> pinned_reads{0};
  std::atomic<uint64_t> commits{0};
  std::atomic<uint64_t> hits{0};
};

void Writer(Shared& sh, unsigned seed) {
  std::mt19937 rng(seed);
  while (!sh.stop.load(std::memory_order_relaxed)) {
    const ChunkKey& key = sh.keys[rng() % kKeys];
    const uint32_t slot = rng() % kSlots;
    auto res = sh.cache->ReserveWrite(key, kSlots, slot, ObjectSize(key, slot));
    if (!res.ok()) continue;  // AlreadyExists or ResourceExhausted
    FillPattern(res->data(), res->size(), key, slot);
    if (rng() % 10 == 0) {
      res->Abort();
      continue;
    }
    if (rng() % 4 == 0) std::this_thread::yield();
    if (res->Commit()) sh.commits.fetch_add(1, std::memory_order_relaxed);
  }
}

bool VerifyPinned(Shared& sh, const ChunkKey& key, uint32_t slot, std::mt19937& rng) {
  auto pin = sh.cache->PinForRead(key, slot);
  if (!pin.ok()) return false;
  bool ok = pin->size() == ObjectSize(key, slot) &&
            CheckPattern(pin->data(), pin->size(), key, slot);
  std::this_thread::yield();  // let writers, evictors and Clear run while we hold the pin
  if (rng() % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  ok = ok && CheckPattern(pin->data(), pin->size(), key, slot);
  if (!ok) sh.corrupt.fetch_add(1);
  sh.pinned_reads.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Reader(Shared& sh, unsigned seed) {
  std::mt19937 rng(seed);
  const std::string owner = "reader-" + std::to_string(seed);
  while (!sh.stop.load(std::memory_order_relaxed)) {
    const size_t start = rng() % (kKeys - 4);
    std::span<const ChunkKey> window(sh.keys.data() + start, 4);
    const size_t hits = sh.cache->LookupAndLock(owner, start, window, kSlots, 1);
    sh.hits.fetch_add(hits, std::memory_order_relaxed);
    // Like a retrieve: read every object of every hit, then release the lookup locks.
    for (size_t i = 0; i < hits; ++i) {
      for (uint32_t s = 0; s < kSlots; ++s) VerifyPinned(sh, window[i], s, rng);
    }
    if (rng() % 2 == 0) {
      sh.cache->ReleaseLocks(owner, start, hits, std::nullopt);
    } else if (rng() % 2 == 0) {
      for (uint32_t s = 0; s < kSlots; ++s) sh.cache->ReleaseLocks(owner, start, hits, s);
    }  // else: left to the next lookup of this owner, or the TTL
    // And a random direct pin.
    VerifyPinned(sh, sh.keys[rng() % kKeys], rng() % kSlots, rng);
  }
}

void Chaos(Shared& sh, unsigned seed) {
  std::mt19937 rng(seed);
  while (!sh.stop.load(std::memory_order_relaxed)) {
    switch (rng() % 4) {
      case 0: sh.cache->EvictToWatermark(); break;
      case 1: sh.clock->AdvanceSeconds(0.3); break;  // read locks (TTL 1 s) lapse now and then
      case 2: {
        std::vector<ChunkKey> touch(sh.keys.begin() + rng() % 10, sh.keys.begin() + 20);
        sh.cache->Touch(touch);
        break;
      }
      case 3:
        if (rng() % 50 == 0) sh.cache->Clear();
        (void)sh.cache->stats();
        break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// LRU, and LHD, whose shards share one statistics object (a second lock, taken under the
// shards' locks).
class L1CacheConcurrencyPolicyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(L1CacheConcurrencyPolicyTest, PinnedBytesNeverChangeAndAccountingBalances) {
  // Hundreds of eviction rounds log at info level; keep the test output readable.
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);
  struct RestoreLevel {
    spdlog::level::level_enum level;
    ~RestoreLevel() { spdlog::set_level(level); }
  } restore{level};
  FakeClock clock;
  L1CacheOptions options;
  options.capacity_bytes = 48 * kPage;  // far less than 96 keys x 2 slots x up to 3 pages
  options.read_ttl_seconds = 1;
  options.write_ttl_seconds = 1e6;  // writers here never die
  options.eviction_watermark = 0.7;
  options.eviction_ratio = 0.2;
  options.clock = &clock;
  options.eviction_policy = GetParam();
  auto created = L1Cache::Create(options);
  ASSERT_TRUE(created.ok());
  auto cache = std::move(created).value();
  InternTestNamespace(*cache);

  Shared sh;
  sh.cache = cache.get();
  sh.clock = &clock;
  for (int i = 0; i < kKeys; ++i) sh.keys.push_back(Key(i));

  std::vector<std::thread> threads;
  for (unsigned i = 0; i < 3; ++i) threads.emplace_back(Writer, std::ref(sh), 100 + i);
  for (unsigned i = 0; i < 3; ++i) threads.emplace_back(Reader, std::ref(sh), 200 + i);
  threads.emplace_back(Chaos, std::ref(sh), 300);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  sh.stop = true;
  for (auto& t : threads) t.join();

  EXPECT_EQ(sh.corrupt.load(), 0u);
  EXPECT_GT(sh.commits.load(), 100u);
  EXPECT_GT(sh.pinned_reads.load(), 100u);
  EXPECT_GT(sh.hits.load(), 0u);

  L1Stats st = cache->stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_LE(st.used_bytes, st.capacity_bytes);
  EXPECT_EQ(st.detached_entries, 0u);  // every handle is gone
  EXPECT_EQ(st.pinned_objects, 0u);
  EXPECT_EQ(st.staging_objects, 0u);
  cache->Clear();  // also drops the readers' leftover locks
  st = cache->stats();
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.entries, 0u);
  // The pool is whole again: one object of the full capacity fits.
  auto all = cache->ReserveWrite(Key(1000), 1, 0, options.capacity_bytes);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Policies, L1CacheConcurrencyPolicyTest, ::testing::Values("LRU", "LHD"));

}  // namespace
}  // namespace kvd::l1

namespace kvd::l1 {
namespace {

// Issue 11 finding 9: /status walked the whole table under the L1 mutex (69 ms per 1M
// entries, once a second from the dashboard), stalling every request meanwhile. Status must
// never hold a lock the request path needs for more than a few microseconds.
TEST(L1CacheConcurrencyTest, Finding9StatusNeverStallsTheRequestPath) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a timing test over a million entries; too slow under ThreadSanitizer";
#endif
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);
  struct RestoreLevel {
    spdlog::level::level_enum level;
    ~RestoreLevel() { spdlog::set_level(level); }
  } restore{level};
  constexpr uint64_t kEntries = 1'000'000;
  constexpr uint64_t kObject = 256;
  FakeClock clock;
  L1CacheOptions options;
  options.capacity_bytes = (kEntries + 4096) * kObject;
  options.align = kObject;
  options.clock = &clock;
  auto cache = std::move(L1Cache::Create(options)).value();
  ASSERT_EQ(testing::Ns(*cache), 0u);
  for (uint64_t i = 0; i < kEntries; ++i) {
    auto r = cache->ReserveWrite(Key(i), 1, 0, kObject);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    ASSERT_TRUE(r->Commit());
  }
  ASSERT_EQ(cache->stats().entries, kEntries);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> status_calls{0};
  std::thread status([&] {
    while (!stop.load()) {
      (void)cache->stats();  // what /status, /metrics and the dashboard ask for
      status_calls.fetch_add(1);
    }
  });
  // The request path meanwhile: lookups of stored chunks, each timed.
  std::vector<int64_t> ns;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(600);
  uint64_t i = 0;
  while (std::chrono::steady_clock::now() < until || status_calls.load() < 3) {
    const ChunkKey key = Key(i++ % kEntries);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(cache->LookupAndLock("req", 0, {&key, 1}, 1, 0), 1u);
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - t0).count());
  }
  stop = true;
  status.join();
  std::sort(ns.begin(), ns.end());
  const int64_t p90 = ns[ns.size() * 9 / 10];
  // A walk of a million entries under a lock the lookups need makes most lookups wait for it
  // (tens of milliseconds each); without one, nine in ten take microseconds. The 90th
  // percentile, not the maximum, so that a loaded machine's preemptions do not count.
  EXPECT_LT(p90, 1'000'000) << ns.size() << " lookups, " << status_calls.load()
                            << " status calls; p50 " << ns[ns.size() / 2] << " ns, max "
                            << ns.back() << " ns";
}

}  // namespace
}  // namespace kvd::l1
