// The trace simulator (tools/evsim): its replay of the real policies checked against
// outcomes worked out by hand and against small reference models written here from the
// request model of trace_sim.h, so a broken replay (wrong hit counting, wrong access or
// release order, evicting the blocks being stored, lost tokens) fails a test.
#include <algorithm>
#include <list>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "eviction/eviction_policy.h"
#include "tools/evsim/trace_sim.h"

namespace kvd::evsim {
namespace {

std::string Line(int64_t tokens, const std::vector<uint64_t>& hashes) {
  std::string s = "{\"timestamp\": 0, \"input_length\": " + std::to_string(tokens) +
                  ", \"output_length\": 1, \"hash_ids\": [";
  for (size_t i = 0; i < hashes.size(); ++i) s += (i ? ", " : "") + std::to_string(hashes[i]);
  return s + "]}\n";
}

Trace MustParse(const std::string& jsonl, int64_t block_tokens, bool partial_blocks = false) {
  auto t = ParseTrace(jsonl, {.block_tokens = block_tokens, .partial_blocks = partial_blocks});
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : Trace{};
}

// Full blocks of `b` tokens each: a request of n blocks has n * b tokens.
std::string Req(int64_t b, const std::vector<uint64_t>& hashes) {
  return Line(b * static_cast<int64_t>(hashes.size()), hashes);
}

SimResult MustSimulate(const Trace& t, const std::string& policy, uint64_t cap, uint32_t shards = 1) {
  auto r = SimulatePolicy(t, policy, cap, shards);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : SimResult{};
}

TEST(TraceSim, ParsesMooncakeLinesIntoDenseBlocks) {
  const Trace t = MustParse(Line(1024, {70, 71}) + "\n" + Line(1100, {70, 99, 5}), 512);
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.unique_blocks, 3u);
  EXPECT_EQ(t.total_blocks, 4u);
  EXPECT_EQ(t.total_tokens, 2124u);
  EXPECT_EQ(t.requests[0].blocks, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(t.requests[1].blocks, (std::vector<uint64_t>{0, 2}));  // 5 is partial: dropped
}

TEST(TraceSim, SkipAndMaxRequestsSelectAWindowWithItsOwnFootprint) {
  const std::string jsonl = Line(512, {1}) + Line(1024, {1, 2}) + Line(1024, {1, 3}) +
                            Line(512, {4});
  auto t = ParseTrace(jsonl, {.skip_requests = 1, .max_requests = 2});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->requests.size(), 2u);
  EXPECT_EQ(t->unique_blocks, 3u);  // 1, 2, 3: not 4
  EXPECT_EQ(t->total_tokens, 2048u);
  EXPECT_EQ(t->requests[1].blocks, (std::vector<uint64_t>{0, 2}));
}

TEST(TraceSim, BadLinesAreRefusedWithTheirNumber) {
  auto t = ParseTrace(Line(10, {1}) + "{\"input_length\": 5}\n");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status().ToString();
  EXPECT_FALSE(ParseTrace("not json\n").ok());
  EXPECT_FALSE(ParseTrace(Line(-1, {1})).ok());
  EXPECT_FALSE(ParseTrace(Line(10, {1}), {.block_tokens = 0}).ok());
}

TEST(TraceSim, UnknownPolicyAndZeroCapacityAreRefused) {
  const Trace t = MustParse(Req(1, {1}), 1);
  EXPECT_FALSE(SimulatePolicy(t, "MRU", 4).ok());
  EXPECT_FALSE(SimulatePolicy(t, "LRU", 0).ok());
  EXPECT_TRUE(SimulatePolicy(t, "lru", 4).ok());  // names are case-insensitive
}

// Worked by hand, capacity 3 blocks, 1 token per block (list: least recent first):
//   r1 [a b c]  3 misses; stored, released c, b, a                 -> c b a
//   r2 [d]      miss; evicts c (a request's later chunks go first) -> b a d
//   r3 [a b c]  hits a b; used b then a                            -> d b a
//               c missed: evicts d                                 -> b a c
//   r4 [d]      miss; evicts b                                     -> a c d
//   r5 [a b]    hits a (b is gone)                                 -> c d a
//               b missed: evicts c                                 -> d a b
// Hits: 2 + 1 = 3 blocks of 3 + 1 + 3 + 1 + 2 = 10; 4 evictions.
TEST(TraceSim, LruReplayMatchesAHandWorkedExample) {
  const Trace t = MustParse(Req(1, {1, 2, 3}) + Req(1, {4}) + Req(1, {1, 2, 3}) + Req(1, {4}) +
                                Req(1, {1, 2}),
                            1);
  const SimResult r = MustSimulate(t, "LRU", 3);
  EXPECT_EQ(r.hit_blocks, 3u);
  EXPECT_EQ(r.hit_tokens, 3u);
  EXPECT_EQ(r.evictions, 4u);
  EXPECT_EQ(r.not_stored, 0u);
  EXPECT_DOUBLE_EQ(r.block_hit_ratio, 3.0 / 10.0);
  // noop on the same trace: a b c stay forever, d is never stored.
  const SimResult n = MustSimulate(t, "noop", 3);
  EXPECT_EQ(n.hit_blocks, 3u + 0u + 2u);  // r3: a b c, r5: a b
  EXPECT_EQ(n.evictions, 0u);
  EXPECT_EQ(n.not_stored, 2u);            // d, twice
}

TEST(TraceSim, PartialLastBlocksAreNotStoredButTheirTokensCount) {
  // 512-token blocks; 1100 tokens = 512 + 512 + 76: the 76 are never stored (kvd's model).
  const Trace t = MustParse(Line(1100, {5, 6, 7}) + Line(1100, {5, 6, 7}), 512);
  const SimResult r = MustSimulate(t, "LRU", 8);
  EXPECT_EQ(r.hit_blocks, 2u);
  EXPECT_EQ(r.hit_tokens, 1024u);
  EXPECT_DOUBLE_EQ(r.token_hit_ratio, 1024.0 / 2200.0);
}

TEST(TraceSim, PartialLastBlocksCountTheirTokensWhenStored) {
  const Trace t = MustParse(Line(1100, {5, 6, 7}) + Line(1100, {5, 6, 7}), 512,
                            /*partial_blocks=*/true);
  const SimResult r = MustSimulate(t, "LRU", 8);
  EXPECT_EQ(r.hit_blocks, 3u);
  EXPECT_EQ(r.hit_tokens, 1100u);
  EXPECT_DOUBLE_EQ(r.token_hit_ratio, 0.5);
}

TEST(TraceSim, ABlockBehindAMissIsNotAHit) {
  // cap 2: r1 [0 1] -> 1 0; r2 [1] hits 1 -> 0 1; r3 [2] evicts 0 -> 1 2;
  // r4 [0 1]: block 1 is cached but block 0 is not, so prefix caching hits nothing.
  const Trace t = MustParse(Req(1, {10, 11}) + Req(1, {11}) + Req(1, {12}) + Req(1, {10, 11}), 1);
  const SimResult r = MustSimulate(t, "LRU", 2);
  EXPECT_EQ(r.hit_blocks, 1u);  // r2 only
  EXPECT_EQ(r.hit_tokens, 1u);
}

// A reference LRU for the request model, written with std::list and no policy code.
uint64_t ReferenceLruHits(const Trace& t, uint64_t cap) {
  std::list<uint64_t> order;  // front = least recently used
  std::vector<std::list<uint64_t>::iterator> where(t.unique_blocks);
  std::vector<bool> in(t.unique_blocks, false);
  uint64_t hits = 0;
  for (const Request& q : t.requests) {
    size_t h = 0;
    while (h < q.blocks.size() && in[q.blocks[h]]) ++h;
    hits += h;
    for (size_t i = h; i-- > 0;) {  // used last first: the first block ends most recent
      order.erase(where[q.blocks[i]]);
      where[q.blocks[i]] = order.insert(order.end(), q.blocks[i]);
    }
    std::vector<uint64_t> stored;
    for (size_t i = h; i < q.blocks.size(); ++i) {
      const uint64_t b = q.blocks[i];
      if (in[b]) continue;
      if (order.size() + stored.size() >= cap) {
        if (order.empty()) break;  // only this request's blocks: no room
        in[order.front()] = false;
        order.pop_front();
      }
      in[b] = true;
      stored.push_back(b);
    }
    for (size_t i = stored.size(); i-- > 0;) where[stored[i]] = order.insert(order.end(), stored[i]);
  }
  return hits;
}

// Noop: blocks are stored while there is room, and stay.
uint64_t ReferenceNoopHits(const Trace& t, uint64_t cap) {
  std::set<uint64_t> in;
  uint64_t hits = 0;
  for (const Request& q : t.requests) {
    size_t h = 0;
    while (h < q.blocks.size() && in.count(q.blocks[h])) ++h;
    hits += h;
    for (size_t i = h; i < q.blocks.size() && in.size() < cap; ++i) in.insert(q.blocks[i]);
  }
  return hits;
}

uint64_t ReferenceInfiniteHits(const Trace& t) {
  std::set<uint64_t> seen;
  uint64_t hits = 0;
  for (const Request& q : t.requests) {
    size_t h = 0;
    while (h < q.blocks.size() && seen.count(q.blocks[h])) ++h;
    hits += h;
    seen.insert(q.blocks.begin(), q.blocks.end());
  }
  return hits;
}

// Conversations (trace_sim.h): each turn extends an earlier one; a few shared system prompts.
Trace RandomConversations(uint32_t seed, int requests) {
  return MustParse(SyntheticConversations(seed, requests), kSyntheticBlockTokens);
}

TEST(TraceSim, LruAndNoopMatchReferenceModelsOnRandomConversations) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const Trace t = RandomConversations(seed, 400);
    for (uint64_t cap : {2u, 7u, 30u, 120u, 100000u}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " cap " + std::to_string(cap));
      EXPECT_EQ(MustSimulate(t, "LRU", cap).hit_blocks, ReferenceLruHits(t, cap));
      EXPECT_EQ(MustSimulate(t, "noop", cap).hit_blocks, ReferenceNoopHits(t, cap));
    }
  }
}

TEST(TraceSim, ShardedLruKeepsTheGlobalOrder) {
  const Trace t = RandomConversations(9, 600);
  for (uint64_t cap : {10u, 50u}) {
    EXPECT_EQ(MustSimulate(t, "LRU", cap, 64).hit_blocks, MustSimulate(t, "LRU", cap, 1).hit_blocks);
  }
}

// Popular one-block requests, each repeated after 160 one-shot requests; room for 100 blocks.
TEST(TraceSim, LhdLearnsOnOneShardAndOnSixtyFourSharingOneIndex) {
  std::string jsonl;
  uint64_t next = 1000;
  for (int round = 0; round < 100; ++round) {
    for (uint64_t p = 0; p < 40; ++p) {
      jsonl += Req(1, {p});
      for (int s = 0; s < 4; ++s) jsonl += Req(1, {next++});
    }
  }
  const Trace t = MustParse(jsonl, 1);
  EXPECT_EQ(MustSimulate(t, "LRU", 100).hit_blocks, 0u);
  const uint64_t one = MustSimulate(t, "LHD", 100, 1).hit_blocks;
  const uint64_t sharded = MustSimulate(t, "LHD", 100, 64).hit_blocks;
  EXPECT_GE(one, 40u * 50);  // most of the last half of the rounds, at least
  EXPECT_GE(sharded, 40u * 50);
}

TEST(TraceSim, OptBoundsEveryPolicyAndEveryoneMatchesInfiniteWhenNothingIsEvicted) {
  for (uint32_t seed = 11; seed <= 14; ++seed) {
    const Trace t = RandomConversations(seed, 400);
    const SimResult inf = SimulateInfinite(t);
    EXPECT_EQ(inf.hit_blocks, ReferenceInfiniteHits(t));
    for (uint64_t cap : {5u, 20u, 80u}) {
      const SimResult opt = SimulateOpt(t, cap);
      EXPECT_LE(opt.hit_blocks, inf.hit_blocks);
      for (const auto& p : eviction::PolicyNames()) {
        SCOPED_TRACE(p + " cap " + std::to_string(cap));
        EXPECT_LE(MustSimulate(t, p, cap).hit_blocks, opt.hit_blocks);
      }
    }
    for (const auto& p : eviction::PolicyNames()) {
      const SimResult r = MustSimulate(t, p, t.unique_blocks);
      EXPECT_EQ(r.hit_blocks, inf.hit_blocks) << p;
      EXPECT_EQ(r.hit_tokens, inf.hit_tokens) << p;
      EXPECT_EQ(r.evictions, 0u) << p;
    }
    EXPECT_EQ(SimulateOpt(t, t.unique_blocks).hit_blocks, inf.hit_blocks);
  }
}

}  // namespace
}  // namespace kvd::evsim
