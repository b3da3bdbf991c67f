// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with the Clang
// thread-safety annotations (common/thread_annotations.h) that std:: types lack, so that
// fields can say which lock guards them and the clang build can check it. SharedMutex with
// ReaderMutexLock / WriterMutexLock: the same for std::shared_mutex (a field guarded by one is
// read under either lock and written under the writer's).
//
// Mutex is not recursive. MutexLock holds it for one scope. CondVar::Wait must be called with
// the mutex held, releases it while waiting and holds it again when it returns.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/thread_annotations.h"

namespace kvd {

class KVD_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KVD_ACQUIRE() { mu_.lock(); }
  void Unlock() KVD_RELEASE() { mu_.unlock(); }
  bool TryLock() KVD_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds the mutex (where it cannot see it, e.g. a callback).
  void AssertHeld() const KVD_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class KVD_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KVD_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() KVD_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A MutexLock that can be released before its scope ends and taken again (Unlock, Lock),
// like std::unique_lock: the destructor unlocks only if it holds the mutex.
class KVD_SCOPED_CAPABILITY ReleasableMutexLock {
 public:
  explicit ReleasableMutexLock(Mutex* mu) KVD_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~ReleasableMutexLock() KVD_RELEASE() {
    if (held_) mu_->Unlock();
  }
  ReleasableMutexLock(const ReleasableMutexLock&) = delete;
  ReleasableMutexLock& operator=(const ReleasableMutexLock&) = delete;

  void Lock() KVD_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }
  void Unlock() KVD_RELEASE() {
    held_ = false;
    mu_->Unlock();
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

class KVD_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() KVD_ACQUIRE() { mu_.lock(); }
  void Unlock() KVD_RELEASE() { mu_.unlock(); }
  void LockShared() KVD_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() KVD_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class KVD_SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) KVD_ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderMutexLock() KVD_RELEASE() { mu_->UnlockShared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class KVD_SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) KVD_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() KVD_RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class CondVar {
 public:
  void Wait(Mutex* mu) KVD_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Returns false on timeout.
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) KVD_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // Waits at most until `deadline`; false (without waiting) once it has passed. For loops of
  // the form `while (!ready) if (!cv.WaitUntil(&mu, deadline)) return timed_out;`.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline) KVD_REQUIRES(mu) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    WaitFor(mu, deadline - now);
    return true;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kvd
