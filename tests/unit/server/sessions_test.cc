#include "server/sessions.h"

#include <gtest/gtest.h>

namespace kvd::server {
namespace {

std::vector<int64_t> Tokens(size_t n, int64_t seed) {
  std::vector<int64_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int64_t>((i * 131 + seed) % 100000);
  return t;
}

TEST(SessionTable, HashesMatchAFreshComputationAndGrowIncrementally) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  auto t = Tokens(1000, 1);
  auto want = keys::ComputeChunkHashes(t, 256);
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
  EXPECT_EQ(*hb, *keys::ComputeChunkHashes(b, 256));
}

TEST(SessionTable, TooFewTokensAndOutOfRangeTokensAreErrors) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  EXPECT_FALSE(s.ChunkHashes("r", Tokens(300, 1), 2).ok());
  auto t = Tokens(256, 1);
  t[7] = int64_t{1} << 33;
  EXPECT_FALSE(s.ChunkHashes("r", t, 1).ok());
  t[7] = -1;
  EXPECT_FALSE(s.ChunkHashes("q", t, 1).ok());
}

TEST(SessionTable, LookupResultIsTakenOnce) {
  FakeClock clock;
  SessionTable s(&clock, 256, 600);
  EXPECT_FALSE(s.TakeLookupResult("r").has_value());
  s.SetLookupResult("r", 3);
  EXPECT_EQ(s.PeekLookupResult("r"), 3);
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
