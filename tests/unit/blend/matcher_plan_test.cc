// Tests for the matcher's request-side helpers (blend/matcher_plan.h): which windows of a
// STORE are registered (committed chunks, chunk 0 in both modes, old_st, origins, input
// checks), the non-overlapping selection of candidates, and the partition key. Single-threaded.
#include "blend/matcher_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "matcher_test_util.h"

namespace kvd::blend {
namespace {

using testing::KeyN;
using testing::RandomTokens;

struct Stored {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> committed;
  std::vector<StorageKey> keys;
  StoredRange Range(int64_t start, int64_t end) const {
    StoredRange r;
    r.tokens = tokens;
    r.start = start;
    r.end = end;
    r.committed = committed;
    r.keys = keys;
    return r;
  }
};

Stored MakeStored(size_t n_tokens, size_t n_chunks, std::vector<uint8_t> committed) {
  std::mt19937_64 rng(n_tokens);
  Stored s{RandomTokens(rng, n_tokens), std::move(committed), {}};
  for (size_t i = 0; i < n_chunks; ++i) s.keys.push_back(KeyN(100 + i));
  return s;
}

TEST(MatcherPlan, ChunkZeroIsRegisteredByDefaultAndSkippedInParity) {
  const Stored s = MakeStored(1024, 4, {1, 1, 1, 1});
  auto def = PlanRegistration(s.Range(0, 1024), 256, /*lmcache_parity=*/false);
  auto par = PlanRegistration(s.Range(0, 1024), 256, /*lmcache_parity=*/true);
  ASSERT_TRUE(def.ok() && par.ok());
  ASSERT_EQ(def->size(), 4u);
  ASSERT_EQ(par->size(), 3u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*def)[i].old_st, static_cast<int64_t>(256 * i));
    EXPECT_EQ((*def)[i].key, s.keys[i]);
    EXPECT_EQ((*def)[i].tokens.data(), s.tokens.data() + 256 * i);
    EXPECT_EQ((*def)[i].tokens.size(), 256u);
  }
  EXPECT_EQ((*par)[0].old_st, 256);
  EXPECT_EQ((*par)[0].key, s.keys[1]);
}

TEST(MatcherPlan, ARangeStartingPastZeroRegistersItsFirstChunkInBothModes) {
  // The stored range [512, 1024) of a 1024-token request: chunks at 512 and 768.
  const Stored s = MakeStored(1024, 2, {1, 1});
  for (bool parity : {false, true}) {
    auto plan = PlanRegistration(s.Range(512, 1024), 256, parity);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->size(), 2u);
    EXPECT_EQ((*plan)[0].old_st, 512);
    EXPECT_EQ((*plan)[0].tokens.data(), s.tokens.data() + 512);
    EXPECT_EQ((*plan)[1].old_st, 768);
  }
}

TEST(MatcherPlan, OnlyCommittedChunksAndOnlyFullChunks) {
  // 1000 tokens, end 1100: three full chunks from 0 (the tail of 232 tokens is not hashed).
  const Stored s = MakeStored(1000, 3, {1, 0, 1});
  auto plan = PlanRegistration(s.Range(0, 1100), 256, false);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].old_st, 0);
  EXPECT_EQ((*plan)[1].old_st, 512);
  EXPECT_EQ((*plan)[1].key, s.keys[2]);
}

TEST(MatcherPlan, ChunksReachingTheBlendedPartAreBlended) {
  const Stored s = MakeStored(1024, 4, {1, 1, 1, 1});
  StoredRange r = s.Range(0, 1024);
  r.blended_from = 300;  // chunk 1 [256, 512) holds blended positions
  auto plan = PlanRegistration(r, 256, false);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 4u);
  EXPECT_EQ((*plan)[0].origin, Origin::kOriginal);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ((*plan)[i].origin, Origin::kBlended);
  r.blended_from = 512;  // exactly at a chunk boundary
  plan = PlanRegistration(r, 256, false);
  EXPECT_EQ((*plan)[1].origin, Origin::kOriginal);
  EXPECT_EQ((*plan)[2].origin, Origin::kBlended);
}

TEST(MatcherPlan, RejectsInconsistentRanges) {
  const Stored s = MakeStored(1024, 4, {1, 1, 1, 1});
  EXPECT_FALSE(PlanRegistration(s.Range(0, 1024), 0, false).ok());
  EXPECT_FALSE(PlanRegistration(s.Range(100, 1024), 256, false).ok());  // unaligned start
  EXPECT_FALSE(PlanRegistration(s.Range(-256, 1024), 256, false).ok());
  EXPECT_FALSE(PlanRegistration(s.Range(512, 256), 256, false).ok());   // end < start
  EXPECT_FALSE(PlanRegistration(s.Range(2048, 4096), 256, false).ok()); // past the tokens
  EXPECT_FALSE(PlanRegistration(s.Range(256, 1024), 256, false).ok());  // 3 chunks, 4 keys
  Stored fewer = s;
  fewer.committed.pop_back();
  EXPECT_FALSE(PlanRegistration(fewer.Range(0, 1024), 256, false).ok());
  Stored empty_key = s;
  empty_key.keys[2] = StorageKey();
  EXPECT_FALSE(PlanRegistration(empty_key.Range(0, 1024), 256, false).ok());
  // Nothing stored: nothing to register.
  const Stored none = MakeStored(1024, 0, {});
  auto plan = PlanRegistration(none.Range(256, 256), 256, false);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
}

MatchCandidate Cand(int64_t cur_st, uint64_t key) {
  return {0, 256, cur_st, cur_st + 256, KeyN(key), Origin::kOriginal};
}

std::vector<int64_t> Starts(const std::vector<MatchCandidate>& v) {
  std::vector<int64_t> out;
  for (const auto& c : v) out.push_back(c.cur_st);
  return out;
}

TEST(MatcherPlan, SelectsNonOverlappingEarliestFirst) {
  const std::vector<MatchCandidate> cands = {Cand(600, 1), Cand(100, 2), Cand(300, 3),
                                             Cand(356, 4), Cand(612, 5), Cand(868, 6)};
  // 100 keeps [100, 356); 300 overlaps; 356 touches and is kept; 600 overlaps [356, 612);
  // 612 touches; 868 touches.
  EXPECT_EQ(Starts(SelectNonOverlapping(cands, 0)), (std::vector<int64_t>{100, 356, 612, 868}));
  // The prefix filter comes first: 100 is gone, so 300 is no longer shadowed.
  EXPECT_EQ(Starts(SelectNonOverlapping(cands, 101)), (std::vector<int64_t>{300, 600, 868}));
  EXPECT_TRUE(SelectNonOverlapping(cands, 869).empty());
  EXPECT_TRUE(SelectNonOverlapping({}, 0).empty());
  // Equal cur_st: the first in input order wins.
  const std::vector<MatchCandidate> ties = {Cand(50, 7), Cand(50, 8)};
  const auto kept = SelectNonOverlapping(ties, 0);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].key, KeyN(7));
}

TEST(MatcherPlan, PartitionKeySeparatesEachField) {
  const Partition p = MatcherPartition("model", 2, "salt");
  EXPECT_EQ(p, MatcherPartition("model", 2, "salt"));
  EXPECT_NE(p, MatcherPartition("model", 4, "salt"));
  EXPECT_NE(p, MatcherPartition("model", 2, ""));
  EXPECT_NE(p, MatcherPartition("other", 2, "salt"));
  // Length prefixes: moving bytes between fields changes the key.
  EXPECT_NE(MatcherPartition("ab", 1, "c"), MatcherPartition("a", 1, "bc"));
}

}  // namespace
}  // namespace kvd::blend
