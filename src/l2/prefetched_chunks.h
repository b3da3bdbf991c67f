// PrefetchedChunks: the chunks a prefetch brought into L1 under lmcache's default prefetch
// policy, which leave L1 once their readers are done: right after the retrieve that read them
// (AfterRetrieve), or, for chunks no retrieve came for, at the control loop's sweep once they
// are older than a grace period (a lookup read-locks its chunks just after they are
// committed). A chunk still read-locked or pinned stays recorded until a later try removes it.
//
// Threads: every method is thread-safe (one mutex, never held across an L1 call).
// Ownership: borrows the cache and the clock; both must outlive this object.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>

#include "common/clock.h"
#include "common/mutex.h"
#include "l1/l1_cache.h"

namespace kvd::l2 {

class PrefetchedChunks {
 public:
  static constexpr int64_t kGraceNs = 2'000'000'000;

  PrefetchedChunks(l1::L1Cache* l1, const Clock* clock) : l1_(l1), clock_(clock) {}

  // Chunks a prefetch just committed to L1.
  void Add(std::span<const l1::ChunkKey> committed) KVD_EXCLUDES(mu_);
  // Chunks a retrieve just read: the recorded ones among them leave L1 if idle. Cheap when
  // none is recorded.
  void AfterRetrieve(std::span<const l1::ChunkKey> chunks) KVD_EXCLUDES(mu_);
  // Removes the recorded chunks older than kGraceNs that are idle.
  void Sweep() KVD_EXCLUDES(mu_);
  size_t size() const KVD_EXCLUDES(mu_);

 private:
  // Tries to remove `keys` from L1; the record goes with the chunk.
  void Remove(const std::vector<l1::ChunkKey>& keys) KVD_EXCLUDES(mu_);

  l1::L1Cache* const l1_;
  const Clock* const clock_;
  mutable Mutex mu_;
  // Recorded chunk -> when it was committed.
  std::unordered_map<l1::ChunkKey, int64_t, l1::ChunkKeyHash> added_ns_ KVD_GUARDED_BY(mu_);
};

}  // namespace kvd::l2
