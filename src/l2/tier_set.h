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
//   eviction_ratio x capacity bytes are freed (objects being loaded are skipped).
//
// THREADS. All public methods are thread-safe and never block on a tier. Tier callbacks run
// on tier threads; one control thread of the TierSet runs prefetch timeouts, the removal of
// prefetched chunks and tier eviction. Close() (also the destructor) stops new work, closes
// the tiers and waits for every tier call to answer (a tier that breaks its contract and
// leaves calls unanswered is logged every 30 s while Close waits); it must run before the
// L1 cache is destroyed.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/adapter_config.h"
#include "l2/object_key.h"
#include "l2/serde.h"
#include "l2/tier.h"

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
};

// One configured tier.
struct TierSpec {
  AdapterConfig config;
  std::shared_ptr<Tier> tier;
  std::shared_ptr<const Serde> serde;
};

// What the objects of one registered layout look like in the tiers.
struct ObjectFormat {
  uint64_t object_bytes = 0;
  std::string layout_tag;  // "" : lmcache-compatible names; else kvd-private (object_key.h)
  ObjectLayout layout;     // for serdes
};

// An object just committed to L1.
struct CommittedObject {
  l1::ChunkKey chunk;
  uint32_t num_slots = 0;  // slots of its L1 entry (world size)
  uint32_t slot = 0;       // its slot (rank)
  ObjectKey key;
};

// The chunks a lookup wants from the tiers, in prefix order.
struct PrefetchRequest {
  std::vector<l1::ChunkKey> chunks;
  std::vector<std::array<uint8_t, 32>> hashes;  // one per chunk
  std::string model_name;
  std::string cache_salt;
  uint32_t world_size = 0;
  ObjectFormat format;
};

// What a prefetch found (PrefetchWithAnswer).
struct PrefetchAnswer {
  size_t chunks = 0;  // leading chunks of the request now resident in L1
  // The chunk after them is known to be in no tier: every tier answered "not found" (no
  // error, no timeout) for one of its objects that L1 lacked too. False when the prefix ended
  // for any other reason (a tier failed or was late, no room in L1, a load failed) or covers
  // the whole request.
  bool next_in_no_tier = false;
};

struct TierStats {
  std::string name;          // l2_name label: the type, or "<type>#<index>" when repeated
  std::string type;
  std::string describe;
  TierHealth health;
  uint64_t capacity_bytes = 0;
  uint64_t usage_bytes = 0;  // bytes of accounted objects; 0 for a tier without a capacity (no index)
  uint64_t objects = 0;      // accounted objects
  bool scanned = false;      // the index covers objects of earlier runs
  // store-behind
  uint64_t store_requests = 0, store_objects = 0;            // submitted
  uint64_t store_completed_requests = 0, stored_objects = 0, stored_bytes = 0;
  uint64_t store_existing_objects = 0;                       // already in the tier
  uint64_t store_failed_objects = 0, store_full_objects = 0; // errors (full: no space)
  uint64_t store_skipped_objects = 0;                        // over the in-flight budget
  uint64_t inflight_store_objects = 0, inflight_store_bytes = 0;
  double store_seconds = 0;                                  // summed batch latency
  // prefetch
  uint64_t prefetch_lookup_objects = 0, prefetch_found_objects = 0;
  uint64_t load_requests = 0, load_objects = 0;              // submitted
  uint64_t load_completed_requests = 0, loaded_objects = 0, loaded_bytes = 0;
  uint64_t load_missing_objects = 0, load_corrupt_objects = 0, load_failed_objects = 0;
  uint64_t inflight_load_objects = 0;
  double load_seconds = 0;
  uint64_t lookup_errors = 0;
  // eviction
  uint64_t evicted_objects = 0, evicted_bytes = 0;
};

struct TierSetStats {
  std::vector<TierStats> tiers;
  uint64_t prefetch_requests = 0;        // lookups that went to the tiers
  uint64_t prefetch_hit_chunks = 0;      // chunks they brought into L1
  uint64_t prefetch_failed_chunks = 0;   // planned chunks that did not arrive
  uint64_t prefetch_timeouts = 0;
  uint64_t active_prefetch_jobs = 0;
  uint64_t queued_prefetch_jobs = 0;
  uint64_t temporary_chunks = 0;         // prefetched chunks waiting to leave L1 (default)
  uint64_t skip_l1_removed_chunks = 0;
  uint64_t skip_l1_waiting_chunks = 0;  // skip_l1: chunks in L1 with some ranks' objects in a tier
  std::string store_policy, prefetch_policy;
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

  TierSetStats stats() const KVD_EXCLUDES(jobs_mu_, temp_mu_, skip_mu_);

  // Operator calls (GET / DELETE /cache/objects), tier_admin.cc; `index` < size() (else
  // InvalidArgument, inline). ListObjects: every object tier `index` holds (Tier::Scan).
  // DeleteObjects: removes `keys` from the tier and from its accounting; one result per key
  // (bytes > 0: it was there). `done` runs once, on a tier thread (inline after Close()).
  void ListObjects(size_t index, Tier::ScanDone done);
  void DeleteObjects(size_t index, std::vector<ObjectKey> keys, Tier::Done done);
  // The configuration of tier `index` (< size()).
  const AdapterConfig& adapter_config(size_t index) const;
  // Waits until no store-behind write is in flight (tests, benchmarks, shutdown).
  bool WaitIdle(double timeout_s);
  void Close() KVD_EXCLUDES(jobs_mu_, control_mu_);

 private:
  // Defined in tier_set_internal.h.
  struct TierState;
  struct StoreBatch;
  struct PrefetchJob;

  TierSet(const TierSetOptions& options, l1::L1Cache* l1);
  void ControlLoop(int64_t start_ns);  // once-a-second work from start_ns + 1 s
  void CheckTimeouts();
  void SweepTemporary();
  // prefetch (tier_prefetch.cc)
  void StartOrQueue(std::shared_ptr<PrefetchJob> job);
  void RunJob(const std::shared_ptr<PrefetchJob>& job);
  void OnExists(const std::shared_ptr<PrefetchJob>& job);
  void OnLoaded(const std::shared_ptr<PrefetchJob>& job);
  // Reserves the L1 slots of chunk c of the plan; false: the prefix ends.
  bool ReserveChunk(const std::shared_ptr<PrefetchJob>& job, size_t c)
      KVD_REQUIRES(loading_mu_);
  void Finish(const std::shared_ptr<PrefetchJob>& job);
  void Answer(const std::shared_ptr<PrefetchJob>& job, PrefetchAnswer answer);
  void JobFinished();
  // eviction (tier_eviction.cc; the accounting is TierState's, tier_set_internal.h)
  void EvictTier(TierState& t);
  void ScanTier(TierState& t);

  const TierSetOptions options_;
  l1::L1Cache* const l1_;
  std::vector<std::unique_ptr<TierState>> tiers_;
  std::atomic<uint64_t> calls_in_flight_{0};

  mutable Mutex jobs_mu_;
  std::deque<std::shared_ptr<PrefetchJob>> queued_ KVD_GUARDED_BY(jobs_mu_);
  std::vector<std::weak_ptr<PrefetchJob>> running_ KVD_GUARDED_BY(jobs_mu_);  // for timeouts
  int active_jobs_ KVD_GUARDED_BY(jobs_mu_) = 0;
  bool closed_ KVD_GUARDED_BY(jobs_mu_) = false;

  // Chunks whose L1 slots a prefetch job has reserved and is loading -> that job. A job that
  // finds a chunk's slots reserved by another job waits for that job's loads (follows it)
  // instead of counting them as resident. A job's entries leave, and its followers are
  // released, once its own loads are committed or aborted; a job never waits for its
  // followers, so following cannot deadlock. Reservations of a chunk, its entry and a
  // follower's lookup of it happen under loading_mu_ together.
  Mutex loading_mu_;
  std::unordered_map<l1::ChunkKey, PrefetchJob*, l1::ChunkKeyHash> loading_
      KVD_GUARDED_BY(loading_mu_);

  mutable Mutex temp_mu_;
  // Prefetched chunks (default policy) -> when they were committed.
  std::unordered_map<l1::ChunkKey, int64_t, l1::ChunkKeyHash> temporary_
      KVD_GUARDED_BY(temp_mu_);
  static constexpr int64_t kTemporaryGraceNs = 2'000'000'000;

  // skip_l1: the chunks in L1 some of whose slots (ranks) a tier holds, with which slots. A
  // chunk leaves L1 only once every slot is held (each rank stores its own object, and one
  // may be skipped or fail); a complete chunk still busy is retried by the control loop, and
  // a record whose chunk L1 let go is dropped there.
  struct SkipL1Chunk {
    std::vector<bool> slots;  // one per slot of the L1 entry
    uint32_t held = 0;        // slots set
  };
  void SkipL1Stored(const std::vector<CommittedObject>& objects, const std::atomic<bool>* stored);
  void SweepSkipL1();
  mutable Mutex skip_mu_;
  std::unordered_map<l1::ChunkKey, SkipL1Chunk, l1::ChunkKeyHash> skip_l1_
      KVD_GUARDED_BY(skip_mu_);

  std::atomic<uint64_t> prefetch_requests_{0}, prefetch_hit_chunks_{0}, prefetch_failed_chunks_{0},
      prefetch_timeouts_{0}, skip_l1_removed_{0};

  Mutex control_mu_;
  CondVar control_cv_;
  bool stop_control_ KVD_GUARDED_BY(control_mu_) = false;
  std::thread control_;
};

}  // namespace kvd::l2
