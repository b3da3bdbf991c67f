// kvd-blend-bench matcher: the blend matcher's probe rate (blend/matcher.h), token positions
// per second on one core, for prompts of 4K and 32K tokens against a matcher holding 100k
// fingerprints, next to the rolling hash alone over the same tokens (the floor: what the probe
// cannot beat). The prompts are random text with a few registered windows pasted in: some
// hits, mostly misses, as a lookup sees them. Both modes are measured: the default (occupancy
// bitmap, slot chain, digest-confirmed hits) and lmcache parity.
//
//   kvd-blend-bench matcher [--fingerprints 100000] [--hits 4] [--seconds 0.5] [--prompts 4096,32768]
//
// --hits is the number of registered windows pasted into each 4K tokens of prompt; --seconds
// is the time spent on each measurement. Single-threaded; prints one markdown table.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "blend/matcher.h"
#include "blend/poly_hash.h"
#include "suites.h"

namespace kvd::bench::blend {
namespace {

using kvd::blend::Matcher;
using kvd::blend::MatcherOptions;
using kvd::blend::MatchCandidate;
using kvd::blend::Origin;
using kvd::blend::StorageKey;
using kvd::blend::WindowToRegister;

struct Flags {
  uint32_t fingerprints = 100000;
  uint32_t hits_per_4k = 4;
  double seconds = 0.5;
  std::vector<size_t> prompts = {4096, 32768};
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") return false;
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--fingerprints") {
      f->fingerprints = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (a == "--hits") {
      f->hits_per_4k = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (a == "--seconds") {
      f->seconds = std::strtod(v, nullptr);
    } else if (a == "--prompts") {
      f->prompts.clear();
      for (const char* p = v; *p != '\0';) {
        char* end = nullptr;
        f->prompts.push_back(std::strtoull(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p != '\0') return false;
      }
    } else {
      return false;
    }
  }
  return f->fingerprints >= 1 && f->fingerprints <= kvd::blend::kMatcherMaxIds && f->seconds > 0 &&
         !f->prompts.empty() && f->prompts.front() >= 256;
}

std::vector<uint32_t> RandomTokens(std::mt19937_64& rng, size_t n) {
  std::uniform_int_distribution<uint32_t> dist(0, 49999);
  std::vector<uint32_t> out(n);
  for (uint32_t& t : out) t = dist(rng);
  return out;
}

StorageKey KeyN(uint64_t i) {
  std::array<uint8_t, 32> b{};
  std::memcpy(b.data(), &i, sizeof(i));
  return StorageKey::FromHash32(b);
}

// Runs fn() until `seconds` have passed; returns calls per second.
template <typename Fn>
double Rate(double seconds, Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up
  uint64_t calls = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 8; ++i) fn();
    calls += 8;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  return calls / elapsed;
}

}  // namespace

int RunMatcherSuite(int argc, char** argv) {
  Flags flags;
  if (argc > 0 && !ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: kvd-blend-bench matcher [--fingerprints N] [--hits H] [--seconds S] "
                 "[--prompts 4096,32768]\n");
    return 2;
  }
  std::mt19937_64 rng(7);
  // Fingerprints: overlapping windows of one random text, every 3 tokens (distinct content).
  const std::vector<uint32_t> stored = RandomTokens(rng, size_t{flags.fingerprints} * 3 + 256);
  const std::span<const uint32_t> ss(stored);
  std::unique_ptr<Matcher> matchers[2];
  for (int parity = 0; parity < 2; ++parity) {
    MatcherOptions o;
    o.lmcache_parity = parity == 1;
    auto m = Matcher::Create(o);
    if (!m.ok()) return 1;
    std::vector<WindowToRegister> batch;
    for (uint32_t i = 0; i < flags.fingerprints; ++i) {
      batch.push_back({ss.subspan(size_t{i} * 3, 256), int64_t{i} * 3, KeyN(i), Origin::kOriginal});
    }
    auto r = (*m)->Register(0, batch);
    if (!r.ok()) return 1;
    matchers[parity] = std::move(*m);
  }

  std::printf("\nBlend matcher probe rate, one core: %u fingerprints, %u registered windows per 4K "
              "tokens of prompt (M token positions/s; ratio = probe / rolling hash alone)\n\n",
              flags.fingerprints, flags.hits_per_4k);
  std::printf("| prompt tokens | hits | rolling hash alone | probe (default) | ratio | probe (parity) | ratio |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t n : flags.prompts) {
    std::vector<uint32_t> prompt = RandomTokens(rng, n);
    const size_t hits = std::max<size_t>(1, flags.hits_per_4k * n / 4096);
    for (size_t h = 0; h < hits; ++h) {
      const size_t at = (n - 256) * h / hits;
      const size_t fp = rng() % flags.fingerprints;
      std::copy_n(stored.begin() + fp * 3, 256, prompt.begin() + at);
    }
    const size_t positions = n - 256 + 1;
    std::vector<uint64_t> hashes(positions);
    const double floor = Rate(flags.seconds, [&] {
      kvd::blend::RollingHashes(prompt, 256, hashes);
      asm volatile("" : : "r"(hashes.data()) : "memory");
    });
    double probe[2];
    size_t found = 0;
    for (int parity = 0; parity < 2; ++parity) {
      std::vector<MatchCandidate> out;
      probe[parity] = Rate(flags.seconds, [&] {
        out.clear();
        if (!matchers[parity]->Probe(0, prompt, 0, &out).ok()) std::abort();
      });
      if (parity == 0) found = out.size();
    }
    const double mpos = positions / 1e6;
    std::printf("| %zu | %zu | %.0f | %.1f | %.2f | %.1f | %.2f |\n", n, found, floor * mpos,
                probe[0] * mpos, probe[0] / floor, probe[1] * mpos, probe[1] / floor);
  }
  return 0;
}

}  // namespace kvd::bench::blend
