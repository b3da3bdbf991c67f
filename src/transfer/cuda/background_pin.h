// BackgroundPin: page-locks a host range (kvd's L1, for the GPU copies' DMA) on a thread of
// its own, so that no registration and no other client waits for it: cudaHostRegister took
// 5.7 s for 24 GiB on an H200 host, ~24 s for the 100 GB L1 of the deployment we aim at
// (issue 26 item 4). Until it is done, GPU copies use the range as pageable memory through
// the engines' device staging: slower, still correct. Plain C++: the pin and unpin calls
// are given (cudaHostRegister / cudaHostUnregister in CudaRuntime::RegisterHost), so the
// lifecycle is tested on machines without a GPU.
//
// Threads: state() and WaitDone() from any thread. The pin call runs once, on the object's
// own thread. The destructor waits for the pin call to return (it cannot be interrupted),
// then calls unpin on the destroying thread if and only if the pin succeeded.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "common/mutex.h"

namespace kvd::transfer::cuda {

class BackgroundPin {
 public:
  enum class State : uint8_t { kPinning, kPinned, kFailed };

  // Starts `pin` (true: the range is pinned) on a new thread; returns at once.
  BackgroundPin(std::function<bool()> pin, std::function<void()> unpin);
  ~BackgroundPin();
  BackgroundPin(const BackgroundPin&) = delete;
  BackgroundPin& operator=(const BackgroundPin&) = delete;

  State state() const;
  bool pinned() const { return state() == State::kPinned; }
  // Waits until the pin call returned; false on timeout.
  bool WaitDone(std::chrono::milliseconds timeout) const;

 private:
  const std::function<void()> unpin_;
  mutable Mutex mu_;
  mutable CondVar done_;  // signalled when state_ leaves kPinning
  State state_ KVD_GUARDED_BY(mu_) = State::kPinning;
  std::thread thread_;  // last: started once everything it touches exists
};

const char* BackgroundPinStateName(BackgroundPin::State s);

}  // namespace kvd::transfer::cuda
