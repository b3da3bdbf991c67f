// TierSet: the tiers behind L1, in priority order (the order of --l2-adapter flags), and
// what moves objects between them and L1:
//
//   STORE-BEHIND. StoreBehind() is called with objects just committed to L1. It pins them
//   (l1::ReadPin), hands them to every tier that stores (Tier::stores(); a P2P peer tier
//   does not) and returns at once; a STORE's reply never waits
//   for a tier. Each tier has a budget of bytes and batches in flight; an object that does
//   not fit a tier's budget is not written to that tier and is counted as skipped — a slow or
//   dead tier costs skipped writes, never a stalled STORE or unbounded memory. The pin is
//   dropped when the last tier answered. Objects loaded from a tier are not written back.
//   With store_policy skip_l1 the L1 copy of a chunk is removed once tiers hold the objects
//   of all its slots (every rank's; each rank stores its own, so this may take several
//   batches, and a chunk one of whose objects was skipped or failed stays in L1).
//
//   PREFETCH. Prefetch() is called by a LOOKUP for the chunks after its L1 prefix. Every tier
//   is asked which objects it has; each object is planned from the lowest-index tier that has
//   it; the prefix continues while every object (all ranks) of a chunk is somewhere. L1 slots
//   are reserved (l1::WriteReservation) and the tiers load straight into them; a chunk is
//   committed when all its objects arrived intact, and the prefix ends at the first chunk
//   that did not. `done(n)` then reports the n leading chunks now resident in L1 (and
//   PrefetchWithAnswer also whether the chunk after them is in no tier at all). At most
//   prefetch_max_in_flight prefetches run at once (the others wait their turn); a prefetch
//   that takes longer than prefetch_timeout answers with the L1 prefix alone; loads already
//   issued are still committed (or dropped) when the tier answers, and one that has not
//   issued its loads yet issues none. With prefetch_policy
//   default (lmcache's) the chunks loaded for a lookup leave L1 once their readers are done;
//   retain keeps them.
//
//   TIER EVICTION. A tier with max_capacity_gb keeps an index of its objects (sizes, recency),
//   filled at startup by scanning the tier, so objects of earlier runs and of other servers
//   are accounted and evicted too. With an LRU eviction block, once usage reaches
//   trigger_watermark x capacity the least recently used objects are deleted until
//   eviction_ratio x capacity bytes are freed (objects being loaded are skipped). When every
//   tier is indexed, the set can say which L1 chunk slots no tier holds (ChunkInNoTier) and
//   tells on_chunk_slots_gone when a delete takes the last copy of one.
//
// THE PARTS. TierSet composes them and owns what they share (the TierStates and TierCalls):
//   StoreBehind (store_behind.h), Prefetcher (prefetcher.h), each tier's TierState with its
//   object index and eviction round (tier_state.h, tier_index.h: the order of an
//   eviction::EvictionPolicy), PrefetchedChunks (prefetched_chunks.h: the default prefetch
//   policy's chunks) and SkipL1Chunks (skip_l1_chunks.h). TierSet itself validates the
//   options, builds the parts, runs the control thread, closes, and collects the stats.
//
// THREADS. All public methods are thread-safe and never block on a tier. Tier callbacks run
// on tier threads; one control thread of the TierSet runs prefetch timeouts, the removal of
// prefetched chunks and tier eviction. Close() (also the destructor) stops new work, closes
// the tiers and waits for every tier call to answer (a tier that breaks its contract and
// leaves calls unanswered is logged every 30 s while Close waits); it must run before the
// L1 cache is destroyed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/prefetched_chunks.h"
#include "l2/prefetcher.h"
#include "l2/skip_l1_chunks.h"
#include "l2/store_behind.h"
#include "l2/tier_state.h"
#include "l2/tier_types.h"

namespace kvd::l2 {

struct TierSetOptions {
  std::string store_policy = "default";     // default | skip_l1
  std::string prefetch_policy = "default";  // default | retain
  int prefetch_max_in_flight = 8;
  double prefetch_timeout_s = 10;
  // Per tier: objects pinned in L1 waiting for that tier's write.
  uint64_t store_max_inflight_bytes = 1ull << 30;
  uint32_t store_max_inflight_batches = 64;
  bool scan_at_start = true;                // account objects of earlier runs (capacity tiers)
  const Clock* clock = nullptr;             // required
  // Told of chunk slots whose last indexed copy a tier deleted (an eviction round or an
  // operator delete), when every tier is indexed (ChunkInNoTier): the blend matcher's
  // synchronous removal. Runs on a tier thread, no lock of the set held. May be empty.
  std::function<void(std::span<const ChunkSlot>)> on_chunk_slots_gone;
};

class TierSet {
 public:
  // `l1` must outlive the TierSet (Close it first). Tiers are used in `tiers` order.
  static Result<std::unique_ptr<TierSet>> Create(const TierSetOptions& options,
                                                 std::vector<TierSpec> tiers, l1::L1Cache* l1);
  ~TierSet();
  TierSet(const TierSet&) = delete;
  TierSet& operator=(const TierSet&) = delete;

  size_t size() const { return tiers_.size(); }

  // A tier whose last this-many operations failed (writes, existence checks, loads; a
  // missing or corrupt object is not a failure of the tier) is reported unhealthy with the
  // last error, whatever its back-end says (a Redis refusing every write with NOAUTH still
  // "connects"), until an operation succeeds again.
  static constexpr uint64_t kUnhealthyAfterFailures = 8;

  void StoreBehind(std::vector<CommittedObject> objects, const ObjectFormat& format);

  // `done(n)` runs exactly once (on a tier thread or the control thread, or inline when
  // nothing is to be done), n = leading chunks of the request now resident in L1.
  void Prefetch(PrefetchRequest request, std::function<void(size_t)> done);
  // The same, answering a PrefetchAnswer (`done` runs exactly once, as above).
  void PrefetchWithAnswer(PrefetchRequest request, std::function<void(PrefetchAnswer)> done);

  // Chunks a retrieve just read: prefetched chunks among them leave L1 if idle (default
  // prefetch policy). Cheap when there are none.
  void AfterRetrieve(std::span<const l1::ChunkKey> chunks);

  TierSetStats stats() const;

  // Whether some slot in [0, slots) of `chunk` is known to be in no tier: every tier is
  // indexed (it stores, and has a capacity: kvd indexes what it holds and deletes it itself)
  // and no tier's index holds that slot. False whenever a tier cannot tell (no capacity, so
  // no index; a peer tier). An object another server wrote after the startup scan, or one
  // only the scan saw, is not known to hold a slot: the answer errs towards "in no tier".
  // Takes each tier's mutex briefly (lock order: an L1 shard mutex, then these).
  bool ChunkInNoTier(const l1::ChunkKey& chunk, uint32_t slots) const;

  // Operator calls (GET / DELETE /cache/objects), tier_admin.cc; `index` < size() (else
  // InvalidArgument, inline). ListObjects: every object tier `index` holds (Tier::Scan).
  // DeleteObjects: removes `keys` from the tier and from its accounting; one result per key
  // (bytes > 0: it was there). `done` runs once, on a tier thread (inline after Close()).
  void ListObjects(size_t index, Tier::ScanDone done);
  void DeleteObjects(size_t index, std::vector<ObjectKey> keys, Tier::Done done);
  // The configuration of tier `index` (< size()).
  const AdapterConfig& adapter_config(size_t index) const;
  // Waits until no tier call is in flight: writes, existence checks, loads, deletes, scans
  // (tests, benchmarks, shutdown).
  bool WaitIdle(double timeout_s);
  void Close() KVD_EXCLUDES(control_mu_);

 private:
  explicit TierSet(const TierSetOptions& options);
  void ControlLoop(int64_t start_ns) KVD_EXCLUDES(control_mu_);  // once-a-second work from start_ns + 1 s
  // Objects holding `slots` left a tier: those no tier holds any more go to
  // options_.on_chunk_slots_gone (when every tier is indexed). No tier mutex held.
  void SlotsLeftATier(std::vector<ChunkSlot> slots) const;
  // Some tier's index holds `slot` (takes each tier's mutex in turn).
  bool SlotHeld(const ChunkSlot& slot) const;

  bool every_tier_indexed_ = false;  // set by Create, then constant

  const TierSetOptions options_;
  std::vector<std::unique_ptr<TierState>> tiers_;
  TierCalls calls_;  // every part's tier calls: Close waits for them
  // The parts, built once the tiers are (Create); they borrow tiers_ and calls_.
  std::unique_ptr<PrefetchedChunks> prefetched_;  // the default prefetch policy; null: retain
  std::unique_ptr<SkipL1Chunks> skip_l1_;         // the skip_l1 store policy; null: default
  std::unique_ptr<l2::StoreBehind> store_;  // (qualified: StoreBehind() is a method)
  std::unique_ptr<Prefetcher> prefetcher_;

  // The control thread: prefetch timeouts (every 50 ms); prefetched-chunk removal, skip_l1
  // removal and tier eviction (every second).
  Mutex control_mu_;
  CondVar control_cv_;
  bool stop_control_ KVD_GUARDED_BY(control_mu_) = false;
  std::thread control_;
};

}  // namespace kvd::l2
