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
  return static_cast<uint32_t>(std::clamp<int64_t>(n, 1, l1::L1Cache::kMaxReadLocksPerSlot));
}

Status Lookups::Lookup(const wire::LookupRequest& req) {
  counters_->lookups++;
  const auto& key = req.key;
  const auto ns = registry_->KeyNamespace(key.model_name, key.world_size);
  if (!ns.registered || !ns.agreed) {
    // No worker of this model has registered: nothing can be retrieved, so 0 hits. Or its
    // workers keep objects in different namespaces (engine-driven, two block sizes): the
    // scheduler's key does not say which one its workers read, so 0 hits, never wrong KV.
    sessions_->SetLookupResult(key.request_id, 0);
    return Status::Ok();
  }
  auto keys = RequestChunkKeys(*sessions_, config_.chunk_size, key, ns.key_namespace);
  if (!keys.ok()) {
    sessions_->SetLookupResult(key.request_id, 0);
    return keys.status();
  }
  size_t hits;
  {
    ScopedPhase index(Phase::kIndex);
    hits = l1_->LookupPrefixAndLock(*keys, static_cast<uint32_t>(key.world_size),
                                    ReadLocksPerSlot(key, req.tp_size));
  }
  counters_->lookup_chunks += keys->size();
  counters_->hit_chunks += hits;
  sessions_->SetLookupResult(key.request_id, static_cast<int64_t>(hits));
  return Status::Ok();
}

std::optional<int64_t> Lookups::QueryPrefetchStatus(std::string_view request_id) {
  return sessions_->TakeLookupResult(request_id);
}

Status Lookups::FreeLookupLocks(const wire::LookupRequest& req) {
  const auto ns = registry_->KeyNamespace(req.key.model_name, req.key.world_size);
  if (!ns.registered || !ns.agreed) return Status::Ok();  // the lookup locked nothing
  auto keys = RequestChunkKeys(*sessions_, config_.chunk_size, req.key, ns.key_namespace);
  if (!keys.ok()) return keys.status();
  ScopedPhase index(Phase::kIndex);
  l1_->ReleaseReadLocksAllSlots(*keys, ReadLocksPerSlot(req.key, req.tp_size));
  return Status::Ok();
}

void Lookups::EndSession(std::string_view request_id) {
  auto [identity, hashes] = sessions_->End(request_id);
  if (hashes.empty()) return;
  ScopedPhase index(Phase::kIndex);
  // Keys are built in this thread's scratch vector, whose elements (and their strings'
  // buffers) are reused: ending sessions allocates nothing once the scratch has grown.
  // Same keys as MakeChunkKey builds.
  thread_local std::vector<l1::ChunkKey> keys;
  if (keys.size() < hashes.size()) keys.resize(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    keys[i].model_name.assign(identity.model_name);
    if (!identity.key_namespace.empty()) {
      keys[i].model_name += '@';
      keys[i].model_name += identity.key_namespace;
    }
    keys[i].world_size = static_cast<int32_t>(identity.world_size);
    keys[i].cache_salt.assign(identity.cache_salt);
    keys[i].chunk_hash = hashes[i];
  }
  l1_->Touch(std::span<const l1::ChunkKey>(keys.data(), hashes.size()));
}

}  // namespace kvd::server
