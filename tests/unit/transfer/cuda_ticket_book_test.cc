// TicketBook (transfer/cuda/cuda_runtime.h): the completion record of a CUDA engine's copies.
// Plain host code, compiled only where the CUDA engine is (KVD_WITH_CUDA); it needs no GPU,
// so it runs wherever it is built. Wait and Drain block until the ticket completes or the
// timeout passes, whichever comes first; a failure is reported for its own ticket only.
#if KVD_WITH_CUDA
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "transfer/cuda/cuda_runtime.h"

namespace kvd::transfer::cuda {
namespace {

using std::chrono::milliseconds;

TEST(TicketBookTest, PollAndWaitReportEachTicketsOwnEnd) {
  TicketBook book;
  const Ticket a = book.Issue();
  const Ticket b = book.Issue();
  EXPECT_NE(a, b);
  EXPECT_EQ(book.outstanding(), 2u);
  EXPECT_EQ(book.Poll(a).value(), false);
  book.Complete(a, Status::Ok());
  book.Complete(b, Status::Internal("copy failed"));
  EXPECT_EQ(book.Poll(a).value(), true);
  EXPECT_EQ(book.Poll(b).status().message(), "copy failed");
  EXPECT_TRUE(book.Wait(a, milliseconds(0)).ok());
  EXPECT_EQ(book.Wait(b, milliseconds(0)).message(), "copy failed");
  EXPECT_EQ(book.outstanding(), 0u);
  EXPECT_EQ(book.Poll(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(book.Wait(b + 1, milliseconds(0)).code(), StatusCode::kInvalidArgument);
}

TEST(TicketBookTest, WaitAndDrainTimeOutThenWakeOnCompletion) {
  TicketBook book;
  const Ticket t = book.Issue();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(book.Wait(t, milliseconds(30)).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(book.Drain(milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(60));

  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    book.Complete(t, Status::Ok());
  });
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_TRUE(book.Drain(std::chrono::seconds(30)));  // blocks until the completion
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(10));  // woken, not timed out
  EXPECT_TRUE(book.Wait(t, milliseconds(0)).ok());
  completer.join();

  const Ticket u = book.Issue();
  std::thread completer2([&] {
    std::this_thread::sleep_for(milliseconds(50));
    book.Complete(u, Status::Ok());
  });
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_TRUE(book.Wait(u, std::chrono::seconds(30)).ok());  // blocks until the completion
  EXPECT_LT(std::chrono::steady_clock::now() - t2, std::chrono::seconds(10));
  completer2.join();
}

}  // namespace
}  // namespace kvd::transfer::cuda
#endif  // KVD_WITH_CUDA
