// SharedMutex, WriterLock and ReaderLock: a readers-writer lock with the Clang thread-safety
// annotations (common/thread_annotations.h), so that the matcher's fields can say which lock
// guards them and the clang build checks that writers hold it exclusively and readers at
// least shared. Writers go first: a waiting writer stops new readers, so that a steady stream
// of probes (lookup threads) cannot starve registration and removal, which std::shared_mutex
// on glibc allows (it prefers readers). Not recursive, for readers too (a reader that locks
// again while a writer waits deadlocks); a reader must not upgrade. (common/mutex.h has only
// the exclusive Mutex; this one can move there when another module needs it.)
#pragma once

#include <pthread.h>

#include <cstdlib>

#include "common/thread_annotations.h"

// The shared flavours of KVD_REQUIRES / KVD_ACQUIRE (common/thread_annotations.h has only the
// exclusive ones).
#ifndef KVD_REQUIRES_SHARED
#define KVD_REQUIRES_SHARED(...) KVD_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#endif
#ifndef KVD_ACQUIRE_SHARED
#define KVD_ACQUIRE_SHARED(...) KVD_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#endif
#ifndef KVD_RELEASE_SHARED
#define KVD_RELEASE_SHARED(...) KVD_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#endif

namespace kvd::blend {

class KVD_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    if (pthread_rwlock_init(&mu_, &attr) != 0) std::abort();
    pthread_rwlockattr_destroy(&attr);
  }
  ~SharedMutex() { pthread_rwlock_destroy(&mu_); }
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() KVD_ACQUIRE() { Check(pthread_rwlock_wrlock(&mu_)); }
  void Unlock() KVD_RELEASE() { Check(pthread_rwlock_unlock(&mu_)); }
  void LockShared() KVD_ACQUIRE_SHARED() { Check(pthread_rwlock_rdlock(&mu_)); }
  void UnlockShared() KVD_RELEASE_SHARED() { Check(pthread_rwlock_unlock(&mu_)); }
  // Tells the analysis the caller holds the mutex at least shared, where it cannot see it
  // (a callback run under the caller's lock).
  void AssertReaderHeld() const KVD_THREAD_ANNOTATION(assert_shared_capability(this)) {}

 private:
  // The calls fail only on misuse (deadlock detected, too many readers, not held).
  static void Check(int rc) {
    if (rc != 0) std::abort();
  }
  pthread_rwlock_t mu_;
};

// Holds a SharedMutex exclusively for one scope.
class KVD_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) KVD_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() KVD_RELEASE() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex shared for one scope.
class KVD_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) KVD_ACQUIRE_SHARED(mu) : mu_(mu) {
    mu_->LockShared();
  }
  ~ReaderLock() KVD_RELEASE() { mu_->UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace kvd::blend
