// Concurrency smoke test for the blend matcher (blend/matcher.h): one thread registers, two
// probe and one removes, as the server's registration thread, lookup threads and eviction
// callbacks will; run under ThreadSanitizer by the TSan build (suite MatcherConcurrency).
// Afterwards the matcher must answer exactly for what was registered and not removed.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "blend/matcher.h"
#include "blend/poly_hash.h"
#include "matcher_test_util.h"

namespace kvd::blend {
namespace {

using testing::KeyN;
using testing::MakeMatcher;
using testing::ProbeAll;
using testing::RandomTokens;

TEST(MatcherConcurrency, RegisterProbeRemoveSmoke) {
  for (bool parity : {false, true}) {
    MatcherOptions o;
    o.lmcache_parity = parity;
    auto m = MakeMatcher(o);
    constexpr int kWindows = 400;
    std::mt19937_64 rng(42);
    std::vector<uint32_t> text = RandomTokens(rng, 256 * kWindows);
    // No two windows share a table slot (parity mode keeps one fingerprint per slot).
    std::vector<bool> used(kMatcherTableSlots);
    for (int j = 0; j < kWindows; ++j) {
      const std::span<uint32_t> w(text.data() + 256 * j, 256);
      uint64_t slot;
      while (used[slot = PolyHashWindow(std::span<const uint32_t>(w)) & (kMatcherTableSlots - 1)]) {
        w[255] = (w[255] + 1) % 50000;
      }
      used[slot] = true;
    }
    const std::span<const uint32_t> all(text);
    std::atomic<int> registered{0};
    std::atomic<bool> done{false};
    std::atomic<uint64_t> probes{0};

    std::thread writer([&] {
      for (int i = 0; i < kWindows; i += 4) {
        std::vector<WindowToRegister> batch;
        for (int j = i; j < i + 4; ++j) batch.push_back({all.subspan(256 * j, 256), 256 * j, KeyN(j), Origin::kOriginal});
        ASSERT_TRUE(m->Register(0, batch).ok());
        registered.store(i + 4, std::memory_order_release);
      }
    });
    std::thread remover([&] {
      // Removes every third window once it has been registered.
      for (int i = 0; i < kWindows; i += 3) {
        while (registered.load(std::memory_order_acquire) <= i) std::this_thread::yield();
        EXPECT_TRUE(m->Remove(0, KeyN(i)));
      }
    });
    std::vector<std::thread> readers;
    for (int r = 0; r < 2; ++r) {
      readers.emplace_back([&, r] {
        std::mt19937_64 local(r);
        while (!done.load(std::memory_order_acquire)) {
          const size_t start = local() % (text.size() - 4096);
          std::vector<MatchCandidate> out;
          ASSERT_TRUE(m->Probe(0, all.subspan(start, 4096), 0, &out).ok());
          for (const MatchCandidate& c : out) {
            // Whatever is reported is a true match.
            ASSERT_EQ(c.old_st - static_cast<int64_t>(start), c.cur_st);
          }
          probes.fetch_add(1, std::memory_order_relaxed);
        }
      });
    }
    writer.join();
    remover.join();
    while (probes.load() < 20) std::this_thread::yield();
    done.store(true, std::memory_order_release);
    for (auto& t : readers) t.join();

    const auto got = ProbeAll(*m, 0, all);
    std::vector<int64_t> starts;
    for (const auto& c : got) starts.push_back(c.cur_st);
    std::vector<int64_t> want;
    for (int i = 0; i < kWindows; ++i) {
      if (i % 3 != 0) want.push_back(256 * i);
    }
    EXPECT_EQ(starts, want) << (parity ? "parity" : "default");
  }
}

}  // namespace
}  // namespace kvd::blend
