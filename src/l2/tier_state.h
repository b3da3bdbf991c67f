// TierState: one configured tier as the TierSet's parts see it (store-behind, the prefetcher,
// eviction and the admin calls): the tier, its counters, health and object index. TierCalls
// counts the tier calls not answered yet, so that TierSet::Close can wait for every callback
// before the parts they use go away. Internal to l2 (tier_set.h is the public face).
//
// Threads: every field below `mu` is guarded by it; tier callbacks take it briefly. The
// immutable fields above it are set before any tier call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "l2/tier_index.h"
#include "l2/tier_types.h"

namespace kvd::l2 {

// Tier calls in flight: Begin before a call, End as the last thing its callback does.
class TierCalls {
 public:
  void Begin() { n_.fetch_add(1); }
  void End() { n_.fetch_sub(1); }
  uint64_t count() const { return n_.load(); }
  // True once no call is in flight; false after `timeout_s`.
  bool WaitIdle(double timeout_s) const {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (n_.load() > 0) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

 private:
  std::atomic<uint64_t> n_{0};
};

struct TierState {
  // `policy`: the eviction order of the object index (the eviction block's policy; LRU when
  // there is none or it is noop).
  explicit TierState(std::string_view policy) : index(policy) {}

  TierSpec spec;
  std::string name;
  uint64_t capacity = 0;
  std::optional<TierEvictionConfig> eviction;

  Mutex mu;
  TierStats st KVD_GUARDED_BY(mu);                     // counters (sizes and names filled in stats())
  uint32_t inflight_batches KVD_GUARDED_BY(mu) = 0;
  std::string last_error KVD_GUARDED_BY(mu);
  uint64_t last_error_count KVD_GUARDED_BY(mu) = 0;
  // Operations that failed since the last one that succeeded (object-level outcomes such as
  // a missing or corrupt object do not count): the tier's health follows what its writes and
  // reads actually do, whatever its back-end says (issue 27, finding 11).
  uint64_t failures_in_a_row KVD_GUARDED_BY(mu) = 0;
  // The object index of a capacity tier (empty for the others): sizes, loads in progress
  // and eviction order (l2/tier_index.h).
  TierIndex index KVD_GUARDED_BY(mu);
  bool scanned KVD_GUARDED_BY(mu) = false;
  bool evicting KVD_GUARDED_BY(mu) = false;

  // `operational`: the back-end failed (not the object: missing, corrupt).
  void NoteError(const std::string& what, bool operational = true) KVD_REQUIRES(mu);
  void NoteSuccess() KVD_REQUIRES(mu) { failures_in_a_row = 0; }
  // Accounting of the object index (tier_eviction.cc; nothing without a capacity): an
  // object written or found (`chunk`: the L1 chunk slot it holds, when known); a load
  // starting (busy_delta +1) or ending (-1).
  void AccountLocked(const ObjectKey& key, uint64_t bytes, const ChunkSlot* chunk = nullptr)
      KVD_REQUIRES(mu);
  void BusyLocked(const ObjectKey& key, int busy_delta) KVD_REQUIRES(mu);

  // Startup: adds the objects the tier already holds (earlier runs) to the index as the least
  // recent. One Scan call, counted in `calls`.
  void ScanEarlierRuns(TierCalls& calls) KVD_EXCLUDES(mu);
  // One eviction round (the control loop's, once a second): at the trigger watermark, deletes
  // the policy's victims until eviction_ratio x capacity is freed. Nothing without an
  // eviction block or a capacity, or while the last round's deletes are pending. `removed`
  // (may be empty) is given the chunk slots of the deleted objects, on the tier's thread,
  // without `mu` held.
  void Evict(TierCalls& calls, std::function<void(std::vector<ChunkSlot>)> removed) KVD_EXCLUDES(mu);
};

}  // namespace kvd::l2
