// TierSet's internal state, shared by tier_set.cc, tier_prefetch.cc and tier_eviction.cc.
#pragma once

#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "l2/tier_index.h"
#include "l2/tier_set.h"

namespace kvd::l2 {

struct TierSet::TierState {
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
  // object written or found; a load starting (busy_delta +1) or ending (-1).
  void AccountLocked(const ObjectKey& key, uint64_t bytes) KVD_REQUIRES(mu);
  void BusyLocked(const ObjectKey& key, int busy_delta) KVD_REQUIRES(mu);
};

struct TierSet::StoreBatch {
  TierSet* set = nullptr;
  std::vector<CommittedObject> objects;
  std::vector<l1::ReadPin> pins;        // parallel to objects
  // Per object: some tier holds it. Set by the tiers' callbacks (each under its own tier's
  // mutex, so concurrently: one byte per object, atomic), read after the last one.
  std::unique_ptr<std::atomic<bool>[]> stored;
  std::vector<std::shared_ptr<std::vector<std::vector<uint8_t>>>> encoded;  // serde forms
  std::atomic<int> remaining{0};        // tiers that have not answered
  void TierDone();
};

struct TierSet::PrefetchJob {
  PrefetchRequest req;
  std::function<void(PrefetchAnswer)> done;
  std::atomic<bool> answered{false};
  int64_t deadline_ns = 0;
  size_t chunks = 0;
  uint32_t ranks = 0;
  std::vector<ObjectKey> keys;                 // chunk c, rank r at c * ranks + r
  std::vector<std::vector<uint8_t>> found;     // per tier, per object: kPresent, kAbsent, kUnknown
  std::vector<uint64_t> found_bytes;           // per object: size a tier reported (0: unknown)
  std::atomic<int> pending{0};                 // tier calls not answered
  std::vector<int> source;                     // per object: tier, kInL1, or kNone
  std::vector<l1::WriteReservation> res;       // per object (empty when not loaded)
  std::vector<std::vector<uint8_t>> staging;   // per object, for serdes that transform
  std::vector<Status> load_status;             // per object
  std::vector<uint64_t> load_bytes;            // per object: stored size the tier read
  size_t planned = 0;                          // chunks planned for loading
  // The chunk the plan stopped at because one of its objects is neither in L1 nor in any
  // tier (every tier answered kAbsent); SIZE_MAX when the plan stopped for another reason.
  size_t in_no_tier = SIZE_MAX;
  // Guards the writes of found / load_status by concurrent tier callbacks; they are read
  // without it once `pending` reached 0, so not KVD_GUARDED_BY.
  Mutex mu;
  // Its own loads done and committed (OnLoaded): per planned chunk, whether its own objects
  // arrived (objects it waits for from other jobs are checked in Finish).
  std::vector<uint8_t> chunk_loaded;
  // Chunks another job was loading when this one planned (source kFollow): this job answers
  // only once those jobs' loads are committed. following = jobs followed and not done + 1
  // (this job's own loads); Finish runs when it drops to 0.
  std::atomic<int> following{1};
  std::vector<const PrefetchJob*> followed;    // planning thread only
  // Guarded by TierSet::loading_mu_ (a comment, not KVD_GUARDED_BY: the lock is the
  // TierSet's and a job has no pointer to it the analysis could name):
  std::vector<l1::ChunkKey> loading;           // chunks registered in TierSet::loading_
  std::vector<std::shared_ptr<PrefetchJob>> followers;  // jobs waiting for this one's loads
  bool loads_done = false;                     // set with the followers taken
  // found[tier][object]: the tier's answer to the existence check.
  static constexpr uint8_t kAbsent = 0;        // "not found"
  static constexpr uint8_t kPresent = 1;
  static constexpr uint8_t kUnknown = 2;       // an error, or no answer for the object
  static constexpr int kInL1 = -2;
  static constexpr int kNone = -1;
  static constexpr int kFollow = -3;           // being loaded into L1 by another job
};

}  // namespace kvd::l2
