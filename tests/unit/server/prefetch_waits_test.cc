#include "server/prefetch_waits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace kvd::server {
namespace {

using Waits = PrefetchWaits<int>;
constexpr int64_t kSecond = 1'000'000'000;

// Issue 11, finding 10: WAIT_PREFETCH_STATUS ignored its timeout. The deadline a client's
// timeout gives: NaN, 0 and negatives wait not at all; huge ones at most kMaxWaitSeconds.
TEST(PrefetchWaits, Finding10DeadlineFollowsTheTimeoutWithinTheCap) {
  const int64_t now = 1000 * kSecond;
  EXPECT_EQ(Waits::DeadlineNs(now, 0.25), now + kSecond / 4);
  EXPECT_EQ(Waits::DeadlineNs(now, 0), now);
  EXPECT_EQ(Waits::DeadlineNs(now, -5), now);
  EXPECT_EQ(Waits::DeadlineNs(now, std::nan("")), now);
  const int64_t cap = now + static_cast<int64_t>(Waits::kMaxWaitSeconds) * kSecond;
  EXPECT_EQ(Waits::DeadlineNs(now, 1e300), cap);
  EXPECT_EQ(Waits::DeadlineNs(now, std::numeric_limits<double>::infinity()), cap);
}

// A wait is answered when its prefetch stops running or its deadline passes, once, in the
// order waits were parked; the others stay.
TEST(PrefetchWaits, Finding10AnswersWhenThePrefetchEndsOrTheDeadlinePasses) {
  Waits w;
  std::set<std::string> running = {"a", "b", "c"};
  ASSERT_TRUE(w.Park("conn", "a", 10 * kSecond, 1));
  ASSERT_TRUE(w.Park("conn", "b", 5 * kSecond, 2));
  ASSERT_TRUE(w.Park("conn", "c", 20 * kSecond, 3));
  EXPECT_EQ(w.NextDeadlineNs(), 5 * kSecond);
  std::vector<int> answered;
  auto is_running = [&](std::string_view id) { return running.count(std::string(id)) > 0; };
  auto answer = [&](std::string_view, int e) { answered.push_back(e); };
  w.AnswerReady(1 * kSecond, is_running, answer);
  EXPECT_TRUE(answered.empty());
  running.erase("c");  // c's prefetch ended
  w.AnswerReady(2 * kSecond, is_running, answer);
  EXPECT_EQ(answered, std::vector<int>({3}));
  EXPECT_EQ(w.NextDeadlineNs(), 5 * kSecond);
  w.AnswerReady(5 * kSecond, is_running, answer);  // b's deadline: answered, still running
  EXPECT_EQ(answered, std::vector<int>({3, 2}));
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.NextDeadlineNs(), 10 * kSecond);
  w.AnswerReady(INT64_MAX, is_running, answer);  // shutdown: everything
  EXPECT_EQ(answered, std::vector<int>({3, 2, 1}));
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.NextDeadlineNs(), INT64_MAX);
}

// A client cannot park without bound: per connection and in all.
TEST(PrefetchWaits, Finding10ParkedWaitsAreBoundedPerConnection) {
  Waits w;
  for (size_t i = 0; i < Waits::kMaxPerConnection; ++i) {
    ASSERT_TRUE(w.Park("flood", "r" + std::to_string(i), kSecond, 0));
  }
  int e = 7;
  EXPECT_FALSE(w.Park("flood", "one-more", kSecond, std::move(e)));
  EXPECT_TRUE(w.Park("other", "r", kSecond, 1));  // another connection still parks
  w.AnswerReady(kSecond, [](std::string_view) { return true; }, [](std::string_view, int) {});
  EXPECT_TRUE(w.empty());
  EXPECT_TRUE(w.Park("flood", "again", 2 * kSecond, 2));  // answered waits free their places
}

}  // namespace
}  // namespace kvd::server
