// TaskPool lanes: order, parallelism limits and fairness between lanes. Regression test for
// "one flooding client stalls everyone": pool ops used to share one FIFO, so a client with
// thousands of requests queued delayed another client's LOOKUP by its whole backlog
// (1.5–2.4 s measured with tests/integration/test_faults.py's flood at window 1024).
#include "server/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace kvd::server {
namespace {

using namespace std::chrono_literals;

TEST(TaskPoolFairness, AFloodedLaneDelaysAnotherLaneByAFewTasksOnly) {
  std::atomic<int> flood_done{0};
  std::atomic<int> done_before_victim{-1};
  std::atomic<bool> victim_ran{false};
  {
    TaskPool pool(2);
    for (int i = 0; i < 400; ++i) {
      pool.PostToLane("flooder/pool", [&] {
        std::this_thread::sleep_for(1ms);
        flood_done.fetch_add(1);
      }, 2);
    }
    std::this_thread::sleep_for(5ms);
    const int before_post = flood_done.load();
    pool.PostToLane("victim/pool", [&] {
      done_before_victim = flood_done.load();
      victim_ran = true;
    }, 2);
    for (int i = 0; i < 2000 && !victim_ran.load(); ++i) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(victim_ran.load()) << "victim task never ran";
    // Two threads, the flooder has at most 2 runners queued ahead of the victim.
    EXPECT_LE(done_before_victim.load() - before_post, 6);
  }
  EXPECT_EQ(flood_done.load(), 400);  // the destructor ran every queued task
}

TEST(TaskPoolFairness, SerialLaneKeepsOrderAndNeverOverlaps) {
  std::vector<int> order;
  std::mutex mu;
  std::atomic<int> inside{0}, max_inside{0};
  {
    TaskPool pool(4);
    for (int i = 0; i < 200; ++i) {
      pool.PostToLane("worker", [&, i] {
        int now = inside.fetch_add(1) + 1;
        int m = max_inside.load();
        while (now > m && !max_inside.compare_exchange_weak(m, now)) {
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          order.push_back(i);
        }
        inside.fetch_sub(1);
      });
    }
  }
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(max_inside.load(), 1);
}

TEST(TaskPoolFairness, WideLaneRunsInParallelUpToItsLimit) {
  std::atomic<int> inside{0}, max_inside{0}, done{0};
  {
    TaskPool pool(4);
    for (int i = 0; i < 60; ++i) {
      pool.PostToLane("scheduler/pool", [&] {
        int now = inside.fetch_add(1) + 1;
        int m = max_inside.load();
        while (now > m && !max_inside.compare_exchange_weak(m, now)) {
        }
        std::this_thread::sleep_for(2ms);
        inside.fetch_sub(1);
        done.fetch_add(1);
      }, 2);
    }
  }
  EXPECT_EQ(done.load(), 60);
  EXPECT_LE(max_inside.load(), 2);
  EXPECT_GE(max_inside.load(), 2);  // 60 tasks of 2 ms on 4 threads: they did overlap
}

}  // namespace
}  // namespace kvd::server
