// KvService: the cache server's behaviour, one method per protocol operation, on typed
// requests. It owns the L1 cache, the registered worker instances and the sessions.
// The socket loop (ZmqServer) decodes frames, calls these methods from its threads and
// encodes the results; KvService knows nothing of ZMQ or msgpack.
//
// Thread-safe: methods may run concurrently. Transfers of one worker are kept in order
// by the caller (per-connection lanes). Copies never run under a kvd-wide lock: an
// instance is held by shared_ptr for the duration of a copy, L1 objects by pins and
// write reservations.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "layout/layout.h"
#include "server/config.h"
#include "server/sessions.h"
#include "server/status.h"
#include "transfer/copy_engine.h"
#include "transfer/shm_mapping.h"
#include "wire/messages.h"

namespace kvd::server {

// A registered worker: its KV tensors mapped into kvd and the copy plan over them
// (lmcache-driven), or the object shape it copies itself (engine-driven).
struct Instance {
  int64_t id = 0;
  bool engine_driven = false;
  std::string model_name;
  int64_t world_size = 0;
  layout::KvLayout layout;                    // lmcache-driven
  std::vector<transfer::ShmMapping> mappings; // one per distinct shm segment
  std::vector<uint8_t*> tensor_bases;         // per registered tensor (null for GPU tensors)
  // GPU (CUDA IPC) instances: the engine that executes `layout` on the worker's device
  // memory; null for CPU shared-memory instances, which copy with transfer::cpu_copy.
  std::shared_ptr<transfer::CopyEngine> engine;
  uint64_t object_bytes = 0;                  // bytes of one chunk object
  std::vector<int64_t> object_shape;          // engine-driven slot shape
  std::string dtype;
};

struct ServiceCounters {
  std::atomic<uint64_t> lookups{0}, lookup_chunks{0}, hit_chunks{0};
  std::atomic<uint64_t> stores{0}, store_failures{0}, stored_chunks{0}, stored_bytes{0};
  std::atomic<uint64_t> retrieves{0}, retrieve_failures{0}, retrieved_chunks{0},
      retrieved_bytes{0};
};

class KvService {
 public:
  static Result<std::unique_ptr<KvService>> Create(const ServerConfig& config, const Clock* clock);
  ~KvService();

  int64_t chunk_size() const { return config_.chunk_size; }

  // REGISTER_KV_CACHE / UNREGISTER_KV_CACHE. Registering an id already registered with
  // the same model only refreshes its liveness.
  Status RegisterKvCache(const wire::RegisterKvCacheRequest& req);
  Status Unregister(int64_t instance_id);

  // STORE / RETRIEVE: all-or-nothing; the returned Status says why not. For GPU instances
  // the copy is only enqueued: `event_handle` (if given) receives the interprocess event
  // the client must wait on (empty: no device work), also when the Status is an error
  // raised after part of the copy was enqueued. Stored objects are committed, and read
  // pins dropped, when the device copy has completed.
  Status Store(const wire::TransferRequest& req, std::string* event_handle = nullptr);
  Status Retrieve(const wire::TransferRequest& req, std::string* event_handle = nullptr);

  // LOOKUP: computes the hit prefix (in chunks), read-locks it, and records the result
  // for QUERY_PREFETCH_STATUS. FREE_LOOKUP_LOCKS releases locks of a range.
  Status Lookup(const wire::LookupRequest& req);
  std::optional<int64_t> QueryPrefetchStatus(const std::string& request_id);
  Status FreeLookupLocks(const wire::LookupRequest& req);
  void EndSession(const std::string& request_id);

  // Engine-driven transfers: the worker copies into/out of the L1 pool's shared memory.
  Result<std::pair<std::string, uint64_t>> RegisterEngineDriven(
      const wire::RegisterEngineDrivenRequest& req);
  // nullopt slots: the request was refused (the client falls back and then fails).
  Result<std::pair<std::vector<wire::ShmSlot>, std::vector<int64_t>>> PrepareStore(
      const wire::EngineDrivenRequest& req);
  Status CommitStore(const wire::EngineDrivenRequest& req);
  Result<std::vector<wire::ShmSlot>> PrepareRetrieve(const wire::EngineDrivenRequest& req);
  Status CommitRetrieve(const wire::EngineDrivenRequest& req);

  void Ping(std::optional<int64_t> instance_id);
  void Clear();

  // Periodic work: expire sessions and abandoned engine-driven operations, evict to
  // the watermark. Called by the server's maintenance thread.
  void Maintain();

  const ServiceCounters& counters() const { return counters_; }
  // count_locked walks the L1 table (see L1Cache::stats): on demand only.
  l1::L1Stats l1_stats(bool count_locked = false) const { return l1_->stats(count_locked); }
  size_t num_instances() const;

  // --- status and metrics (read-only) ---
  // Instances, sessions and half-done engine-driven operations, copied out under the
  // locks (briefly; never during a copy). Safe from any thread.
  ServiceStatus StatusSnapshot();
  const ServerConfig& config() const { return config_; }

 private:
  KvService(const ServerConfig& config, const Clock* clock, std::unique_ptr<l1::L1Cache> l1);

  std::shared_ptr<const Instance> FindInstance(int64_t id);
  // Chunk keys of chunks [start/C, end/C) of `key`; validates alignment.
  Result<std::vector<l1::ChunkKey>> ChunkKeys(const wire::CacheKey& key);
  bool ModelRegistered(const std::string& model, int64_t world_size);
  uint32_t ReadLocksPerSlot(const wire::CacheKey& key, int64_t tp_size) const;
  // True when every block id of chunk `chunk` (all groups) is the null block.
  bool ChunkIsAllNull(const layout::KvLayout& layout,
                      const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk) const;
  // Threads for one request's copy of `bytes`.
  int CopyThreads(uint64_t bytes) const;

  const ServerConfig config_;
  const Clock* const clock_;
  std::unique_ptr<l1::L1Cache> l1_;
  SessionTable sessions_;
  const int copy_threads_;
  ServiceCounters counters_;

  mutable std::mutex mu_;
  std::map<int64_t, std::shared_ptr<const Instance>> instances_;     // guarded by mu_
  std::map<int64_t, int64_t> last_seen_ns_;                          // guarded by mu_
  // Instances that have sent a PING: reaped after worker_reap_timeout_seconds of silence;
  // the others (the 0.5.6 client pings only after its first transfer) after
  // worker_registration_grace_seconds.
  std::set<int64_t> pinged_;                                         // guarded by mu_

  // Engine-driven operations between PREPARE and COMMIT, keyed by (instance, request).
  struct PendingStore {
    std::vector<l1::WriteReservation> reservations;
    int64_t started_ns = 0;
  };
  struct PendingRetrieve {
    std::vector<l1::ReadPin> pins;
    std::vector<l1::ChunkKey> keys;
    uint32_t slot = 0;
    int64_t started_ns = 0;
  };
  std::mutex pending_mu_;
  std::map<std::pair<int64_t, std::string>, PendingStore> pending_stores_;       // guarded
  std::map<std::pair<int64_t, std::string>, PendingRetrieve> pending_retrieves_; // guarded
};

}  // namespace kvd::server
