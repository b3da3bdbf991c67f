// StoreBehind: writes objects just committed to L1 to every tier that stores
// (Tier::stores(); a P2P peer tier does not), without ever making a STORE wait. Submit pins
// the objects (l1::ReadPin), hands one batch to each tier and returns at once; the pins go
// when the last tier answered. Each tier has a budget of bytes and batches in flight, and a
// tier with a declared capacity never takes an object that would put it over (issue 27,
// finding 3): an object that does not fit is not written to that tier and is counted
// (skipped, or no space) — a slow or dead tier costs skipped writes, never a stalled STORE or
// unbounded memory. With skip_l1, the batch's outcome goes to SkipL1Chunks.
//
// Threads: Submit is thread-safe; the tiers' callbacks run on tier threads and take only the
// tier's own mutex. Ownership: borrows everything it is built with; the TierSet that owns it
// keeps them alive until every tier call has answered (TierCalls).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/clock.h"
#include "l1/l1_cache.h"
#include "l2/skip_l1_chunks.h"
#include "l2/tier_types.h"
#include "l2/tier_state.h"

namespace kvd::l2 {

class StoreBehind {
 public:
  struct Budget {
    uint64_t max_inflight_bytes = 1ull << 30;  // per tier: bytes pinned for its writes
    uint32_t max_inflight_batches = 64;        // per tier
  };
  // `skip_l1`: null unless the store policy is skip_l1.
  StoreBehind(Budget budget, const Clock* clock, l1::L1Cache* l1,
              std::span<const std::unique_ptr<TierState>> tiers, TierCalls* calls, SkipL1Chunks* skip_l1)
      : budget_(budget), clock_(clock), l1_(l1), tiers_(tiers), calls_(calls), skip_l1_(skip_l1) {}

  void Submit(std::vector<CommittedObject> objects, const ObjectFormat& format);
  // Later Submits write nothing (TierSet::Close).
  void Close() { closed_.store(true); }

 private:
  struct Batch;
  // Hands tier `t` its part of `batch`: the objects within its budget, encoded by its serde.
  void StoreTo(TierState& t, const std::shared_ptr<Batch>& batch, const ObjectFormat& format);

  const Budget budget_;
  const Clock* const clock_;
  l1::L1Cache* const l1_;
  const std::span<const std::unique_ptr<TierState>> tiers_;
  TierCalls* const calls_;
  SkipL1Chunks* const skip_l1_;
  std::atomic<bool> closed_{false};
};

}  // namespace kvd::l2
