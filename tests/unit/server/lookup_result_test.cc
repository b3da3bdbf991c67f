// LookupResult's state diagram (server/lookup_result.h), edge by edge. The generations are
// the owner's to draw (LookupResults draws them from one counter); here they are literals.
#include "server/lookup_result.h"

#include <gtest/gtest.h>

namespace kvd::server {
namespace {

TEST(LookupResultTest, NoneTakesNothing) {
  LookupResult r;
  EXPECT_FALSE(r.running());
  EXPECT_EQ(r.Take(), std::nullopt);
}

TEST(LookupResultTest, SetIsTakenOnce) {
  LookupResult r;
  r.Set(1, 3);
  EXPECT_FALSE(r.running());
  EXPECT_EQ(r.Take(), 3);
  EXPECT_EQ(r.Take(), std::nullopt);
}

TEST(LookupResultTest, BeginRunsUntilItsFinish) {
  LookupResult r;
  r.Set(1, 9);  // an older answer nobody took
  const uint64_t g = 2;
  r.Begin(g);
  EXPECT_TRUE(r.running());
  EXPECT_TRUE(r.Current(g));
  EXPECT_EQ(r.Take(), std::nullopt);  // running: nothing to take, and nothing changes
  EXPECT_TRUE(r.running());
  EXPECT_TRUE(r.Finish(g, 5));
  EXPECT_FALSE(r.running());
  EXPECT_FALSE(r.Current(g));
  EXPECT_FALSE(r.Finish(g, 6));  // finished once
  EXPECT_EQ(r.Take(), 5);
}

TEST(LookupResultTest, ALaterLookupSupersedesARunningOne) {
  LookupResult r;
  const uint64_t g1 = 1, g2 = 2;
  r.Begin(g1);
  r.Begin(g2);
  EXPECT_FALSE(r.Current(g1));
  EXPECT_FALSE(r.Finish(g1, 7));  // late: ignored
  EXPECT_TRUE(r.running());
  EXPECT_TRUE(r.Finish(g2, 2));
  EXPECT_EQ(r.Take(), 2);

  const uint64_t g3 = 3;
  r.Begin(g3);
  r.Set(4, 4);  // answered at once: the running one's Finish is ignored
  EXPECT_FALSE(r.running());
  EXPECT_FALSE(r.Finish(g3, 8));
  EXPECT_EQ(r.Take(), 4);
}

}  // namespace
}  // namespace kvd::server
