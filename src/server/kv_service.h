// KvService: the cache server's behaviour, one method per protocol operation, on typed
// requests. The socket loop (ZmqServer) decodes frames, calls these methods from its
// threads and encodes the results; KvService knows nothing of ZMQ or msgpack.
//
// It owns the L1 cache and the session table and delegates to one part per reason to
// change:
//   InstanceRegistry       registered workers and their liveness (instance_registry.h)
//   Lookups                LOOKUP, prefetch status, lock release, END_SESSION (lookups.h)
//   KvdCopyTransfers       REGISTER_KV_CACHE, STORE, RETRIEVE through copy engines
//                          (kvd_copy_transfers.h)
//   WorkerCopyTransfers    the PREPARE/COMMIT ops of workers that copy themselves
//                          (worker_copy_transfers.h)
// What spans parts stays here: unregistration and reaping (registry + both transfer
// modes), periodic maintenance, and the status snapshot.
//
// Thread-safe: methods may run concurrently. Transfers of one worker are kept in order
// by the caller (per-connection lanes). Copies never run under a kvd-wide lock: an
// instance is held by shared_ptr for the duration of a copy, L1 objects by pins and
// write reservations.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "p2p/peer_node.h"
#include "server/blend_ops.h"
#include "server/config.h"
#include "server/worker_copy_transfers.h"
#include "server/instance_registry.h"
#include "server/kv_events.h"
#include "server/kvd_copy_transfers.h"
#include "server/lookups.h"
#include "server/service_counters.h"
#include "server/sessions.h"
#include "server/status.h"
#include "wire/messages.h"

namespace kvd::server {

class KvService {
 public:
  static Result<std::unique_ptr<KvService>> Create(const ServerConfig& config, const Clock* clock);
  ~KvService();

  int64_t chunk_size() const { return config_.chunk_size; }

  // REGISTER_KV_CACHE / UNREGISTER_KV_CACHE (also UNREGISTER_ENGINE_DRIVEN_CONTEXT).
  // Registering an id already registered with the same model only refreshes its liveness.
  Status RegisterKvCache(const wire::RegisterKvCacheRequest& req) {
    return kvd_copy_.Register(req);
  }
  Status Unregister(int64_t instance_id);

  // STORE / RETRIEVE (see KvdCopyTransfers).
  Status Store(const wire::TransferRequest& req, std::string* event_handle = nullptr) {
    return kvd_copy_.Store(req, event_handle);
  }
  Status Retrieve(const wire::TransferRequest& req, std::string* event_handle = nullptr) {
    return kvd_copy_.Retrieve(req, event_handle);
  }

  // LOOKUP, QUERY_PREFETCH_STATUS, FREE_LOOKUP_LOCKS, END_SESSION (see Lookups).
  Status Lookup(const wire::LookupRequest& req) { return lookups_.Lookup(req); }
  std::optional<int64_t> QueryPrefetchStatus(std::string_view request_id) {
    return lookups_.results().Take(request_id);
  }
  // The requests' lookup results: WAIT_PREFETCH_STATUS is parked by the socket loop while one
  // is running (prefetch_waits.h); it re-checks when changes() moves, and the wakeup runs
  // when a prefetch ends.
  LookupResults& lookup_results() { return lookups_.results(); }
  Status FreeLookupLocks(const wire::LookupRequest& req) { return lookups_.FreeLookupLocks(req); }
  void EndSession(std::string_view request_id) {
    lookups_.EndSession(request_id);
    if (blend_) blend_->EndSession(request_id);
  }

  // CacheBlend's ops (server/blend_ops.h); null unless --engine-type blend.
  BlendOps* blend() { return blend_.get(); }

  // Engine-driven transfers (see WorkerCopyTransfers).
  Result<std::pair<std::string, uint64_t>> RegisterEngineDriven(
      const wire::RegisterEngineDrivenRequest& req) {
    return worker_copy_.Register(req);
  }
  Result<std::pair<std::vector<wire::ShmSlot>, std::vector<int64_t>>> PrepareStore(
      const wire::EngineDrivenRequest& req) {
    return worker_copy_.PrepareStore(req);
  }
  Status CommitStore(const wire::EngineDrivenRequest& req) { return worker_copy_.CommitStore(req); }
  Result<std::vector<wire::ShmSlot>> PrepareRetrieve(const wire::EngineDrivenRequest& req) {
    return worker_copy_.PrepareRetrieve(req);
  }
  Status CommitRetrieve(const wire::EngineDrivenRequest& req) {
    return worker_copy_.CommitRetrieve(req);
  }

  void Ping(std::optional<int64_t> instance_id);
  void Clear();
  // DELETE /cache/objects (tier l1): removes the entries of these chunks that are idle (no
  // reader, pin or write); entries in use are counted as busy, absent ones not at all.
  // Removed entries are announced as KV events.
  struct L1EntryName {
    std::string model_name;
    int32_t world_size = 0;
    std::string cache_salt;
    std::array<uint8_t, 32> chunk_hash{};
  };
  struct DeleteCounts {
    size_t removed = 0;
    size_t busy = 0;
  };
  DeleteCounts DeleteL1Entries(std::span<const L1EntryName> names);

  // Periodic work: expire sessions and abandoned engine-driven operations, cancel instances
  // whose device copies outlived their TTL, reap silent workers, evict to the watermark.
  // Called by the server's maintenance thread.
  void Maintain();

  const ServiceCounters& counters() const { return counters_; }
  // Chunks hashed so far (SessionTable::hashed_chunks): each request's chunk is hashed once.
  uint64_t hashed_chunks() const { return sessions_.hashed_chunks(); }
  // The tiers behind L1; null without --l2-adapter.
  const l2::TierSet* tiers() const { return tiers_.get(); }
  l2::TierSet* tiers() { return tiers_.get(); }  // operator calls (/cache/objects)
  // Waits until no write to a tier is in flight (tests and benchmarks). True when idle.
  bool WaitTiersIdle(double timeout_s) { return !tiers_ || tiers_->WaitIdle(timeout_s); }
  // count_locked walks the L1 table (see L1Cache::stats): on demand only.
  l1::L1Stats l1_stats() const { return l1_->stats(); }
  // The cache itself, for its thread-safe admin calls (quotas); see l1/l1_cache.h.
  l1::L1Cache& l1() { return *l1_; }
  size_t num_instances() const { return registry_.size(); }

  // --- status and metrics (read-only) ---
  // Instances, sessions and half-done engine-driven operations, copied out under the
  // locks (briefly; never during a copy). Safe from any thread.
  ServiceStatus StatusSnapshot();
  // The same without the instances (cheaper: what the collected families read).
  ServiceStatus CountsSnapshot() const;
  const ServerConfig& config() const { return config_; }

  // The KV-event log (kv_events.h); null when --kv-event-log-size is 0 or observability is
  // off. Lives as long as the service.
  KvEventLog* kv_events() const { return kv_events_.get(); }
  // The engine-driven mode (for its metrics: WorkerCopyTransfers::RegisterMetrics).
  WorkerCopyTransfers* worker_copy() { return &worker_copy_; }
  // The lmcache-driven mode (for its metrics: KvdCopyTransfers::RegisterMetrics).
  KvdCopyTransfers* kvd_copy() { return &kvd_copy_; }
  // True while an asynchronous STORE's chunks await their commit: a LOOKUP may then wait for
  // it (lookups.h, Visibility), so ZmqServer runs LOOKUPs on the pool. Lock-free.
  bool CommitsPending() const { return pending_commits_->any(); }
  // GET_EXPERIMENTAL: the capabilities this server advertises ("kv_event_stream").
  std::vector<std::string> ExperimentalCapabilities() const;

  // Registers the metric families of the service and its parts (the counters, L1, sessions
  // and instances, the tiers, both transfer modes, the KV-event log, P2P, blend). Call once; the registry must outlive the
  // service (the service unregisters its own families when destroyed).
  void RegisterMetrics(metrics::Registry& registry);

 private:
  KvService(const ServerConfig& config, const Clock* clock, std::unique_ptr<KvEventLog> events,
            std::unique_ptr<L1ListenerFanOut> fanout, std::unique_ptr<BlendIndex> blend_index,
            std::unique_ptr<p2p::PeerNode> peers,
            std::unique_ptr<l1::L1Cache> l1, transfer::ShmAccessPolicy shm_policy,
            std::unique_ptr<l2::TierSet> tiers);
  // Sessions, the chunk-key memo, instances and pending engine-driven operations
  // (kv_service_status.cc).
  std::vector<metrics::CollectorHandle> RegisterStatusMetrics(metrics::Registry& registry) const;
  // What the parts are built from: the shared state above, and `store_hook` (empty: none).
  ServiceContext Context(StoreCommittedHook store_hook = {});
  // Blend's fingerprinting of committed stores (empty without blend). Needs blend_ built.
  StoreCommittedHook BlendStoreHook();

  // Declaration order is destruction order in reverse: the parts (which hold L1 handles)
  // go before the sessions, the registry and the cache they borrow.
  const ServerConfig config_;
  const Clock* const clock_;
  std::unique_ptr<KvEventLog> kv_events_;  // an L1 listener: outlives l1_
  std::unique_ptr<L1ListenerFanOut> l1_listeners_;  // when L1 has several listeners
  std::unique_ptr<BlendIndex> blend_index_;         // blend: fingerprints, an L1 listener
  // P2P (--p2p-advertise-url): an L1 listener, so it outlives l1_; detached in the destructor.
  std::unique_ptr<p2p::PeerNode> peers_;
  std::unique_ptr<l1::L1Cache> l1_;
  // Closed first in the destructor: its callbacks use the sessions and the parts below.
  std::unique_ptr<l2::TierSet> tiers_;
  SessionTable sessions_;
  ServiceCounters counters_;
  InstanceRegistry registry_;
  // Shared with asynchronous copy completions, which may outlive the service's parts.
  const std::shared_ptr<PendingCommits> pending_commits_ = std::make_shared<PendingCommits>();
  // The parts, each built from one complete context (Context()). Blend is built before the
  // transfer modes: their store hook calls it. They go first, then blend, then lookups.
  Lookups lookups_;
  std::unique_ptr<BlendOps> blend_;  // --engine-type blend only
  KvdCopyTransfers kvd_copy_;
  WorkerCopyTransfers worker_copy_;
  // The counters' collected families: removed first, before what they read.
  std::vector<metrics::CollectorHandle> metric_handles_;
};

}  // namespace kvd::server
