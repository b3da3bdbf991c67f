// SkipL1Chunks: lmcache's `skip_l1` store policy. The L1 copy of a chunk is removed once the
// tiers hold the objects of all its slots (every rank's; each rank stores its own object, so
// this may take several store-behind batches, and a chunk one of whose objects was skipped or
// failed stays in L1). It records, per chunk in L1 some of whose slots a tier holds, which
// slots; a complete chunk still busy (read-locked, pinned) is retried by the control loop's
// Sweep, and a record whose chunk L1 let go is dropped there.
//
// Threads: every method is thread-safe (one mutex, never held across an L1 call).
// Ownership: borrows the cache, which must outlive this object.
#pragma once

#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "l1/l1_cache.h"
#include "l2/tier_types.h"

namespace kvd::l2 {

class SkipL1Chunks {
 public:
  explicit SkipL1Chunks(l1::L1Cache* l1) : l1_(l1) {}

  // A store-behind batch ended: `stored[i]` says some tier holds objects[i].
  void Stored(const std::vector<CommittedObject>& objects, const std::atomic<bool>* stored) KVD_EXCLUDES(mu_);
  // Removes the complete chunks that are idle now; drops the records of chunks L1 let go.
  void Sweep() KVD_EXCLUDES(mu_);
  size_t waiting() const KVD_EXCLUDES(mu_);         // chunks recorded
  uint64_t removed() const { return removed_.load(); }  // chunks removed from L1

 private:
  struct Chunk {
    std::vector<bool> slots;  // one per slot of the L1 entry
    uint32_t held = 0;        // slots set
  };

  l1::L1Cache* const l1_;
  std::atomic<uint64_t> removed_{0};
  mutable Mutex mu_;
  std::unordered_map<l1::ChunkKey, Chunk, l1::ChunkKeyHash> chunks_ KVD_GUARDED_BY(mu_);
};

}  // namespace kvd::l2
