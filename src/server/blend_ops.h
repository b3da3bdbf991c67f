// BlendOps: the server half of CacheBlend (`--engine-type blend`, lmcache 0.5.6's blend ops):
//   cb_register_rope / cb_unregister_rope   an instance's rotary tables (RopeTable, one per
//                                           cos/sin cache) and the per-kernel-group rope
//                                           (blend/rope_geometry.h)
//   STORE (worker 0), COMMIT_STORE          fingerprints of the committed chunks
//                                           (blend/matcher.h, PlanRegistration)
//   cb_unified_lookup                       the prefix leg as LOOKUP (Lookups), then the
//                                           non-prefix matches, found in L1, kept
//                                           non-overlapping, read-locked for the retrieve
//   cb_retrieve_pre_computed                checks the client's matches against the lookup's,
//                                           pins them and scatters them, re-rotated, into the
//                                           worker's registered KV (blend/scatter.h)
//   cb_protocol_handshake                   version check
//   cb_reorder_plan                         the prompt reordered to start with a stored
//                                           prompt's beginning (blend/reorder.h; the stored
//                                           prompts are recorded on worker 0's STOREs)
//
// One request's blend state:
//
//   (none) --cb_unified_lookup--> [prefix loading] --poll--> (reply nil; client polls again)
//      |                                |
//      |                                v  prefix known; matches (or, segmented prefix, chunks
//      |                                |  after the gap) that L1 lacks, with tiers
//      |                         [tier loading] --poll--> (reply nil) until every load answered
//      |                                |  (each chunk asked for once per lookup)
//      |                                v
//      +----------------------------> [locked]: matches found in L1, read-locked under the
//                                        |      owner "<request_id>\x1fblend" (readers per
//                                        |      object as LOOKUP), recorded here
//            cb_retrieve_pre_computed    |      of worker w: scatters, releases w's locks,
//            (every worker once) ------->|      marks w done (a repeat is a no-op: true)
//                                        v
//                                  [finished] every worker retrieved: locks released, matches
//                                        |    dropped; a repeat still answers true
//                                        v
//                                     (none) at END_SESSION, on a new lookup of the request, or
//                                            after the session TTL (the L1 read TTL expires
//                                            the locks anyway); END_SESSION/TTL also end a
//                                            [locked] state, releasing its locks
//
// Fingerprints leave the matcher synchronously (BlendIndex) when their chunk leaves L1 and no
// tier is configured; or, when every tier is indexed (each has a max_capacity_gb: kvd knows
// what it holds and deletes it itself, l2::TierSet::ChunkInNoTier), when the chunk leaves L1
// while some rank's object is in no tier, or when a tier deletes the last copy of a rank's
// object L1 lacks (an eviction round, an operator delete). Otherwise (a tier without an index,
// or one that dropped an object on its own) a lookup that finds a fingerprint's chunk missing
// from L1 keeps it and asks the tiers for it ([tier loading]). When every tier then answers
// "not found" for it (no error, no timeout: l2::PrefetchAnswer), and L1 still lacks it, the
// fingerprint is removed (issue 24); a tier that failed or was late removes nothing. In
// parity mode (--blend-lmcache-parity) a chunk still missing then is struck
// (Matcher::Strike), as lmcache does.
//
// Files: blend_ops.cc (rope, fingerprints, lookups, reorder, state), blend_retrieve.cc
// (cb_retrieve_pre_computed).
//
// Threads: every method is thread-safe. Rope state is replaced whole under rope_mu_ and
// shared by shared_ptr with the retrieves using it; request state is under req_mu_, never held
// across a copy. The matcher has its own lock. Lock order: L1 shard -> matcher (the listener);
// req_mu_ is never held while calling L1 except ReleaseAllLocks/ReleaseLocks (which take no
// listener path).
// Ownership: BlendOps borrows the cache, registry, lookups, tiers and the BlendIndex (all
// owned by KvService and outliving it; the BlendIndex is also one of L1's listeners). A tier
// load's completion holds only a shared counter, never BlendOps.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "blend/matcher.h"
#include "blend/reorder.h"
#include "blend/rope.h"
#include "blend/rope_geometry.h"
#include "blend/scatter.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l1/l1_listener.h"
#include "l2/tier_set.h"
#include "server/chunk_io.h"
#include "server/config.h"
#include "server/instance_registry.h"
#include "server/lookups.h"
#include "server/sessions.h"
#include "transfer/shm_mapping.h"
#include "wire/messages.h"

namespace kvd::server {

class KvdCopyTransfers;

// Tells several listeners of the same L1 events, in order. Not owning; every listener must
// outlive the cache. Thread-safe as its listeners are.
class L1ListenerFanOut : public l1::L1Listener {
 public:
  void Add(l1::L1Listener* listener) { listeners_.push_back(listener); }  // before use only
  bool empty() const { return listeners_.empty(); }
  size_t size() const { return listeners_.size(); }
  l1::L1Listener* only() const { return listeners_.size() == 1 ? listeners_[0] : nullptr; }
  void OnEntryComplete(const l1::ChunkKey& key) override {
    for (auto* l : listeners_) l->OnEntryComplete(key);
  }
  void OnEntriesRemoved(std::span<const l1::ChunkKey> keys, l1::RemovalCause cause) override {
    for (auto* l : listeners_) l->OnEntriesRemoved(keys, cause);
  }

 private:
  std::vector<l1::L1Listener*> listeners_;
};

// The fingerprint index: the matcher plus its removal when a chunk leaves L1 and the tiers.
// Created before the L1 cache (it is one of its listeners) and the tier set (it is told of
// their deletes); AttachTiers once both exist. Partitions are l1 NamespaceIds.
// Threads: the listener calls run with an L1 shard mutex held (lock order: L1 shard ->
// attach_mu_ -> each tier's mutex -> matcher); OnChunkSlotsGone runs on a tier thread and
// takes no lock of its own before it asks L1 (the tier set's calls end before the cache goes).
class BlendIndex : public l1::L1Listener {
 public:
  static Result<std::unique_ptr<BlendIndex>> Create(const ServerConfig& config);
  blend::Matcher& matcher() { return *matcher_; }
  bool parity() const { return matcher_->options().lmcache_parity; }
  // With tiers, an L1 removal removes the fingerprint only when the tiers can tell that the
  // chunk is in none of them. Set before the L1 cache is made.
  void set_tiers(bool tiers) { tiers_ = tiers; }
  // The tier set (null: none) and the cache, once both exist. DetachTiers before the tier set
  // is closed: it waits for the listener calls using the set.
  void AttachTiers(const l2::TierSet* tiers, l1::L1Cache* l1) KVD_EXCLUDES(attach_mu_);
  void DetachTiers() KVD_EXCLUDES(attach_mu_);

  void OnEntryComplete(const l1::ChunkKey&) override {}
  void OnEntriesRemoved(std::span<const l1::ChunkKey> keys, l1::RemovalCause cause) override
      KVD_EXCLUDES(attach_mu_);
  // A tier deleted the last copy of these chunk slots (l2::TierSetOptions::
  // on_chunk_slots_gone): a chunk whose slot L1 lacks too loses its fingerprint.
  void OnChunkSlotsGone(std::span<const l2::ChunkSlot> slots) KVD_EXCLUDES(attach_mu_);
  // `chunk` is in neither L1 nor any tier (OnEntriesRemoved, OnChunkSlotsGone, or the tiers'
  // answer to a lookup): removes its fingerprint, if any (counted in `removed`).
  void RemoveChunk(const l1::ChunkKey& chunk);

  metrics::Counter removed;  // fingerprints removed because their chunk left L1 (and the tiers)

 private:
  explicit BlendIndex(std::unique_ptr<blend::Matcher> m) : matcher_(std::move(m)) {}
  std::unique_ptr<blend::Matcher> matcher_;
  bool tiers_ = false;
  SharedMutex attach_mu_;  // guards tier_set_ (DetachTiers waits for its users)
  const l2::TierSet* tier_set_ KVD_GUARDED_BY(attach_mu_) = nullptr;
  // Set once by AttachTiers; it outlives every listener call and tier call.
  std::atomic<l1::L1Cache*> l1_{nullptr};
};

class BlendOps {
 public:
  // Borrows everything; all must outlive this object.
  // `tiers` may be null (no --l2-adapter). `copies` submits the scatter of GPU instances
  // (it may be constructed after this object: it is used by requests only).
  BlendOps(const ServerConfig& config, const Clock* clock, BlendIndex* index, l1::L1Cache* l1,
           InstanceRegistry* registry, Lookups* lookups, l2::TierSet* tiers,
           KvdCopyTransfers* copies, transfer::ShmAccessPolicy shm_policy);

  // cb_register_rope: replaces the instance's rope state. Errors as lmcache's (instance not
  // registered, group_to_cache / group_rot / kv_quant), plus kvd's on the tables' memory:
  // a shared-memory segment it maps, or, for a GPU instance, GPU memory its engine reads
  // once (CopyEngine::ReadDeviceTensor).
  Status RegisterRope(const wire::CbRegisterRopeRequest& req);
  // cb_unregister_rope (and when the instance goes). Returns whether it had one.
  bool UnregisterRope(int64_t instance_id);

  // cb_unified_lookup: nullopt (reply nil; the client asks again) while the prefix leg
  // loads from a tier, then while the tiers load the non-prefix matches (and, with
  // --enable-segmented-prefix, the chunks after the prefix's gap) that L1 lacks: each such
  // chunk is asked for once per lookup, on its own (one missing chunk does not hold up the
  // others); what arrived is then answered like what L1 had (lmcache loads its matches from
  // L2 the same way, in one sparse prefetch).
  Result<std::optional<wire::CbUnifiedLookupResult>> UnifiedLookup(const wire::LookupRequest& req);
  // cb_retrieve_pre_computed: scatter_ran. Errors (reply [handle, false]) for a missing
  // instance or rope registration. A CPU instance is scattered before this returns
  // (blend::ExecuteScatter; no event). A GPU instance's scatter is enqueued on its engine
  // after the client's event (blend/cuda's plan and kernel): `event_handle` receives the
  // event that fires when it is done (also with false, when the work was cut short after
  // part of it was enqueued), and the objects stay pinned until then.
  Result<bool> RetrievePreComputed(const wire::CbRetrievePreComputedRequest& req,
                                   std::string* event_handle = nullptr);
  // cb_reorder_plan (--enable-blend-reorder): the prompt's tokens reordered so it starts with
  // a copy of a stored prompt's beginning (blend/reorder.h), or empty to keep its order.
  // Candidates come from the prompts worker 0's stores recorded (PromptStore) and the
  // matcher's hits; planning stops after min(budget_ms, kMaxReorderBudgetMs).
  static constexpr int64_t kMaxReorderBudgetMs = 1000;
  std::vector<uint32_t> ReorderPlan(const wire::CbReorderPlanRequest& req);
  // END_SESSION: drops the request's blend locks and state.
  void EndSession(std::string_view request_id);
  // Periodic: forgets request states older than the session TTL (their locks too).
  void Maintain();

  // A STORE / COMMIT_STORE committed chunks: registers their fingerprints (worker 0 only,
  // synchronously on the committing thread: PlanRegistration + Register cost ~3.4 µs per
  // 256-token chunk, measured on a 16-chunk store; far below the chunk's copy).
  void OnStoreCommitted(const CommittedStore& store);

  // lmcache_blend_* families.
  void RegisterMetrics(metrics::Registry& registry);

  // Tests: requests whose blend matches are still locked for a retrieve.
  size_t requests_held() const;
  bool has_rope(int64_t instance_id) const;
  blend::Matcher& matcher() { return index_->matcher(); }

  static std::string LockOwner(std::string_view request_id);

 private:
  struct RopeState {
    std::vector<std::unique_ptr<blend::RopeTable>> tables;
    std::vector<blend::GroupRope> groups;  // one per kernel group of the layout
    std::weak_ptr<const Instance> instance;  // the registration it was built for
  };
  struct Found {
    wire::CbMatchResult match;
    l1::ChunkKey key;
  };
  struct RequestState {
    std::vector<Found> found;      // lock index j = position in this vector
    std::vector<int64_t> done;     // worker ids that retrieved
    l1::NamespaceId ns = 0;        // the lookup's (model, world size, salt)
    uint32_t world = 1;
    uint32_t readers = 1;
    int64_t created_ns = 0;
    bool finished = false;         // every worker retrieved; locks released, matches dropped
  };

  // The tier loads one lookup started for chunks L1 lacked; the lookup answers when none is
  // left (each load's completion records its answer and counts one down, from a tier thread).
  struct TierLoadAnswers {
    explicit TierLoadAnswers(std::vector<l1::ChunkKey> asked)
        : chunks(std::move(asked)),
          in_no_tier(new std::atomic<bool>[chunks.size()]()),
          pending(chunks.size()) {}
    const std::vector<l1::ChunkKey> chunks;
    // Per chunk: every tier answered "not found" (l2::PrefetchAnswer::next_in_no_tier).
    const std::unique_ptr<std::atomic<bool>[]> in_no_tier;
    std::atomic<size_t> pending;
  };
  struct TierLoads {
    std::shared_ptr<TierLoadAnswers> answers;
    int64_t prefix_chunks = 0;  // the prefix leg's answer (Lookups hands it out once)
    int64_t started_ns = 0;
  };

  void DropRequestLocked(const std::string& request_id) KVD_REQUIRES(req_mu_);
  // The chunks the tiers answered "in no tier" for and L1 still lacks (on some of `world`
  // slots) can never be served whole: their fingerprints go (BlendIndex::RemoveChunk).
  void RemoveInNoTier(const TierLoadAnswers& answers, uint32_t world);
  // Whether L1 holds `key`'s objects for all `world` slots.
  bool ResidentOnEveryRank(const l1::ChunkKey& key, uint32_t world) const;
  // The L1 namespace (the matcher's partition) of a model's chunks: nullopt unless its
  // workers registered and agree on the key namespace (`registered`, when given, says
  // whether they did) and L1 knows the namespace.
  std::optional<l1::NamespaceId> MatcherPartition(const std::string& model_name, int64_t world_size,
                                                  const std::string& cache_salt,
                                                  bool* registered = nullptr) const;
  // A validated, ready scatter (`host_request`: objects at their pinned L1 addresses, the
  // tensors at the engine's device addresses) on a GPU instance: each object is copied to
  // device scratch and the device plan runs there, after `wait_event`. `pins` are held until
  // the engine reports completion. False (logged) when the engine refused the work or cut it
  // short; `event_handle` as RetrievePreComputed's.
  bool ScatterOnDevice(const std::shared_ptr<const Instance>& inst, const std::string& rid,
                       const blend::ScatterRequest& host_request, std::vector<l1::ReadPin> pins,
                       const std::string& wait_event, std::string* event_handle);
  // Worker 0's store committed chunks of `key`: its prompt and chain go to prompts_.
  void RecordPrompt(const wire::CacheKey& key, const RequestChunks& chunks);
  // Starts one tier prefetch per chunk of `chunks` (distinct, none resident on every slot);
  // false when there is nothing to load them with (no tiers, no registered format).
  bool LoadFromTiers(const wire::CacheKey& key, uint32_t world, int64_t prefix_chunks,
                     std::vector<l1::ChunkKey> chunks);

  const ServerConfig& config_;
  const Clock* const clock_;
  BlendIndex* const index_;
  l1::L1Cache* const l1_;
  InstanceRegistry* const registry_;
  Lookups* const lookups_;
  l2::TierSet* const tiers_;
  KvdCopyTransfers* const copies_;
  const transfer::ShmAccessPolicy shm_policy_;
  // Stored prompts for cb_reorder_plan; null without --enable-blend-reorder.
  const std::unique_ptr<blend::PromptStore> prompts_;

  mutable Mutex rope_mu_;
  std::map<int64_t, std::shared_ptr<const RopeState>> rope_ KVD_GUARDED_BY(rope_mu_);
  mutable Mutex req_mu_;
  std::unordered_map<std::string, RequestState> requests_ KVD_GUARDED_BY(req_mu_);
  std::unordered_map<std::string, int64_t> prefix_loading_ KVD_GUARDED_BY(req_mu_);
  std::unordered_map<std::string, TierLoads> tier_loading_ KVD_GUARDED_BY(req_mu_);

  struct Metrics {
    metrics::Counter lookup_requests;
    metrics::Counter lookup_requested_tokens;
    metrics::Counter lookup_hit_tokens;
    metrics::Counter lookup_prefix_hit_tokens;
    metrics::Counter lookup_non_prefix_hit_tokens;
    metrics::Counter lookup_segmented_prefix_hit_tokens;
    metrics::Counter lookup_storage_hits;
    metrics::Counter lookup_stale_chunks;
    metrics::Counter lookup_no_gpu_context_errors;
    metrics::Counter retrieve_requests;
    metrics::Counter retrieve_chunks;
    metrics::Counter retrieve_failures;
    metrics::Counter retrieve_noops;
    metrics::Counter fingerprints_registered;
    metrics::Counter fingerprint_matches;
    metrics::Counter scatter_tokens;
    metrics::Counter scatter_shifted_chunks;
    metrics::Counter reorder_requests;
    metrics::Counter reorder_plans;       // of which answered with a new order
    metrics::Counter tier_load_chunks;    // chunks lookups asked the tiers for
    metrics::Counter tier_loaded_chunks;  // of which the tiers brought into L1
  };
  Metrics m_;
  std::vector<metrics::CollectorHandle> metric_handles_;
};

}  // namespace kvd::server
