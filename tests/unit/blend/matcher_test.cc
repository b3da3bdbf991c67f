// Tests for the blend matcher (blend/matcher.h) and its hash (blend/poly_hash.h): the rolling
// hash against direct hashing, matches at any offset, once per fingerprint, short queries,
// slot-only collisions, dedup, partitions, originals against blended copies, removal, strikes,
// the capacity cap and full slot chains, and input checks. The lmcache goldens and the
// engineered 64-bit collision are in matcher_golden_test.cc; threads in
// matcher_concurrency_test.cc. Single-threaded.
#include "blend/matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "matcher_test_util.h"
#include "blend/poly_hash.h"

namespace kvd::blend {
namespace {

using testing::Concat;
using testing::KeyN;
using testing::MakeMatcher;
using testing::ProbeAll;
using testing::RandomTokens;
using testing::RegisterOne;

MatcherOptions Parity() {
  MatcherOptions o;
  o.lmcache_parity = true;
  return o;
}

// --- the hash ---------------------------------------------------------------------------

TEST(MatcherPolyHash, RollingEqualsDirectHashAtEveryOffset) {
  std::mt19937_64 rng(1);
  for (size_t k : {size_t{1}, size_t{7}, size_t{256}}) {
    std::vector<uint32_t> t32 = RandomTokens(rng, 900);
    std::vector<uint64_t> t64(t32.begin(), t32.end());
    for (size_t i = 0; i < t64.size(); i += 5) t64[i] = rng();  // ids beyond 2^32 too
    std::vector<uint64_t> r32(t32.size() - k + 1), r64(t64.size() - k + 1);
    RollingHashes(t32, k, r32);
    RollingHashes(t64, k, r64);
    for (size_t p = 0; p + k <= t32.size(); ++p) {
      ASSERT_EQ(r32[p], PolyHashWindow(std::span<const uint32_t>(t32).subspan(p, k))) << k << " " << p;
      ASSERT_EQ(r64[p], PolyHashWindow(std::span<const uint64_t>(t64).subspan(p, k))) << k << " " << p;
    }
  }
}

TEST(MatcherPolyHash, WindowHashIsThePolynomialInTheBase) {
  // H(x0, x1, x2) = x0 B^2 + x1 B + x2, and uint32 ids hash as their zero extension.
  const std::vector<uint32_t> t = {3, 0xFFFFFFFFu, 5};
  const uint64_t b = kPolyBase;
  EXPECT_EQ(PolyHashWindow(std::span<const uint32_t>(t)), 3 * b * b + 0xFFFFFFFFull * b + 5);
  EXPECT_EQ(PolyPower(3), b * b * b);
  std::vector<uint64_t> out(2, 0);
  HashWindows(std::span<const uint32_t>(t), 2, out);  // one full window; the tail is ignored
  EXPECT_EQ(out[0], 3 * b + 0xFFFFFFFFull);
  EXPECT_EQ(out[1], 0u);
}

// --- probing ----------------------------------------------------------------------------

TEST(MatcherTest, FindsAWindowAtAnyOffset) {
  for (bool parity : {false, true}) {
    MatcherOptions o;
    o.lmcache_parity = parity;
    auto m = MakeMatcher(o);
    std::mt19937_64 rng(2);
    const auto w = RandomTokens(rng, 256);
    RegisterOne(*m, 7, w, 512, KeyN(1));
    for (size_t offset : {0, 1, 2, 63, 255, 256, 257, 1000, 4093}) {
      const auto pad = RandomTokens(rng, offset);
      const auto tail = RandomTokens(rng, 3);
      const auto q = Concat({pad, w, tail});
      const auto got = ProbeAll(*m, 7, q);
      ASSERT_EQ(got.size(), 1u) << offset;
      EXPECT_EQ(got[0].cur_st, static_cast<int64_t>(offset));
      EXPECT_EQ(got[0].cur_ed, static_cast<int64_t>(offset) + 256);
      EXPECT_EQ(got[0].old_st, 512);
      EXPECT_EQ(got[0].old_ed, 768);
      EXPECT_EQ(got[0].key, KeyN(1));
    }
  }
}

TEST(MatcherTest, ReportsEachFingerprintOnceAtItsFirstPosition) {
  std::mt19937_64 rng(3);
  const auto a = RandomTokens(rng, 256), b = RandomTokens(rng, 256), pad = RandomTokens(rng, 40);
  const auto q = Concat({pad, a, b, a, pad, b, a});  // a at 40, 552, 1104; b at 296, 848
  for (bool parity : {false, true}) {
    MatcherOptions o;
    o.lmcache_parity = parity;
    auto m = MakeMatcher(o);
    RegisterOne(*m, 1, a, 0, KeyN(1));
    RegisterOne(*m, 1, b, 256, KeyN(2));
    const auto got = ProbeAll(*m, 1, q);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].key, KeyN(1));
    EXPECT_EQ(got[0].cur_st, 40);
    EXPECT_EQ(got[1].key, KeyN(2));
    EXPECT_EQ(got[1].cur_st, 296);
    // After a prefix of 300 tokens: kvd starts probing there and finds a again at 552;
    // lmcache saw a first at 40 and drops it with the prefix.
    const auto after = ProbeAll(*m, 1, q, 300);
    if (parity) {
      ASSERT_EQ(after.size(), 0u);
    } else {
      ASSERT_EQ(after.size(), 2u);
      EXPECT_EQ(after[0].cur_st, 552);
      EXPECT_EQ(after[1].cur_st, 848);
    }
  }
}

TEST(MatcherTest, RepeatedContentComputesOneDigest) {
  // A window of one repeated token hashes the same at every offset of a long run: the probe
  // confirms it once and skips the offsets whose fingerprint is already reported.
  auto m = MakeMatcher();
  const std::vector<uint32_t> run(4096, 13);
  RegisterOne(*m, 0, std::span<const uint32_t>(run).first(256), 0, KeyN(1));
  ProbeCounts c;
  const auto got = ProbeAll(*m, 0, run, 0, &c);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].cur_st, 0);
  EXPECT_EQ(c.positions, 4096u - 256 + 1);
  EXPECT_EQ(c.hash_hits, c.positions);
  EXPECT_EQ(c.digest_rejects, 0u);
}

TEST(MatcherTest, QueriesShorterThanAWindowNeverMatch) {
  for (bool parity : {false, true}) {
    MatcherOptions o;
    o.lmcache_parity = parity;
    auto m = MakeMatcher(o);
    std::mt19937_64 rng(4);
    const auto w = RandomTokens(rng, 256);
    RegisterOne(*m, 0, w, 0, KeyN(1));
    const std::span<const uint32_t> ws(w);
    EXPECT_TRUE(ProbeAll(*m, 0, {}).empty());
    EXPECT_TRUE(ProbeAll(*m, 0, ws.first(255)).empty());
    EXPECT_TRUE(ProbeAll(*m, 0, ws.last(255)).empty());
    // A window cut by the end of the query is not a match either.
    const auto pad = RandomTokens(rng, 100);
    EXPECT_TRUE(ProbeAll(*m, 0, Concat({pad, ws.first(255)})).empty());
    EXPECT_EQ(ProbeAll(*m, 0, ws).size(), 1u);
    // min_cur_st past the last window start: nothing to probe.
    EXPECT_TRUE(ProbeAll(*m, 0, ws, 1).empty());
  }
}

TEST(MatcherTest, SlotOnlyCollisionIsRejectedByTheFullHash) {
  // Adding 2^20 to the last token adds 2^20 to H (its coefficient is B^0): same slot,
  // different H.
  std::mt19937_64 rng(5);
  const auto w = RandomTokens(rng, 256);
  auto w2 = w;
  w2.back() += 1u << 20;
  const uint64_t h = PolyHashWindow(std::span<const uint32_t>(w));
  const uint64_t h2 = PolyHashWindow(std::span<const uint32_t>(w2));
  ASSERT_NE(h, h2);
  ASSERT_EQ(h & (kMatcherTableSlots - 1), h2 & (kMatcherTableSlots - 1));
  for (bool parity : {false, true}) {
    MatcherOptions o;
    o.lmcache_parity = parity;
    auto m = MakeMatcher(o);
    RegisterOne(*m, 0, w, 0, KeyN(1));
    ProbeCounts c;
    EXPECT_TRUE(ProbeAll(*m, 0, w2, 0, &c).empty());
    EXPECT_EQ(c.slot_hits, 1u);
    EXPECT_EQ(c.hash_hits, 0u);
    EXPECT_EQ(ProbeAll(*m, 0, w).size(), 1u);
  }
}

TEST(MatcherTest, DedupContentSkipsLiveContent) {
  std::mt19937_64 rng(6);
  const auto w = RandomTokens(rng, 256);
  for (bool parity : {false, true}) {
    for (bool dedup : {false, true}) {
      MatcherOptions o;
      o.lmcache_parity = parity;
      o.dedup_content = dedup;
      auto m = MakeMatcher(o);
      EXPECT_EQ(RegisterOne(*m, 0, w, 256, KeyN(1)).registered, 1u);
      const auto second = RegisterOne(*m, 0, w, 512, KeyN(2));
      EXPECT_EQ(second.registered, dedup ? 0u : 1u);
      EXPECT_EQ(second.deduplicated, dedup ? 1u : 0u);
      // The same key again is known either way.
      EXPECT_EQ(RegisterOne(*m, 0, w, 256, KeyN(1)).known, 1u);
      const auto got = ProbeAll(*m, 0, w);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].key, dedup ? KeyN(1) : KeyN(2)) << "the newest copy is reported";
    }
  }
  // Default mode: dedup is per partition.
  MatcherOptions o;
  o.dedup_content = true;
  auto m = MakeMatcher(o);
  EXPECT_EQ(RegisterOne(*m, 1, w, 0, KeyN(1)).registered, 1u);
  EXPECT_EQ(RegisterOne(*m, 2, w, 0, KeyN(2)).registered, 1u);
}

TEST(MatcherTest, PartitionsAreIsolatedInDefaultModeOnly) {
  std::mt19937_64 rng(7);
  const auto w = RandomTokens(rng, 256);
  auto m = MakeMatcher();
  RegisterOne(*m, 1, w, 0, KeyN(1));
  EXPECT_TRUE(ProbeAll(*m, 2, w).empty());
  ASSERT_EQ(ProbeAll(*m, 1, w).size(), 1u);
  // The same storage key under another partition is another fingerprint.
  EXPECT_EQ(RegisterOne(*m, 2, w, 0, KeyN(1)).registered, 1u);
  EXPECT_TRUE(m->Remove(1, KeyN(1)));
  EXPECT_TRUE(ProbeAll(*m, 1, w).empty());
  EXPECT_EQ(ProbeAll(*m, 2, w).size(), 1u);

  auto p = MakeMatcher(Parity());  // lmcache's matcher is global
  RegisterOne(*p, 1, w, 0, KeyN(1));
  EXPECT_EQ(ProbeAll(*p, 2, w).size(), 1u);
  EXPECT_EQ(RegisterOne(*p, 2, w, 0, KeyN(1)).known, 1u);
}

TEST(MatcherTest, AnOriginalIsNeverReplacedByABlendedCopy) {
  std::mt19937_64 rng(8);
  const auto w = RandomTokens(rng, 256);
  {
    auto m = MakeMatcher();
    RegisterOne(*m, 0, w, 256, KeyN(1), Origin::kOriginal);
    RegisterOne(*m, 0, w, 768, KeyN(2), Origin::kBlended);  // newer, but blended
    auto got = ProbeAll(*m, 0, w);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].key, KeyN(1));
    EXPECT_EQ(got[0].origin, Origin::kOriginal);
    // The blended copy serves once the original is gone.
    ASSERT_TRUE(m->Remove(0, KeyN(1)));
    got = ProbeAll(*m, 0, w);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].key, KeyN(2));
    EXPECT_EQ(got[0].origin, Origin::kBlended);
    EXPECT_EQ(got[0].old_st, 768);
    // A later original wins over the blended copy; among originals the newest.
    RegisterOne(*m, 0, w, 0, KeyN(3), Origin::kOriginal);
    RegisterOne(*m, 0, w, 0, KeyN(4), Origin::kOriginal);
    RegisterOne(*m, 0, w, 0, KeyN(5), Origin::kBlended);
    got = ProbeAll(*m, 0, w);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].key, KeyN(4));
  }
  {
    auto p = MakeMatcher(Parity());  // lmcache: the newest registration owns the slot
    RegisterOne(*p, 0, w, 256, KeyN(1), Origin::kOriginal);
    RegisterOne(*p, 0, w, 768, KeyN(2), Origin::kBlended);
    const auto got = ProbeAll(*p, 0, w);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].key, KeyN(2));
  }
}

// --- removal and strikes ----------------------------------------------------------------

TEST(MatcherTest, RemoveMakesALaterProbeMissAndFreesTheId) {
  std::mt19937_64 rng(9);
  const auto a = RandomTokens(rng, 256), b = RandomTokens(rng, 256);
  auto m = MakeMatcher();
  RegisterOne(*m, 0, a, 0, KeyN(1));
  RegisterOne(*m, 0, b, 256, KeyN(2));
  const auto q = Concat({a, b});
  ASSERT_EQ(ProbeAll(*m, 0, q).size(), 2u);
  EXPECT_FALSE(m->Remove(0, KeyN(9)));
  EXPECT_FALSE(m->Remove(1, KeyN(1)));  // other partition
  EXPECT_TRUE(m->Remove(0, KeyN(1)));
  EXPECT_FALSE(m->Remove(0, KeyN(1)));
  auto got = ProbeAll(*m, 0, q);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].key, KeyN(2));
  EXPECT_EQ(m->Stats().live, 1u);
  EXPECT_EQ(m->Stats().ids_used, 1u);
  // Re-registering reuses the freed id.
  RegisterOne(*m, 0, a, 0, KeyN(1));
  EXPECT_EQ(m->Stats().ids_used, 2u);
  EXPECT_EQ(ProbeAll(*m, 0, q).size(), 2u);
}

TEST(MatcherTest, RemovingOneOfASlotChainKeepsTheOthers) {
  std::mt19937_64 rng(10);
  const auto w = RandomTokens(rng, 256);
  std::vector<std::vector<uint32_t>> ws;
  for (uint32_t i = 0; i < 3; ++i) {
    ws.push_back(w);
    ws.back().back() += i << 20;  // three fingerprints in one slot
  }
  auto m = MakeMatcher();
  for (uint32_t i = 0; i < 3; ++i) RegisterOne(*m, 0, ws[i], 0, KeyN(i));
  EXPECT_TRUE(m->Remove(0, KeyN(1)));  // the middle of the chain
  EXPECT_EQ(ProbeAll(*m, 0, ws[0]).size(), 1u);
  EXPECT_TRUE(ProbeAll(*m, 0, ws[1]).empty());
  EXPECT_EQ(ProbeAll(*m, 0, ws[2]).size(), 1u);
  EXPECT_TRUE(m->Remove(0, KeyN(2)));  // the head
  EXPECT_TRUE(m->Remove(0, KeyN(0)));
  ProbeCounts c;
  EXPECT_TRUE(ProbeAll(*m, 0, ws[0], 0, &c).empty());
  EXPECT_EQ(c.slot_hits, 0u) << "an emptied slot's occupancy bit is cleared";
}

TEST(MatcherTest, StrikesRemoveAtTheThresholdUnlessPending) {
  std::mt19937_64 rng(11);
  const auto w = RandomTokens(rng, 256);
  auto m = MakeMatcher(Parity());
  RegisterOne(*m, 0, w, 0, KeyN(1));
  EXPECT_EQ(m->Strike(0, KeyN(1)), StrikeOutcome::kCounted);
  EXPECT_EQ(ProbeAll(*m, 0, w).size(), 1u);
  m->ClearStrikes(0, KeyN(1));  // found on the next lookup: strikes forgotten
  EXPECT_EQ(m->Strike(0, KeyN(1)), StrikeOutcome::kCounted);
  // While a registration of the key is in flight, strikes do not count.
  const StorageKey k1 = KeyN(1);
  m->BeginPending(0, std::span<const StorageKey>(&k1, 1));
  EXPECT_EQ(m->Strike(0, KeyN(1)), StrikeOutcome::kPending);
  EXPECT_EQ(m->Strike(0, KeyN(1)), StrikeOutcome::kPending);
  EXPECT_EQ(ProbeAll(*m, 0, w).size(), 1u);
  m->EndPending(0, std::span<const StorageKey>(&k1, 1));
  EXPECT_EQ(m->Strike(0, KeyN(1)), StrikeOutcome::kRemoved);
  EXPECT_TRUE(ProbeAll(*m, 0, w).empty());
  EXPECT_EQ(m->Stats().removed, 1u);
  // A key the matcher never had can be struck out too (lmcache counts by hash).
  EXPECT_EQ(m->Strike(0, KeyN(2)), StrikeOutcome::kCounted);
  EXPECT_EQ(m->Strike(0, KeyN(2)), StrikeOutcome::kRemoved);
}

// --- capacity -----------------------------------------------------------------------------

TEST(MatcherTest, CapacityCapRefusesAndCountsDefaultMode) {
  MatcherOptions o;
  o.max_ids = 10;
  auto m = MakeMatcher(o);
  std::mt19937_64 rng(12);
  std::vector<std::vector<uint32_t>> ws;
  for (int i = 0; i < 12; ++i) ws.push_back(RandomTokens(rng, 256));
  std::vector<WindowToRegister> batch;
  for (int i = 0; i < 12; ++i) batch.push_back({ws[i], int64_t{i} * 256, KeyN(i), Origin::kOriginal});
  auto r = m->Register(0, batch);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->registered, 10u);
  EXPECT_EQ(r->refused_full, 2u);
  MatcherStats s = m->Stats();
  EXPECT_EQ(s.live, 10u);
  EXPECT_EQ(s.refused_full, 2u);
  EXPECT_EQ(s.capacity_warnings, 1u);
  EXPECT_TRUE(ProbeAll(*m, 0, ws[11]).empty());
  // Room again after a removal.
  ASSERT_TRUE(m->Remove(0, KeyN(0)));
  EXPECT_EQ(RegisterOne(*m, 0, ws[11], 0, KeyN(11)).registered, 1u);
  EXPECT_EQ(ProbeAll(*m, 0, ws[11]).size(), 1u);
}

TEST(MatcherTest, CapacityCapInParityModeRefusesWholeBatchesAndNeverReusesIds) {
  MatcherOptions o = Parity();
  o.max_ids = 4;
  auto m = MakeMatcher(o);
  std::mt19937_64 rng(13);
  std::vector<std::vector<uint32_t>> ws;
  for (int i = 0; i < 6; ++i) ws.push_back(RandomTokens(rng, 256));
  std::vector<WindowToRegister> first, second;
  for (int i = 0; i < 3; ++i) first.push_back({ws[i], 0, KeyN(i), Origin::kOriginal});
  for (int i = 3; i < 5; ++i) second.push_back({ws[i], 0, KeyN(i), Origin::kOriginal});
  EXPECT_EQ(m->Register(0, first)->registered, 3u);
  auto r = m->Register(0, second);  // 3 + 2 > 4: refused whole
  EXPECT_EQ(r->registered, 0u);
  EXPECT_EQ(r->refused_full, 2u);
  EXPECT_TRUE(ProbeAll(*m, 0, ws[3]).empty());
  EXPECT_EQ(RegisterOne(*m, 0, ws[3], 0, KeyN(3)).registered, 1u);
  ASSERT_TRUE(m->Remove(0, KeyN(0)));
  EXPECT_EQ(RegisterOne(*m, 0, ws[5], 0, KeyN(5)).refused_full, 1u) << "ids are never reused";
}

TEST(MatcherTest, AFullSlotChainRefusesUnlessTheNewOneSupersedes) {
  std::mt19937_64 rng(14);
  const auto w = RandomTokens(rng, 256);
  std::vector<std::vector<uint32_t>> ws;
  for (uint32_t i = 0; i < 4; ++i) {
    ws.push_back(w);
    ws.back().back() += i << 20;  // one slot, distinct H
  }
  MatcherOptions o;
  o.max_chain = 2;
  auto m = MakeMatcher(o);
  RegisterOne(*m, 0, ws[0], 0, KeyN(0), Origin::kBlended);
  RegisterOne(*m, 0, ws[1], 0, KeyN(1), Origin::kOriginal);
  // Another blended window of other content: refused.
  EXPECT_EQ(RegisterOne(*m, 0, ws[2], 0, KeyN(2), Origin::kBlended).refused_slot, 1u);
  // An original displaces the blended one.
  EXPECT_EQ(RegisterOne(*m, 0, ws[3], 0, KeyN(3), Origin::kOriginal).registered, 1u);
  EXPECT_TRUE(ProbeAll(*m, 0, ws[0]).empty());
  EXPECT_EQ(ProbeAll(*m, 0, ws[1]).size(), 1u);
  EXPECT_EQ(ProbeAll(*m, 0, ws[3]).size(), 1u);
  // A newer copy of ws[1]'s content displaces the older copy; the answer stays ws[1]'s content.
  EXPECT_EQ(RegisterOne(*m, 0, ws[1], 512, KeyN(4), Origin::kOriginal).registered, 1u);
  auto got = ProbeAll(*m, 0, ws[1]);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].key, KeyN(4));
  EXPECT_EQ(m->Stats().refused_slot, 1u);
}

// --- input checks ---------------------------------------------------------------------------

TEST(MatcherTest, RejectsMalformedInput) {
  MatcherOptions bad;
  bad.window = 0;
  EXPECT_FALSE(Matcher::Create(bad).ok());
  bad = {};
  bad.max_ids = 0;
  EXPECT_FALSE(Matcher::Create(bad).ok());
  bad.max_ids = kMatcherMaxIds + 1;
  EXPECT_FALSE(Matcher::Create(bad).ok());
  bad = {};
  bad.max_chain = 0;
  EXPECT_FALSE(Matcher::Create(bad).ok());

  const std::vector<uint8_t> eight(8, 1), seven(7, 1), thirty_two(32, 2);
  EXPECT_TRUE(StorageKey::FromBytes(eight).ok());
  EXPECT_TRUE(StorageKey::FromBytes(thirty_two).ok());
  EXPECT_FALSE(StorageKey::FromBytes(seven).ok());
  EXPECT_FALSE(StorageKey::FromBytes({}).ok());
  EXPECT_FALSE(*StorageKey::FromBytes(eight) == *StorageKey::FromBytes(std::vector<uint8_t>(32, 1)));

  auto m = MakeMatcher();
  std::mt19937_64 rng(15);
  const auto w = RandomTokens(rng, 257);
  const std::span<const uint32_t> ws(w);
  const WindowToRegister good{ws.first(256), 0, KeyN(1), Origin::kOriginal};
  const std::vector<WindowToRegister> batches[] = {
      {good, {ws, 0, KeyN(2), Origin::kOriginal}},               // 257 tokens
      {good, {ws.first(256), -1, KeyN(3), Origin::kOriginal}},   // negative old_st
      {good, {ws.first(256), 0, StorageKey(), Origin::kOriginal}},  // empty key
  };
  for (const auto& batch : batches) {
    auto r = m->Register(0, batch);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(m->Stats().live, 0u) << "a failed batch changes nothing";
  std::vector<MatchCandidate> out;
  EXPECT_FALSE(m->Probe(0, ws, -1, &out).ok());
  EXPECT_FALSE(m->Probe(0, ws, 0, nullptr).ok());
}

}  // namespace
}  // namespace kvd::blend
