// LookupResults: a request's result goes through the states of lookup_result.h, and every
// event a parked WAIT_PREFETCH_STATUS must see moves the change counter (a prefetch's end
// also runs the wakeup).
#include "server/lookup_results.h"

#include <gtest/gtest.h>

#include "common/clock.h"

namespace kvd::server {
namespace {

TEST(LookupResultsTest, StatesChangesAndWakeup) {
  FakeClock clock;
  SessionTable sessions(&clock, 256, 60);
  LookupResults r(&sessions);
  int wakeups = 0;
  r.SetWakeup([&] { ++wakeups; });
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(0));  // nothing pending: 0
  uint64_t seen = r.changes();

  r.Set("a", 3);
  EXPECT_GT(r.changes(), seen);
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(3));
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(0));  // taken once

  const uint64_t g = r.Begin("a");
  EXPECT_TRUE(r.Running("a"));
  EXPECT_TRUE(r.Current("a", g));
  EXPECT_EQ(r.Take("a"), std::nullopt);  // still running
  seen = r.changes();
  EXPECT_TRUE(r.Finish("a", g, 5));
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
  sessions.End("a");
  r.SessionEnded();
  EXPECT_GT(r.changes(), seen);
  EXPECT_FALSE(r.Finish("a", g2, 2));
  EXPECT_EQ(r.Take("a"), std::optional<int64_t>(0));

  r.SetWakeup(nullptr);
  r.PrefetchEnded();
  EXPECT_EQ(wakeups, 1);
}

}  // namespace
}  // namespace kvd::server
