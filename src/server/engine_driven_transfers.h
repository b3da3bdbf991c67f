// EngineDrivenTransfers: the engine-driven transfer mode. The worker copies into and out of
// the L1 pool's shared memory itself; kvd hands out slots (pool offsets) on PREPARE_STORE /
// PREPARE_RETRIEVE and makes them visible or lets them go on COMMIT_STORE /
// COMMIT_RETRIEVE. Between the two, a store holds write reservations and a retrieve holds
// read pins; both are dropped after the write / read TTL if the worker never commits, and at
// once when the worker is unregistered or reaped. What these do to L1 is ChunkIo's
// (chunk_io.h), shared with the lmcache-driven mode.
//
// Thread-safe. The pending map's mutex is held only to insert, find or erase operations;
// L1 calls and handle destruction that need no ordering run outside it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "server/chunk_io.h"
#include "server/config.h"
#include "server/instance_registry.h"
#include "server/kv_events.h"
#include "server/service_counters.h"
#include "server/sessions.h"
#include "wire/messages.h"

namespace kvd::server {

class EngineDrivenTransfers {
 public:
  // Borrows everything; all must outlive this object.
  EngineDrivenTransfers(const ServerConfig& config, const Clock* clock, l1::L1Cache* l1,
                        SessionTable* sessions, InstanceRegistry* registry,
                        ServiceCounters* counters);
  ~EngineDrivenTransfers();

  // REGISTER_ENGINE_DRIVEN_CONTEXT: validates the object shape, registers the instance and
  // returns the pool's shared-memory name and size.
  Result<std::pair<std::string, uint64_t>> Register(const wire::RegisterEngineDrivenRequest& req);
  // nullopt slots: the request was refused (the client falls back and then fails).
  Result<std::pair<std::vector<wire::ShmSlot>, std::vector<int64_t>>> PrepareStore(
      const wire::EngineDrivenRequest& req);
  Status CommitStore(const wire::EngineDrivenRequest& req);
  Result<std::vector<wire::ShmSlot>> PrepareRetrieve(const wire::EngineDrivenRequest& req);
  Status CommitRetrieve(const wire::EngineDrivenRequest& req);
  // The tiers committed objects are written behind to (null: none). Set once, before use.
  void set_tiers(l2::TierSet* tiers) { io_.set_tiers(tiers); }
  // The KV-event log stores bind their chunks' tokens in (BindStoredChunks); null: none.
  void set_kv_events(KvEventLog* events) { io_.set_kv_events(events); }
  // Told of each COMMIT_STORE's committed chunks (ChunkIo::set_store_hook). Set once.
  void set_store_hook(StoreCommittedHook hook) { io_.set_store_hook(std::move(hook)); }

  // Drops every half-done operation of the instance (unregistered or reaped).
  void DropInstance(int64_t instance_id);
  // Drops operations older than the write (stores) / read (retrieves) TTL.
  void ExpirePending();
  // Half-done operations: (stores, retrieves).
  std::pair<size_t, size_t> PendingCounts() const;

 private:
  // Operations between PREPARE and COMMIT, keyed by (instance, request#start:end).
  struct PendingStore {
    ChunkWrites writes;  // the worker's slot is writes.slot()
    std::string cache_salt;
    // With a store hook: the request's key and chunks, for the hook after the commit.
    std::shared_ptr<const std::pair<wire::CacheKey, RequestChunks>> hooked;
    int64_t started_ns = 0;
  };
  struct PendingRetrieve {
    ChunkPins pins;
    std::string request_id;  // owner of the lookup locks this retrieve releases
    uint64_t first_chunk = 0, count = 0;
    uint32_t slot = 0;
    int64_t started_ns = 0;
  };
  using PendingKey = std::pair<int64_t, std::string>;

  const ServerConfig& config_;
  const Clock* const clock_;
  l1::L1Cache* const l1_;
  InstanceRegistry* const registry_;
  ServiceCounters* const counters_;
  ChunkIo io_;  // keys, reservations, commits and pins in L1; the tiers and KV-event log

  mutable std::mutex mu_;
  std::map<PendingKey, PendingStore> pending_stores_;        // guarded by mu_
  std::map<PendingKey, PendingRetrieve> pending_retrieves_;  // guarded by mu_
};

}  // namespace kvd::server
