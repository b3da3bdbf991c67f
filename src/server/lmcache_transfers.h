// LmcacheTransfers: the lmcache-driven transfer mode. A worker registers its paged KV
// tensors once (REGISTER_KV_CACHE); kvd builds the copy plan (layout) and a copy engine over
// them — CPU shared memory or CUDA IPC, both behind transfer::CopyEngine — and on STORE /
// RETRIEVE copies between the worker's blocks and L1 objects through that engine. One code
// path for both engines: a STORE reserves the objects, submits the gather and commits the
// objects in the engine's completion; a RETRIEVE pins the objects, submits the scatter and
// unpins them in the completion (synchronous engines complete inside Submit).
//
// Thread-safe. Transfers of one worker are kept in order by the caller (per-connection
// lanes); different workers copy concurrently. An instance is held by shared_ptr for the
// duration of a copy, L1 objects by reservations and pins owned by the completion.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "l1/l1_cache.h"
#include "server/config.h"
#include "server/instance_registry.h"
#include "server/service_counters.h"
#include "server/sessions.h"
#include "wire/messages.h"

namespace kvd::server {

class LmcacheTransfers {
 public:
  // Borrows everything; all must outlive this object.
  LmcacheTransfers(const ServerConfig& config, l1::L1Cache* l1, SessionTable* sessions,
                   InstanceRegistry* registry, ServiceCounters* counters);

  // REGISTER_KV_CACHE. Registering an id already registered with the same model only
  // refreshes its liveness.
  Status Register(const wire::RegisterKvCacheRequest& req);

  // STORE / RETRIEVE: all-or-nothing; the returned Status says why not. For asynchronous
  // (GPU) engines the copy is only enqueued: `event_handle` (if given) receives the
  // interprocess event the client must wait on (empty: no device work), also when the
  // Status is an error raised after part of the copy was enqueued. Stored objects are
  // committed, and read pins dropped, when the copy has completed.
  Status Store(const wire::TransferRequest& req, std::string* event_handle);
  Status Retrieve(const wire::TransferRequest& req, std::string* event_handle);

 private:
  // True when every block id of chunk `chunk` (all groups) is the null block.
  bool ChunkIsAllNull(const layout::KvLayout& layout,
                      const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk) const;

  const ServerConfig& config_;
  l1::L1Cache* const l1_;
  SessionTable* const sessions_;
  InstanceRegistry* const registry_;
  ServiceCounters* const counters_;
  const int copy_threads_;  // most threads one CPU copy may use
};

}  // namespace kvd::server
