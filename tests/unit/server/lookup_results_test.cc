// LookupResults: a request's result goes through the states of lookup_result.h, every event a
// parked WAIT_PREFETCH_STATUS must see moves the change counter (a prefetch's end also runs
// the wakeup), and the entries keep to their own bounds (count, bytes, TTL).
#include "server/lookup_results.h"

#include <gtest/gtest.h>

#include <string>

#include "common/clock.h"

namespace kvd::server {
namespace {

TEST(LookupResultsTest, StatesChangesAndWakeup) {
  FakeClock clock;
  LookupResults r(&clock, {});
  int wakeups = 0;
  r.SetWakeup([&] { ++wakeups; });
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(0));  // nothing pending: 0
  uint64_t seen = r.changes();

  r.Set("a", 3);
  EXPECT_GT(r.changes(), seen);
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(3));
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(0));  // taken once
  EXPECT_EQ(r.size(), 0u);                            // and the entry went with it

  const uint64_t g = r.Begin("a");
  EXPECT_TRUE(r.Running("a"));
  EXPECT_TRUE(r.Current("a", g));
  EXPECT_EQ(r.Take("a"), std::nullopt);  // still running
  seen = r.changes();
  EXPECT_TRUE(r.Finish("a", g, 5));
  EXPECT_FALSE(r.Finish("a", g, 6));  // finished once
  r.PrefetchEnded();
  EXPECT_GT(r.changes(), seen);
  EXPECT_EQ(wakeups, 1);
  EXPECT_FALSE(r.Running("a"));
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(5));

  // A later lookup supersedes a running one: the first's Finish records nothing.
  const uint64_t g1 = r.Begin("a");
  r.Set("a", 7);
  EXPECT_FALSE(r.Current("a", g1));
  EXPECT_FALSE(r.Finish("a", g1, 1));
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(7));

  // The session's end is a change (its waiter answers), and the result goes with it.
  const uint64_t g2 = r.Begin("a");
  seen = r.changes();
  r.SessionEnded("a");
  EXPECT_GT(r.changes(), seen);
  EXPECT_FALSE(r.Running("a"));
  EXPECT_FALSE(r.Finish("a", g2, 2));
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(0));

  r.SetWakeup(nullptr);
  r.PrefetchEnded();
  EXPECT_EQ(wakeups, 1);
}

// A generation is never drawn twice, even for a request id whose entry went and came back:
// a completion of the lookup before END_SESSION cannot finish the one after it (the
// Lookups-level regression is LookupsTest.StalePrefetchAfterEndSessionLeavesTheNextLookupAlone).
TEST(LookupResultsTest, AReusedRequestIdGetsNewGenerations) {
  FakeClock clock;
  LookupResults r(&clock, {});
  const uint64_t before = r.Begin("b");
  r.SessionEnded("b");
  const uint64_t after = r.Begin("b");
  EXPECT_NE(before, after);
  EXPECT_FALSE(r.Current("b", before));
  EXPECT_FALSE(r.Finish("b", before, 9));
  EXPECT_TRUE(r.Running("b"));
  EXPECT_TRUE(r.Finish("b", after, 1));
  EXPECT_EQ(r.Take("b"), std::optional<int64_t>(1));
}

// At most max_results entries: a new request beyond drops the least recently used other
// (a running one too: its Finish then records nothing), counts it and wakes its waiter.
TEST(LookupResultsTest, TheCountBoundDropsTheLeastRecentlyUsed) {
  FakeClock clock;
  LookupResults r(&clock, {.max_results = 2});
  const uint64_t g = r.Begin("old");
  r.Set("mid", 1);
  ASSERT_TRUE(r.Current("old", g));
  ASSERT_TRUE(r.Finish("old", g, 4));  // "old" is now the most recently used
  const uint64_t seen = r.changes();
  const uint64_t g_new = r.Begin("new");  // Begin counts no change of its own: the drop does
  EXPECT_GT(r.changes(), seen);
  EXPECT_EQ(r.size(), 2u);
  EXPECT_EQ(r.evicted(), 1u);
  EXPECT_EQ(r.Take("mid"), std::optional<int64_t>(0));  // dropped
  EXPECT_EQ(r.Take("old"), std::optional<int64_t>(4));
  ASSERT_TRUE(r.Finish("new", g_new, 2));
  EXPECT_EQ(r.Take("new"), std::optional<int64_t>(2));

  const uint64_t running = r.Begin("x");
  r.Set("y", 1);
  r.Set("z", 1);  // drops "x" while it runs
  EXPECT_FALSE(r.Running("x"));
  EXPECT_FALSE(r.Finish("x", running, 3));
  EXPECT_EQ(r.evicted(), 2u);
}

// At most max_bytes: a long request id counts its length.
TEST(LookupResultsTest, TheByteBoundCountsTheRequestIds) {
  FakeClock clock;
  LookupResults r(&clock, {.max_bytes = 4096});
  const std::string long_id(1000, 'x');
  for (char c = 'a'; c <= 'h'; ++c) r.Set(std::string(1, c) + long_id, 1);
  EXPECT_LE(r.bytes(), 4096u);
  EXPECT_GE(r.size(), 3u);
  EXPECT_LT(r.size(), 8u);
  EXPECT_EQ(r.evicted(), 8u - r.size());
  EXPECT_EQ(r.Take("h" + long_id), std::optional<int64_t>(1));  // the newest is kept
  EXPECT_EQ(r.Take("a" + long_id), std::optional<int64_t>(0));  // the oldest is not
}

// An entry untouched for the TTL expires (a running one too); one set later does not.
TEST(LookupResultsTest, IdleEntriesExpire) {
  FakeClock clock;
  LookupResults r(&clock, {.ttl_seconds = 60});
  r.Set("idle", 1);
  const uint64_t g = r.Begin("running");
  clock.AdvanceSeconds(40);
  r.Set("kept", 2);
  clock.AdvanceSeconds(30);
  const uint64_t seen = r.changes();
  EXPECT_EQ(r.Expire(), 2u);
  EXPECT_GT(r.changes(), seen);
  EXPECT_EQ(r.size(), 1u);
  EXPECT_FALSE(r.Finish("running", g, 5));
  EXPECT_EQ(r.Take("idle"), std::optional<int64_t>(0));
  EXPECT_EQ(r.Take("kept"), std::optional<int64_t>(2));
  EXPECT_EQ(r.evicted(), 0u);  // expiry is not eviction
}

// A client polling a running prefetch (QUERY_PREFETCH_STATUS: Take; WAIT_PREFETCH_STATUS:
// Running) keeps its entry past the TTL, as it kept the session before; one nobody asks about
// expires.
TEST(LookupResultsTest, PollingARunningLookupKeepsIt) {
  FakeClock clock;
  LookupResults r(&clock, {.ttl_seconds = 60});
  const uint64_t taken = r.Begin("taken");
  const uint64_t waited = r.Begin("waited");
  const uint64_t idle = r.Begin("idle");
  for (int i = 0; i < 3; ++i) {
    clock.AdvanceSeconds(40);
    EXPECT_EQ(r.Take("taken"), std::nullopt);
    EXPECT_TRUE(r.Running("waited"));
    r.Expire();
  }
  EXPECT_FALSE(r.Finish("idle", idle, 1));
  EXPECT_TRUE(r.Finish("taken", taken, 2));
  EXPECT_TRUE(r.Finish("waited", waited, 3));
  EXPECT_EQ(r.Take("taken"), std::optional<int64_t>(2));
  EXPECT_EQ(r.Take("waited"), std::optional<int64_t>(3));
}

}  // namespace
}  // namespace kvd::server
