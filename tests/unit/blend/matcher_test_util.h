// Helpers shared by the matcher tests: random token windows, distinct storage keys, and
// one-window registration. Single-threaded helpers; each returns plain values.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "blend/matcher.h"

namespace kvd::blend::testing {

// `n` token ids in [0, 50000), from `rng`.
inline std::vector<uint32_t> RandomTokens(std::mt19937_64& rng, size_t n) {
  std::uniform_int_distribution<uint32_t> dist(0, 49999);
  std::vector<uint32_t> out(n);
  for (uint32_t& t : out) t = dist(rng);
  return out;
}

// A 32-byte storage key distinct for each `i`.
inline StorageKey KeyN(uint64_t i) {
  std::array<uint8_t, 32> bytes{};
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<uint8_t>(i >> (8 * b));
  bytes[31] = 0xA5;
  return StorageKey::FromHash32(bytes);
}

inline std::vector<uint32_t> Concat(std::initializer_list<std::span<const uint32_t>> parts) {
  std::vector<uint32_t> out;
  for (auto p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Registers one window; returns what Register counted (asserting that it did not fail).
inline RegisterCounts RegisterOne(Matcher& m, Partition partition, std::span<const uint32_t> tokens,
                                  int64_t old_st, const StorageKey& key, Origin origin = Origin::kOriginal) {
  const WindowToRegister w{tokens, old_st, key, origin};
  auto r = m.Register(partition, std::span<const WindowToRegister>(&w, 1));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : RegisterCounts{};
}

inline std::vector<MatchCandidate> ProbeAll(const Matcher& m, Partition partition,
                                            std::span<const uint32_t> tokens, int64_t min_cur_st = 0,
                                            ProbeCounts* counts = nullptr) {
  std::vector<MatchCandidate> out;
  const Status st = m.Probe(partition, tokens, min_cur_st, &out, counts);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

inline std::unique_ptr<Matcher> MakeMatcher(MatcherOptions options = {}) {
  auto m = Matcher::Create(options);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

}  // namespace kvd::blend::testing
