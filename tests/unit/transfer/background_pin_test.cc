// BackgroundPin (issue 26 item 4): pinning kvd's L1 for GPU copies never blocks the caller,
// and a pinned range is unpinned exactly once, after the pin returned. The pin and unpin calls
// are fakes here (cudaHostRegister / cudaHostUnregister in the CUDA runtime).
#include "transfer/cuda/background_pin.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

namespace kvd::transfer::cuda {
namespace {

using namespace std::chrono_literals;
using State = BackgroundPin::State;

TEST(BackgroundPinTest, ReturnsAtOnceWhileThePinRunsThenReportsPinned) {
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> unpins{0};
  auto started = std::chrono::steady_clock::now();
  {
    BackgroundPin pin([gate] { gate.wait(); return true; }, [&] { ++unpins; });
    // The constructor did not wait for the (blocked) pin.
    EXPECT_LT(std::chrono::steady_clock::now() - started, 1s);
    EXPECT_EQ(pin.state(), State::kPinning);
    EXPECT_FALSE(pin.pinned());
    EXPECT_FALSE(pin.WaitDone(20ms));
    release.set_value();
    EXPECT_TRUE(pin.WaitDone(10s));
    EXPECT_EQ(pin.state(), State::kPinned);
    EXPECT_TRUE(pin.pinned());
    EXPECT_EQ(unpins.load(), 0);
  }
  EXPECT_EQ(unpins.load(), 1) << "a pinned range is unpinned once, when the pin goes";
}

TEST(BackgroundPinTest, AFailedPinIsPageableAndNeverUnpinned) {
  std::atomic<int> unpins{0};
  {
    BackgroundPin pin([] { return false; }, [&] { ++unpins; });
    EXPECT_TRUE(pin.WaitDone(10s));
    EXPECT_EQ(pin.state(), State::kFailed);
    EXPECT_STREQ(BackgroundPinStateName(pin.state()), "pageable");
  }
  EXPECT_EQ(unpins.load(), 0);
}

TEST(BackgroundPinTest, DestroyedWhilePinningWaitsForThePinThenUnpins) {
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> pin_returned{false};
  std::atomic<bool> unpinned_after_pin{false};
  auto pin = std::make_unique<BackgroundPin>(
      [gate, &pin_returned] {
        gate.wait();
        pin_returned = true;
        return true;
      },
      [&] { unpinned_after_pin = pin_returned.load(); });
  auto destroyed = std::async(std::launch::async, [&] { pin.reset(); });
  EXPECT_EQ(destroyed.wait_for(50ms), std::future_status::timeout) << "it waits for the pin";
  release.set_value();
  destroyed.get();
  EXPECT_TRUE(unpinned_after_pin.load()) << "unpinned, and only after the pin returned";
}

}  // namespace
}  // namespace kvd::transfer::cuda
