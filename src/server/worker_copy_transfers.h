// WorkerCopyTransfers: the engine-driven transfer mode, where the worker copies: into and
// out of the L1 pool's shared memory, itself; kvd hands out slots (pool offsets) on PREPARE_STORE /
// PREPARE_RETRIEVE and makes them visible or lets them go on COMMIT_STORE /
// COMMIT_RETRIEVE. Between the two, a store holds write reservations (staging objects) and a
// retrieve holds read pins. What these do to L1 is ChunkIo's (chunk_io.h), shared with the
// lmcache-driven mode.
//
// BOUNDS (issue 27, finding 2). A worker that prepares and never commits must not lock L1
// against the other tenants: what the pending operations hold is bounded by a HoldLedger
// (engine_driven_holds.h): all instances together at most --engine-driven-max-held-fraction
// of L1, one instance at most --engine-driven-instance-held-fraction, at most
// HoldLedger::Limits::instance_ops operations per instance. Beyond, holds older than
// --engine-driven-shed-age-seconds are shed (the instance's own first); if that is not
// enough, a store is given slots for the prefix of its chunks that fits (the client writes
// and commits only those) and a retrieve is refused (ResourceExhausted). Every pending
// operation is dropped after --engine-driven-hold-timeout-seconds (or the write / read TTL,
// if shorter), whether or not the worker pings, and at once when the worker is unregistered
// or reaped. Shed, expired and refused operations are counted (RegisterMetrics).
//
// Thread-safe. The mutex guards the pending maps and the ledger; handles that are shed or
// expired are destroyed after it is released (their L1 calls need no ordering with it).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "server/chunk_io.h"
#include "server/config.h"
#include "server/engine_driven_holds.h"
#include "server/instance_registry.h"
#include "server/kv_events.h"
#include "server/service_counters.h"
#include "server/sessions.h"
#include "wire/messages.h"

namespace kvd::server {

class WorkerCopyTransfers {
 public:
  // Borrows what the context points to; all must outlive this object.
  explicit WorkerCopyTransfers(const ServiceContext& context);
  ~WorkerCopyTransfers();

  // REGISTER_ENGINE_DRIVEN_CONTEXT: validates the object shape, registers the instance and
  // returns the pool's shared-memory name and size.
  Result<std::pair<std::string, uint64_t>> Register(const wire::RegisterEngineDrivenRequest& req);
  // nullopt slots: the request was refused (the client falls back and then fails).
  Result<std::pair<std::vector<wire::ShmSlot>, std::vector<int64_t>>> PrepareStore(
      const wire::EngineDrivenRequest& req);
  Status CommitStore(const wire::EngineDrivenRequest& req);
  Result<std::vector<wire::ShmSlot>> PrepareRetrieve(const wire::EngineDrivenRequest& req);
  Status CommitRetrieve(const wire::EngineDrivenRequest& req);

  // Drops every half-done operation of the instance (unregistered or reaped).
  void DropInstance(int64_t instance_id);
  // Drops operations older than the hold timeout or the write (stores) / read (retrieves)
  // TTL, whichever is shorter.
  void ExpirePending();
  // Half-done operations: (stores, retrieves).
  std::pair<size_t, size_t> PendingCounts() const;
  // Bytes of L1 objects the half-done operations hold (all instances; one instance).
  uint64_t HeldBytes() const;
  uint64_t HeldBytes(int64_t instance_id) const;

  // Operations shed, expired, refused and trimmed for the bounds above.
  struct HoldStats {
    uint64_t staging_shed = 0, pins_shed = 0;        // prepared stores / retrieves shed
    uint64_t staging_expired = 0, pins_expired = 0;  // ... dropped by the timeout
    uint64_t refused = 0;                            // prepares refused (nothing fit)
    uint64_t trimmed_chunks = 0;                     // store chunks left out (no room)
    uint64_t held_bytes = 0;
  };
  HoldStats hold_stats() const;
  // kvd_engine_driven_* families; the handles live as long as this object.
  void RegisterMetrics(metrics::Registry& registry);

 private:
  // Operations between PREPARE and COMMIT, keyed by (instance, request#start:end).
  struct PendingStore {
    ChunkWrites writes;  // the worker's slot is writes.slot()
    std::string cache_salt;
    // With a store hook: the request's key and chunks, for the hook after the commit.
    std::shared_ptr<const std::pair<wire::CacheKey, RequestChunks>> hooked;
    int64_t started_ns = 0;
    uint64_t hold = 0;  // the ledger's id
  };
  struct PendingRetrieve {
    ChunkPins pins;
    std::string request_id;  // owner of the lookup locks this retrieve releases
    uint64_t first_chunk = 0, count = 0;
    uint32_t slot = 0;
    int64_t started_ns = 0;
    uint64_t hold = 0;  // the ledger's id
    // Lets the lookup locks and then the pins go (COMMIT_RETRIEVE's order).
    void Release(l1::L1Cache* l1);
  };
  using PendingKey = std::pair<int64_t, std::string>;
  enum HoldKind : int { kStaging = 0, kPins = 1 };
  // What was taken out of the maps under the mutex, destroyed after it.
  struct Dropped {
    std::vector<PendingStore> stores;
    std::vector<PendingRetrieve> retrieves;
  };
  // Moves the operations of the ledger's `holds` out of the maps into *out. Requires mu_.
  void TakeHolds(const std::vector<HoldLedger::Hold>& holds, Dropped* out) KVD_REQUIRES(mu_);
  void Finish(Dropped dropped) KVD_EXCLUDES(mu_);  // releases what was taken
  // Counts and logs the holds an admission shed. Requires mu_.
  void CountShed(const std::vector<HoldLedger::Hold>& shed, const char* op, int64_t instance_id)
      KVD_REQUIRES(mu_);

  const ServerConfig& config_;
  const Clock* const clock_;
  l1::L1Cache* const l1_;
  InstanceRegistry* const registry_;
  ServiceCounters* const counters_;
  ChunkIo io_;  // keys, reservations, commits and pins in L1; the tiers and KV-event log

  mutable Mutex mu_;
  std::map<PendingKey, PendingStore> pending_stores_ KVD_GUARDED_BY(mu_);
  std::map<PendingKey, PendingRetrieve> pending_retrieves_ KVD_GUARDED_BY(mu_);
  HoldLedger ledger_ KVD_GUARDED_BY(mu_);

  std::atomic<uint64_t> staging_shed_{0}, pins_shed_{0}, staging_expired_{0}, pins_expired_{0},
      refused_{0}, trimmed_chunks_{0};
  std::vector<metrics::CollectorHandle> metric_handles_;
};

}  // namespace kvd::server
