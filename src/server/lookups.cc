#include "server/lookups.h"

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "server/chunk_keys.h"
#include "server/request_phases.h"
#include "server/tiers.h"

namespace kvd::server {

Lookups::Lookups(const ServiceContext& context)
    : config_(*context.config),
      l1_(context.l1),
      sessions_(context.sessions),
      registry_(context.registry),
      counters_(context.counters),
      tiers_(context.tiers),
      pending_(context.pending_commits),
      results_(context.clock, LookupResults::Limits{context.config->max_sessions,
                                                    context.config->max_session_bytes,
                                                    context.config->session_ttl_seconds}) {}

uint32_t Lookups::ReadLocksPerSlot(const wire::CacheKey& key, int64_t tp_size) {
  // Each reader's RETRIEVE releases one lock on its own object. 0.5.6 clients say how many
  // readers an object has; older ones did not (then: the TP size reads an MLA object).
  int64_t n = key.num_kv_readers > 0 ? key.num_kv_readers
                                     : (key.world_size == 1 ? std::max<int64_t>(1, tp_size) : 1);
  return static_cast<uint32_t>(std::clamp<int64_t>(n, 1, l1::EntryLocks::kMax));
}

namespace {

void Add(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace

Status Lookups::Lookup(const wire::LookupRequest& req) {
  const auto& key = req.key;
  // The request's (model_name, cache_salt) counters, lmcache's lookup labels (a lock-free
  // probe once the pair is known; entries live as long as the counters).
  LookupValues& counts = counters_->lookups.Get({key.model_name, key.cache_salt});
  Add(counts.lookups, 1);
  auto early_exit = [&](EarlyExit why) { Add(counts.early_exits[static_cast<size_t>(why)], 1); };
  // A lookup's locking and registration, and a prefetch completion of the same request, run
  // one at a time: a completion never sees itself current while a newer lookup of the
  // request is between taking its locks and registering (it would replace those locks).
  ReleasableMutexLock serial(&results_.RequestMutex(key.request_id));
  // The request's session exists from its LOOKUP on, whether or not this lookup hashes
  // anything: its workers' STOREs then hash each chunk once, into it.
  sessions_->Open(key.request_id);
  const auto ns = registry_->KeyNamespace(key.model_name, key.world_size);
  if (!ns.registered || !ns.agreed) {
    // No worker of this model has registered: nothing can be retrieved, so 0 hits. Or its
    // workers keep objects in different namespaces (engine-driven, two block sizes): the
    // scheduler's key does not say which one its workers read, so 0 hits, never wrong KV.
    early_exit(ns.registered ? EarlyExit::kMixedLayouts : EarlyExit::kNoGpuContext);
    l1_->ReleaseAllLocks(key.request_id);  // a new lookup replaces the request's old locks
    results_.Set(key.request_id, 0);
    return Status::Ok();
  }
  // Without tiers only L1 can hit: hashing stops after the first chunk L1 lacks (the
  // request's stores hash the rest, once). With tiers every chunk is hashed (the prefix may
  // continue in them), and a namespace L1 has not seen yet (a restart) may still have
  // objects there.
  auto chunks =
      tiers_ == nullptr
          ? LookupChunkKeys(*sessions_, l1_->namespaces(), config_.chunk_size, key,
                            ns.key_namespace,
                            [this](const l1::ChunkKey& k) {
                              return l1_->IsResident(k, 0) || (pending_ && pending_->Contains(k));
                            })
          : RequestChunkKeys(*sessions_, l1_->namespaces(), config_.chunk_size, key,
                             /*create_namespace=*/true, ns.key_namespace);
  if (!chunks.ok()) {
    l1_->ReleaseAllLocks(key.request_id);
    results_.Set(key.request_id, 0);
    return chunks.status();
  }
  if (pending_ && pending_->any()) {
    // The prefix's chunks whose STORE commit is still in flight (the client may have seen
    // that copy's event complete): wait for them, without the request's mutex.
    if (auto waiting = PendingInPrefix(*chunks); !waiting.empty()) {
      serial.Unlock();
      pending_->Wait(waiting, PendingCommits::kLookupWait);
      serial.Lock();
    }
  }
  const uint64_t requested = static_cast<uint64_t>((key.end - key.start) / config_.chunk_size);
  if (requested == 0) early_exit(EarlyExit::kEmptyChunkHashes);  // under one chunk: no probe
  // With tiers the lookup is registered (superseding any earlier one of the request) before
  // it takes locks; results_.Set below supersedes it again when nothing is prefetched.
  const uint64_t generation = tiers_ ? results_.Begin(key.request_id) : 0;
  // The locks belong to this request: only its own RETRIEVEs, FREE_LOOKUP_LOCKS, next LOOKUP
  // or the read TTL release them.
  const uint32_t world = static_cast<uint32_t>(key.world_size);
  const uint32_t readers = ReadLocksPerSlot(key, req.tp_size);
  size_t hits;
  {
    ScopedPhase index(Phase::kIndex);
    hits = l1_->LookupAndLock(key.request_id, chunks->first_chunk, chunks->keys, world, readers);
  }
  Add(counts.requested_chunks, requested);
  Add(counts.hit_l1_chunks, hits);
  Add(counts.hit_l1_keys, hits * world);  // one object per rank of each hit chunk
  std::optional<l2::ObjectFormat> format;
  if (tiers_ && hits < chunks->keys.size()) format = TierFormatFor(key.model_name, key.world_size);
  if (!format) {
    results_.Set(key.request_id, static_cast<int64_t>(hits));
    return Status::Ok();
  }
  // The L1 prefix stays read-locked (for this request) while the tiers load the rest; then
  // the whole prefix is locked again in one call (LookupAndLock replaces the owner's locks).
  Prefetching pending;
  auto all = std::make_shared<const RequestChunks>(std::move(chunks).value());
  l2::PrefetchRequest p;
  p.chunks.assign(all->keys.begin() + static_cast<std::ptrdiff_t>(hits), all->keys.end());
  for (const auto& c : p.chunks) p.hashes.push_back(c.chunk_hash);
  p.model_name = key.model_name;
  p.cache_salt = key.cache_salt;
  p.world_size = world;
  p.format = *format;
  pending.chunks = std::move(all);
  pending.l1_hits = hits;
  pending.world = world;
  pending.readers = readers;
  pending.request_id = key.request_id;
  pending.generation = generation;
  pending.counts = &counts;
  serial.Unlock();  // the completion may run inside Prefetch
  tiers_->Prefetch(std::move(p), [this, pending = std::move(pending)](size_t loaded) {
    OnPrefetched(pending, loaded);
  });
  return Status::Ok();
}

void Lookups::OnPrefetched(const Prefetching& p, size_t loaded) {
  // However it ends (superseded, its entry gone, finished): a parked WAIT re-checks then.
  struct Ended {
    Lookups* self;
    ~Ended() { self->results_.PrefetchEnded(); }
  } ended{this};
  MutexLock serial(&results_.RequestMutex(p.request_id));
  // A later LOOKUP of the request (or its end, expiry or eviction) supersedes this one: its
  // locks are not ours.
  if (!results_.Current(p.request_id, p.generation)) return;
  size_t total = p.l1_hits;
  if (loaded > 0) {
    std::span<const l1::ChunkKey> prefix(p.chunks->keys.data(), p.l1_hits + loaded);
    total = l1_->LookupAndLock(p.request_id, p.chunks->first_chunk, prefix, p.world, p.readers);
  }
  if (!results_.Finish(p.request_id, p.generation, static_cast<int64_t>(total))) {
    // Unreachable while the request mutex is held and Current held, unless the entry went
    // meanwhile (END_SESSION, expiry, eviction): nobody will read this result, and the
    // request's locks are this lookup's (no newer lookup of it ran: see RequestMutex).
    l1_->ReleaseAllLocks(p.request_id);
    return;
  }
  const size_t more = total > p.l1_hits ? total - p.l1_hits : 0;
  Add(p.counts->hit_l2_chunks, more);
  Add(p.counts->hit_l2_keys, more * p.world);
}

std::vector<l1::ChunkKey> Lookups::PendingInPrefix(const RequestChunks& chunks) const {
  std::vector<l1::ChunkKey> waiting;
  for (const auto& k : chunks.keys) {
    if (pending_->Contains(k)) {
      waiting.push_back(k);
    } else if (!l1_->IsResident(k, 0)) {
      break;  // the hit prefix ends here whatever else commits
    }
  }
  return waiting;
}

std::optional<l2::ObjectFormat> Lookups::TierFormatFor(const std::string& model,
                                                       int64_t world_size) const {
  for (const auto& e : registry_->Snapshot()) {
    const auto& i = *e.instance;
    if (i.model_name == model && i.world_size == world_size && i.tier_format.object_bytes > 0) {
      return i.tier_format;
    }
  }
  return std::nullopt;
}

Result<RequestChunks> Lookups::ChunkKeys(const wire::CacheKey& key) {
  const auto ns = registry_->KeyNamespace(key.model_name, key.world_size);
  if (!ns.registered || !ns.agreed) {
    RequestChunks none;
    none.namespace_known = false;
    return none;
  }
  return RequestChunkKeys(*sessions_, l1_->namespaces(), config_.chunk_size, key,
                          /*create_namespace=*/false, ns.key_namespace);
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
  results_.SessionEnded(request_id);  // its waiter answers 0 now
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
