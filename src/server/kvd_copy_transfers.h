// KvdCopyTransfers: the lmcache-driven transfer mode, where kvd copies. A worker registers
// its paged KV tensors once (REGISTER_KV_CACHE); kvd builds the copy plan (layout) and a copy engine over
// them — CPU shared memory or CUDA IPC, both behind transfer::CopyEngine — and on STORE /
// RETRIEVE copies between the worker's blocks and L1 objects through that engine. One code
// path for both engines: a STORE reserves the objects, submits the gather and commits the
// objects in the engine's completion; a RETRIEVE pins the objects, submits the scatter and
// unpins them in the completion (synchronous engines complete inside Submit). What these do
// to L1 is ChunkIo's (chunk_io.h), shared with the engine-driven mode.
//
// Copies in flight. Reservations are marked MarkCopyInFlight before the copy is submitted,
// and pins never expire, so the memory a copy may touch stays its own until the engine
// reports completion, however late (a GPU copy runs when the client's event fires). A copy
// of an asynchronous engine that outlives its TTL (write TTL for stores, read TTL for
// retrieves) gets its instance cancelled by CancelOverdueCopies: the engine is cancelled
// (no new copies; the device work is drained where it can be) and the instance unregistered;
// the copy's memory is released only by its completion.
//
// Visibility (issue 26, item 2). A STORE's chunks are listed in PendingCommits (pending_commits.h)
// from before its asynchronous copy is submitted until its completion has committed (or
// aborted) them, so a LOOKUP or RETRIEVE that arrives after the client saw the copy's event
// complete, but before the completion thread committed, waits for that commit (bounded)
// instead of reporting a miss. A RETRIEVE waits at most PendingCommits::kRetrieveWait.
//
// Thread-safe. Transfers of one worker are kept in order by the caller (per-connection
// lanes); different workers copy concurrently. An instance is held by shared_ptr for the
// duration of a copy, L1 objects by reservations and pins owned by the completion.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "server/chunk_io.h"
#include "server/config.h"
#include "server/inflight_copies.h"
#include "server/pending_commits.h"
#include "server/instance_registry.h"
#include "server/kv_events.h"
#include "server/service_counters.h"
#include "server/sessions.h"
#include "transfer/copy_engine.h"
#include "transfer/shm_mapping.h"
#include "wire/messages.h"

namespace kvd::server {

class KvdCopyTransfers {
 public:
  // Borrows what the context points to; all must outlive this object. `shm_policy` says
  // whose shared memory a registration may map (owners, prefix, kvd's own segments).
  KvdCopyTransfers(const ServiceContext& context, transfer::ShmAccessPolicy shm_policy);

  // REGISTER_KV_CACHE. Registering an id already registered with the same model only
  // refreshes its liveness. Client memory is mapped only when the policy allows it and no
  // other instance maps it already.
  Status Register(const wire::RegisterKvCacheRequest& req);

  // STORE / RETRIEVE: all-or-nothing; the returned Status says why not. For asynchronous
  // (GPU) engines the copy is only enqueued: `event_handle` (if given) receives the
  // interprocess event the client must wait on (empty: no device work), also when the
  // Status is an error raised after part of the copy was enqueued. Stored objects are
  // committed, and read pins dropped, when the copy has completed.
  Status Store(const wire::TransferRequest& req, std::string* event_handle);
  Status Retrieve(const wire::TransferRequest& req, std::string* event_handle);

  // Device work beside an instance's copies (CacheBlend's scatter on a GPU instance, see
  // transfer::DeviceWork), submitted to its engine and watched like a RETRIEVE (read TTL), so
  // that a client whose event never fires gets its instance cancelled. Completion and
  // errors as CopyEngine::SubmitDeviceWork: when it refuses, `work.on_complete` never runs
  // and dropping it releases what it captured.
  Result<transfer::Submitted> SubmitDeviceWork(const std::shared_ptr<const Instance>& inst,
                                               transfer::DeviceWork work);

  // Cancels the instances whose asynchronous copies are past their deadline (see above);
  // returns how many. Called periodically (KvService::Maintain).
  size_t CancelOverdueCopies();
  // Asynchronous copies submitted and not completed yet.
  size_t copies_in_flight() const { return inflight_->size(); }
  // Chunks of asynchronous STOREs not committed yet (see Visibility above; the context's).
  PendingCommits* pending_commits() const { return pending_.get(); }
  // kvd_l1_lookup_waits_for_commit_total, kvd_l1_commit_wait_timeouts_total. The registry
  // must not outlive this object.
  void RegisterMetrics(metrics::Registry& registry);

 private:
  // Submits the tasks to the instance's engine. `on_complete` runs once the copy finished
  // (inside Submit for a synchronous engine); a copy of an asynchronous engine is watched
  // until then, with deadline now + `ttl_seconds`. If the engine refuses the plan, nothing
  // was copied and dropping the plan releases what `on_complete` captured. Counts the
  // transfer finished on the instance's device when it is over (completion or refusal), and
  // records the throughput of a synchronous copy of `bytes`.
  Status Submit(const std::shared_ptr<const Instance>& inst, transfer::CopyDirection direction,
                const wire::TransferRequest& req, std::vector<transfer::ChunkTask> tasks,
                uint64_t bytes, std::function<void(const Status&)> on_complete,
                std::string* event_handle);
  // An asynchronous engine's copy (or device work) is watched until it completes
  // (CancelOverdueCopies), with the TTL of what it holds: write reservations for a STORE,
  // read pins otherwise. 0 (nothing watched) for a synchronous engine.
  InFlightCopies::Id WatchIfAsynchronous(const std::shared_ptr<const Instance>& inst, bool store);
  // True when every block id of chunk `chunk` (all groups) is the null block.
  bool ChunkIsAllNull(const layout::KvLayout& layout,
                      const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk) const;

  const ServerConfig& config_;
  const Clock* const clock_;
  l1::L1Cache* const l1_;
  InstanceRegistry* const registry_;
  ServiceCounters* const counters_;
  ChunkIo io_;  // keys, reservations, commits and pins in L1; the tiers and KV-event log
  const int copy_threads_;  // most threads one CPU copy may use
  const transfer::ShmAccessPolicy shm_policy_;
  // Shared with the completions, which may run after this object is gone.
  const std::shared_ptr<InFlightCopies> inflight_ = std::make_shared<InFlightCopies>();
  // Chunks of asynchronous STOREs not committed yet (see Visibility above), the context's.
  const std::shared_ptr<PendingCommits> pending_;
  std::vector<metrics::CollectorHandle> metric_handles_;
  // Cancelled instances with copies still in flight (released by CancelOverdueCopies once
  // their copies completed, or with this object).
  Mutex cancelled_mu_;
  std::vector<std::shared_ptr<const Instance>> cancelled_ KVD_GUARDED_BY(cancelled_mu_);
};

}  // namespace kvd::server
