#include "server/sessions.h"

#include <gtest/gtest.h>

namespace kvd::server {
namespace {

wire::TokenIds Tokens(size_t n, int64_t seed, size_t bad_index = SIZE_MAX, int64_t bad_value = 0) {
  wire::TokenIds t;
  for (size_t i = 0; i < n; ++i) {
    t.push_back(i == bad_index ? bad_value : static_cast<int64_t>((i * 131 + seed) % 100000));
  }
  return t;
}

std::vector<int64_t> Ints(const wire::TokenIds& t) {
  return std::vector<int64_t>(t.data(), t.data() + t.size());
}

TEST(SessionTable, HashesMatchAFreshComputationAndGrowIncrementally) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  auto t = Tokens(1000, 1);
  auto want = keys::ComputeChunkHashes(Ints(t), 256);
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(want->size(), 3u);
  auto two = s.ChunkHashes("r", t, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, std::vector<keys::Hash32>(want->begin(), want->begin() + 2));
  auto three = s.ChunkHashes("r", t, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(*three, *want);
}

// A lookup hashes in batches of 1, 2, 4, ... chunks while the last chunk hashed is present,
// and stops at the first absent one; a later call (a store) hashes the rest, once.
TEST(SessionTable, HashingForALookupStopsAfterTheFirstAbsentChunk) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  const auto t = Tokens(64 * 256, 3);
  const auto want = *keys::ComputeChunkHashes(Ints(t), 256);
  ASSERT_EQ(want.size(), 64u);
  std::vector<size_t> asked;
  auto cached_below = [&](size_t n) {
    return [&asked, &want, n](size_t chunk, const keys::Hash32& h) {
      asked.push_back(chunk);
      EXPECT_EQ(h, want[chunk]);  // asked with the chunk's own hash
      return chunk < n;
    };
  };
  // Chunks 0-4 cached: [0,1) asked about 0, [1,3) about 2, [3,7) about 6: stop.
  auto some = s.ChunkHashesWhilePresent("r", t, 64, {}, cached_below(5));
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(*some, std::vector<keys::Hash32>(want.begin(), want.begin() + 7));
  EXPECT_EQ(asked, (std::vector<size_t>{0, 2, 6}));
  EXPECT_EQ(s.hashed_chunks(), 7u);
  // The request's store hashes only the rest.
  auto all = s.ChunkHashes("r", t, 64);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, want);
  EXPECT_EQ(s.hashed_chunks(), 64u);
  // A new prompt: one chunk hashed. Everything cached: all of them, asked at 0, 2, 6, 14, 30, 62.
  asked.clear();
  auto one = s.ChunkHashesWhilePresent("new", t, 64, {}, cached_below(0));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
  asked.clear();
  auto every = s.ChunkHashesWhilePresent("hit", t, 64, {}, cached_below(64));
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(*every, want);
  EXPECT_EQ(asked, (std::vector<size_t>{0, 2, 6, 14, 30, 62}));
  // A session whose chain is complete has nothing left to ask about.
  asked.clear();
  auto again = s.ChunkHashesWhilePresent("r", t, 64, {}, cached_below(0));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, want);  // all 64 were hashed by the store: nothing left to ask
  EXPECT_TRUE(asked.empty());
  // A session with part of its chain is asked about its last hash first, and stops there.
  ASSERT_TRUE(s.ChunkHashes("part", t, 5).ok());
  const uint64_t hashed = s.hashed_chunks();
  asked.clear();
  auto part = s.ChunkHashesWhilePresent("part", t, 64, {}, cached_below(0));
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(*part, std::vector<keys::Hash32>(want.begin(), want.begin() + 5));
  EXPECT_EQ(asked, (std::vector<size_t>{4}));
  EXPECT_EQ(s.hashed_chunks(), hashed);
  // The tokens are checked over the whole range, as ChunkHashes checks them.
  EXPECT_FALSE(s.ChunkHashesWhilePresent("bad", Tokens(64 * 256, 3, 5000, -1), 64, {},
                                         cached_below(0))
                   .ok());
  EXPECT_FALSE(s.ChunkHashesWhilePresent("short", Tokens(300, 3), 2, {}, cached_below(0)).ok());
}

TEST(SessionTable, ReusedRequestIdWithOtherTokensIsRehashed) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  auto a = Tokens(512, 1), b = Tokens(512, 2);
  ASSERT_TRUE(s.ChunkHashes("r", a, 2).ok());
  auto hb = s.ChunkHashes("r", b, 2);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(*hb, *keys::ComputeChunkHashes(Ints(b), 256));
}

TEST(SessionTable, APrefixAnotherRequestHashedIsTakenFromTheMemoPerSalt) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600, {}, 1 << 20);
  auto t = Tokens(1024, 7);
  const auto want = *keys::ComputeChunkHashes(Ints(t), 256);
  const SessionIdentity plain{"m", 1, "", ""}, salted{"m", 1, "tenant", ""};
  ASSERT_EQ(*s.ChunkHashes("a", t, 4, plain), want);
  EXPECT_EQ(s.chunk_key_memo_stats().hits, 0u);
  // Another request of the same prompt: its keys come from the memo, the same keys.
  ASSERT_EQ(*s.ChunkHashes("b", t, 4, plain), want);
  EXPECT_EQ(s.chunk_key_memo_stats().hits, 4u);
  // A request under another salt hashes for itself.
  ASSERT_EQ(*s.ChunkHashes("c", t, 4, salted), want);
  EXPECT_EQ(s.chunk_key_memo_stats().hits, 4u);
  EXPECT_EQ(s.chunk_key_memo_stats().misses, 8u);
  EXPECT_EQ(s.hashed_chunks(), 12u);  // keys computed, from the memo or not
  // Off: every request hashes.
  SessionTable off(&clock, 256, 600);
  ASSERT_EQ(*off.ChunkHashes("a", t, 4, plain), want);
  ASSERT_EQ(*off.ChunkHashes("b", t, 4, plain), want);
  EXPECT_EQ(off.chunk_key_memo_stats().hits, 0u);
}

TEST(SessionTable, TooFewTokensAndOutOfRangeTokensAreErrors) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  EXPECT_FALSE(s.ChunkHashes("r", Tokens(300, 1), 2).ok());
  auto big = s.ChunkHashes("r", Tokens(256, 1, 7, int64_t{1} << 33), 1);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("index 7 has value 8589934592"), std::string::npos)
      << big.status().message();
  EXPECT_FALSE(s.ChunkHashes("q", Tokens(256, 1, 7, -1), 1).ok());
  // A token beyond the hashed chunks is never encoded: fine.
  EXPECT_TRUE(s.ChunkHashes("p", Tokens(300, 1, 290, -1), 1).ok());
  // A session that hashed the good tokens does not reuse them for a range with a bad one,
  // even where the truncated value would compare equal.
  auto good = Tokens(512, 1);
  ASSERT_TRUE(s.ChunkHashes("s", good, 2).ok());
  EXPECT_FALSE(s.ChunkHashes("s", Tokens(512, 1, 3, int64_t{good[3]} + (int64_t{1} << 32)), 2).ok());
}

TEST(SessionTable, IdleSessionsExpireAndEndReturnsIdentityAndHashes) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  ASSERT_TRUE(s.ChunkHashes("old", Tokens(256, 1), 1, SessionIdentity{"m", 1, "", ""}).ok());
  clock.AdvanceSeconds(500);
  ASSERT_TRUE(s.ChunkHashes("new", Tokens(256, 2), 1, SessionIdentity{"m", 1, "salt", ""}).ok());
  clock.AdvanceSeconds(200);
  EXPECT_EQ(s.Expire(), 1u);
  EXPECT_EQ(s.size(), 1u);
  auto [identity, hashes] = s.End("new");
  EXPECT_EQ(identity, (SessionIdentity{"m", 1, "salt", ""}));
  EXPECT_EQ(hashes.size(), 1u);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_TRUE(s.End("new").second.empty());
}

// Issue 11, finding 8: sessions are bounded in number and in bytes; the least recently used
// go first, and the table counts them.
TEST(SessionTable, Finding8SessionsAreBoundedInCountAndBytesOldestFirst) {
  FakeClock clock;
  SessionLimits limits;
  limits.max_sessions = 4;
  limits.max_bytes = 1 << 20;
  SessionTable s(&clock, 256, 600, limits);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(s.ChunkHashes("r" + std::to_string(i), Tokens(256, i), 1).ok());
    clock.AdvanceSeconds(1);
    if (i == 8) {
      ASSERT_TRUE(s.ChunkHashes("r5", Tokens(256, 5), 1).ok());  // the oldest, used again
    }
  }
  EXPECT_EQ(s.size(), 4u);
  EXPECT_EQ(s.evicted(), 6u);
  for (const char* kept : {"r5", "r7", "r8", "r9"}) EXPECT_TRUE(s.Contains(kept)) << kept;
  EXPECT_FALSE(s.Contains("r6"));
  EXPECT_FALSE(s.Contains("r0"));

  // Bytes: sessions of 8192 tokens (32 KiB of tokens each) under a 200 KiB bound.
  FakeClock clock2;
  limits.max_sessions = 1000;
  limits.max_bytes = 200 << 10;
  SessionTable b(&clock2, 256, 600, limits);
  const auto t = Tokens(8192, 3);
  const auto want = keys::ComputeChunkHashes(Ints(t), 256);
  for (int i = 0; i < 50; ++i) {
    auto h = b.ChunkHashes("b" + std::to_string(i), t, 32);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(*h, *want);
    EXPECT_LE(b.bytes(), limits.max_bytes);
  }
  EXPECT_GT(b.size(), 1u);
  EXPECT_LT(b.size(), 10u);
  EXPECT_TRUE(b.Contains("b49"));
  EXPECT_GT(b.evicted(), 40u);
  // A session larger than the whole bound is not kept, but its hashes are still right.
  const auto huge = Tokens(65536, 4);
  auto hh = b.ChunkHashes("huge", huge, 256);
  ASSERT_TRUE(hh.ok());
  EXPECT_EQ(*hh, *keys::ComputeChunkHashes(Ints(huge), 256));
  EXPECT_LE(b.bytes(), limits.max_bytes);
  // Ending and expiring give the bytes back.
  for (int i = 0; i < 50; ++i) b.End("b" + std::to_string(i));
  b.End("huge");
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.bytes(), 0u);
}

// Issue 11, finding 8: STORE and RETRIEVE use a request's session but never create one, so
// a store after END_SESSION does not bring the session back for another TTL.
TEST(SessionTable, Finding8StoreAfterEndSessionDoesNotRecreateTheSession) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  const auto t = Tokens(512, 1);
  ASSERT_TRUE(s.ChunkHashes("r", t, 2, {}, SessionUse::kCreate).ok());  // LOOKUP
  EXPECT_EQ(s.size(), 1u);
  s.End("r");
  auto h = s.ChunkHashes("r", t, 2, {}, SessionUse::kIfExists);  // a late STORE
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, *keys::ComputeChunkHashes(Ints(t), 256));
  EXPECT_EQ(s.size(), 0u);
  EXPECT_FALSE(s.Contains("r"));
  EXPECT_EQ(s.bytes(), 0u);
  // While the session lives, a store reuses and extends its hashes.
  ASSERT_TRUE(s.ChunkHashes("q", t, 1, {}, SessionUse::kCreate).ok());
  auto more = s.ChunkHashes("q", t, 2, {}, SessionUse::kIfExists);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(*more, *keys::ComputeChunkHashes(Ints(t), 256));
  EXPECT_EQ(s.size(), 1u);
}

TEST(SessionTable, Finding8ExpiryFreesTheOldestSessionsAndTheirBytes) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s.ChunkHashes("e" + std::to_string(i), Tokens(256, i), 1).ok());
    clock.AdvanceSeconds(100);
  }
  const uint64_t before = s.bytes();
  EXPECT_GT(before, 5u * 1024);
  clock.AdvanceSeconds(350);  // e0 (850 s idle), e1 (750), e2 (650) expire; e3, e4 stay
  EXPECT_EQ(s.Expire(), 3u);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_TRUE(s.Contains("e3"));
  EXPECT_LT(s.bytes(), before);
  EXPECT_EQ(s.evicted(), 0u);  // expiry is not eviction
}

}  // namespace
}  // namespace kvd::server
