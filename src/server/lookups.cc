#include "server/lookups.h"

#include <algorithm>
#include <vector>

#include "server/chunk_keys.h"
#include "server/request_phases.h"

namespace kvd::server {

Lookups::Lookups(const ServerConfig& config, l1::L1Cache* l1, SessionTable* sessions,
                 const InstanceRegistry* registry, ServiceCounters* counters)
    : config_(config), l1_(l1), sessions_(sessions), registry_(registry), counters_(counters) {}

uint32_t Lookups::ReadLocksPerSlot(const wire::CacheKey& key, int64_t tp_size) {
  // Each reader's RETRIEVE releases one lock on its own object. 0.5.6 clients say how many
  // readers an object has; older ones did not (then: the TP size reads an MLA object).
  int64_t n = key.num_kv_readers > 0 ? key.num_kv_readers
                                     : (key.world_size == 1 ? std::max<int64_t>(1, tp_size) : 1);
  return static_cast<uint32_t>(std::clamp<int64_t>(n, 1, l1::EntryLocks::kMax));
}

Status Lookups::Lookup(const wire::LookupRequest& req) {
  counters_->lookups++;
  const auto& key = req.key;
  const auto ns = registry_->KeyNamespace(key.model_name, key.world_size);
  if (!ns.registered || !ns.agreed) {
    // No worker of this model has registered: nothing can be retrieved, so 0 hits. Or its
    // workers keep objects in different namespaces (engine-driven, two block sizes): the
    // scheduler's key does not say which one its workers read, so 0 hits, never wrong KV.
    l1_->ReleaseAllLocks(key.request_id);  // a new lookup replaces the request's old locks
    sessions_->SetLookupResult(key.request_id, 0);
    return Status::Ok();
  }
  auto chunks = RequestChunkKeys(*sessions_, l1_->namespaces(), config_.chunk_size, key,
                                 /*create_namespace=*/false, ns.key_namespace);
  if (!chunks.ok()) {
    l1_->ReleaseAllLocks(key.request_id);
    sessions_->SetLookupResult(key.request_id, 0);
    return chunks.status();
  }
  // The locks belong to this request: only its own RETRIEVEs, FREE_LOOKUP_LOCKS, next LOOKUP
  // or the read TTL release them.
  size_t hits;
  {
    ScopedPhase index(Phase::kIndex);
    hits = l1_->LookupAndLock(key.request_id, chunks->first_chunk, chunks->keys,
                              static_cast<uint32_t>(key.world_size),
                              ReadLocksPerSlot(key, req.tp_size));
  }
  counters_->lookup_chunks += (key.end - key.start) / config_.chunk_size;
  counters_->hit_chunks += hits;
  sessions_->SetLookupResult(key.request_id, static_cast<int64_t>(hits));
  return Status::Ok();
}

std::optional<int64_t> Lookups::QueryPrefetchStatus(std::string_view request_id) {
  return sessions_->TakeLookupResult(request_id);
}

Status Lookups::FreeLookupLocks(const wire::LookupRequest& req) {
  const int64_t c = config_.chunk_size;
  if (req.key.start % c != 0 || req.key.end % c != 0 || req.key.end < req.key.start) {
    return Status::InvalidArgument("free_lookup_locks: token range [" +
                                   std::to_string(req.key.start) + ", " +
                                   std::to_string(req.key.end) + ") is not chunk-aligned");
  }
  // The range is the request's own: no hashing needed, its locks are found by request id.
  ScopedPhase index(Phase::kIndex);
  l1_->ReleaseLocks(req.key.request_id, static_cast<uint64_t>(req.key.start / c),
                    static_cast<uint64_t>((req.key.end - req.key.start) / c), std::nullopt);
  return Status::Ok();
}

void Lookups::EndSession(std::string_view request_id) {
  // The request's read locks stay until its RETRIEVEs, FREE_LOOKUP_LOCKS or the read TTL, as
  // in lmcache: a worker's RETRIEVE may still be on its way when the scheduler ends the session.
  auto [identity, hashes] = sessions_->End(request_id);
  if (hashes.empty()) return;
  ScopedPhase index(Phase::kIndex);
  // The model name and keys are built in this thread's scratch: ending sessions allocates
  // nothing once the scratch has grown.
  thread_local std::string model;
  KeyModelNameInto(&model, identity.model_name, identity.key_namespace);
  auto ns = l1_->namespaces().Find(model,
                                   static_cast<int32_t>(identity.world_size), identity.cache_salt);
  if (!ns) return;
  thread_local std::vector<l1::ChunkKey> keys;
  keys.resize(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) keys[i] = {*ns, hashes[i]};
  l1_->Touch(keys);
}

}  // namespace kvd::server
