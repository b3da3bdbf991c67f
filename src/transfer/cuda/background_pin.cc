#include "transfer/cuda/background_pin.h"

#include <utility>

namespace kvd::transfer::cuda {

BackgroundPin::BackgroundPin(std::function<bool()> pin, std::function<void()> unpin)
    : unpin_(std::move(unpin)), thread_([this, pin = std::move(pin)] {
        const bool ok = pin();
        {
          MutexLock lock(&mu_);
          state_ = ok ? State::kPinned : State::kFailed;
        }
        done_.NotifyAll();
      }) {}

BackgroundPin::~BackgroundPin() {
  thread_.join();
  if (state() == State::kPinned && unpin_) unpin_();
}

BackgroundPin::State BackgroundPin::state() const {
  MutexLock lock(&mu_);
  return state_;
}

bool BackgroundPin::WaitDone(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (state_ == State::kPinning) {
    if (!done_.WaitUntil(&mu_, deadline)) return state_ != State::kPinning;
  }
  return true;
}

const char* BackgroundPinStateName(BackgroundPin::State s) {
  switch (s) {
    case BackgroundPin::State::kPinning: return "pinning in the background";
    case BackgroundPin::State::kPinned: return "pinned";
    case BackgroundPin::State::kFailed: return "pageable";
  }
  return "?";
}

}  // namespace kvd::transfer::cuda
