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

TEST(SessionTable, ReusedRequestIdWithOtherTokensIsRehashed) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  auto a = Tokens(512, 1), b = Tokens(512, 2);
  ASSERT_TRUE(s.ChunkHashes("r", a, 2).ok());
  auto hb = s.ChunkHashes("r", b, 2);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(*hb, *keys::ComputeChunkHashes(Ints(b), 256));
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

TEST(SessionTable, LookupResultIsTakenOnce) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  EXPECT_FALSE(s.TakeLookupResult("r").has_value());
  s.SetLookupResult("r", 3);
  EXPECT_EQ(s.TakeLookupResult("r"), 3);
  EXPECT_FALSE(s.TakeLookupResult("r").has_value());
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

}  // namespace
}  // namespace kvd::server
