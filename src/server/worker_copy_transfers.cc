#include "server/worker_copy_transfers.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "layout/layout.h"
#include "server/request_phases.h"
#include "server/tiers.h"

namespace kvd::server {
namespace {

std::string PendingId(const wire::CacheKey& key) {
  return key.request_id + "#" + std::to_string(key.start) + ":" + std::to_string(key.end);
}

// The client writes engine-driven objects itself. Two-plane objects ([2][layers][tokens]
// [hidden]) are token rows, the same at every block size and the same as kvd's own. A
// single-plane object (use_mla: MLA, or K/V fused in the last dimension) may not be: for
// vLLM's CPU cache lmcache 0.5.6 gathers [NB, NH, BS, 2*HS] as rows of [K|V] while vLLM
// keeps BS key rows then BS value rows, so the object's bytes depend on the block size,
// and the registration (hidden size only, no heads or head size) does not say enough to
// reorder them. Such objects are kept apart per block size (docs/layouts.md).
std::string EngineDrivenNamespace(const wire::RegisterEngineDrivenRequest& req) {
  if (!req.use_mla) return "";
  return "engine-driven single-plane block " + std::to_string(req.block_size);
}

HoldLedger::Limits HoldLimits(const ServerConfig& config, uint64_t l1_bytes) {
  HoldLedger::Limits limits;
  const auto l1 = static_cast<double>(l1_bytes);
  limits.total_bytes = static_cast<uint64_t>(config.engine_driven_max_held_fraction * l1);
  limits.instance_bytes = static_cast<uint64_t>(config.engine_driven_instance_held_fraction * l1);
  limits.shed_age_ns = static_cast<int64_t>(config.engine_driven_shed_age_seconds * 1e9);
  return limits;
}

}  // namespace

void WorkerCopyTransfers::PendingRetrieve::Release(l1::L1Cache* l1) {
  l1->ReleaseLocks(request_id, first_chunk, count, slot);
  pins.ReleaseFirstToLast();
}

WorkerCopyTransfers::WorkerCopyTransfers(const ServiceContext& context)
    : config_(*context.config),
      clock_(context.clock),
      l1_(context.l1),
      registry_(context.registry),
      counters_(context.counters),
      io_(context),
      ledger_(HoldLimits(config_, context.l1->capacity_bytes())) {}

WorkerCopyTransfers::~WorkerCopyTransfers() {
  metric_handles_.clear();
  MutexLock lock(&mu_);
  pending_stores_.clear();
  pending_retrieves_.clear();
}

void WorkerCopyTransfers::TakeHolds(const std::vector<HoldLedger::Hold>& holds, Dropped* out) {
  for (const HoldLedger::Hold& h : holds) {
    const PendingKey key{h.instance, h.name};
    if (h.kind == kStaging) {
      auto it = pending_stores_.find(key);
      if (it == pending_stores_.end() || it->second.hold != h.id) continue;
      out->stores.push_back(std::move(it->second));
      pending_stores_.erase(it);
    } else {
      auto it = pending_retrieves_.find(key);
      if (it == pending_retrieves_.end() || it->second.hold != h.id) continue;
      out->retrieves.push_back(std::move(it->second));
      pending_retrieves_.erase(it);
    }
  }
}

void WorkerCopyTransfers::CountShed(const std::vector<HoldLedger::Hold>& shed, const char* op,
                                      int64_t instance_id) {
  if (shed.empty()) return;
  uint64_t stores = 0, bytes = 0;
  for (const HoldLedger::Hold& h : shed) {
    stores += h.kind == kStaging ? 1 : 0;
    bytes += h.bytes;
  }
  staging_shed_ += stores;
  pins_shed_ += shed.size() - stores;
  spdlog::warn("{} of instance {}: shed {} prepared stores and {} prepared retrieves never "
               "committed ({} bytes of L1, each at least {:.1f} s old) to stay within the "
               "engine-driven bounds",
               op, instance_id, stores, shed.size() - stores, bytes,
               static_cast<double>(ledger_.limits().shed_age_ns) / 1e9);
}

void WorkerCopyTransfers::Finish(Dropped dropped) {
  dropped.stores.clear();  // aborts the reservations: the staging objects are freed
  for (PendingRetrieve& r : dropped.retrieves) r.Release(l1_);
}

Result<std::pair<std::string, uint64_t>> WorkerCopyTransfers::Register(
    const wire::RegisterEngineDrivenRequest& req) {
  if (!config_.engine_driven_enabled()) {
    return Status::FailedPrecondition(
        "engine-driven transfers are off (--supported-transfer-mode lmcache_driven)");
  }
  int64_t itemsize = layout::DtypeSize(req.dtype_str);
  int64_t slots = req.num_physical_slots.value_or(config_.chunk_size);
  if (itemsize == 0) return Status::InvalidArgument("dtype_str '" + req.dtype_str + "' unknown");
  if (req.world_size < 1 || req.world_size > kMaxWorldSize || req.num_layers < 1 ||
      req.num_layers > 100000 || req.hidden_dim_size < 1 || req.hidden_dim_size > (1 << 24) ||
      slots < 1 || slots > (1 << 24) || req.block_size < 1) {
    return Status::InvalidArgument("engine-driven registration has out-of-range sizes");
  }
  if (Status st = CheckInstanceIdentity(req.model_name, req.world_size); !st.ok()) return st;
  if (config_.chunk_size % req.block_size != 0) {
    return Status::InvalidArgument("chunk size " + std::to_string(config_.chunk_size) +
                                   " is not a multiple of block size " +
                                   std::to_string(req.block_size));
  }
  auto inst = std::make_shared<Instance>();
  inst->id = req.instance_id;
  WorkerCopies& w = inst->copies.emplace<WorkerCopies>();
  inst->model_name = req.model_name;
  inst->world_size = req.world_size;
  w.dtype = req.dtype_str;
  inst->key_namespace = EngineDrivenNamespace(req);
  if (req.use_mla) {
    w.object_shape = {req.num_layers, slots, req.hidden_dim_size};
  } else {
    w.object_shape = {2, req.num_layers, slots, req.hidden_dim_size};
  }
  __int128 bytes = itemsize;
  for (int64_t d : w.object_shape) bytes *= d;
  if (bytes > static_cast<__int128>(l1_->capacity_bytes())) {
    return Status::InvalidArgument("one chunk object (" +
                                   std::to_string(static_cast<int64_t>(bytes)) +
                                   " bytes) is larger than L1");
  }
  inst->object_bytes = static_cast<uint64_t>(bytes);
  inst->tier_format = TierFormatOfEngineDriven(inst->object_bytes, w.object_shape, w.dtype,
                                               inst->key_namespace);
  io_.FormatRegistered(*inst);
  spdlog::info("registered engine-driven instance {} model '{}' world_size {}: object {} bytes{}",
               req.instance_id, req.model_name, req.world_size, inst->object_bytes,
               inst->key_namespace.empty() ? std::string()
                                           : " (objects kept apart: " + inst->key_namespace + ")");
  const std::string ns = inst->key_namespace;
  registry_->Put(std::move(inst));
  const auto agreed = registry_->KeyNamespace(req.model_name, req.world_size);
  if (!agreed.agreed) {
    spdlog::warn("model '{}' world_size {} now has workers whose objects differ in layout "
                 "(this one: '{}'); lookups for it report no hits until they agree",
                 req.model_name, req.world_size, ns.empty() ? "canonical" : ns);
  }
  return std::make_pair(l1_->shm_name(), l1_->capacity_bytes());
}

Result<std::pair<std::vector<wire::ShmSlot>, std::vector<int64_t>>>
WorkerCopyTransfers::PrepareStore(const wire::EngineDrivenRequest& req) {
  counters_->stores++;
  auto inst = registry_->Find(req.instance_id);
  if (!inst || !inst->engine_driven()) {
    counters_->store_failures++;
    return Status::NotFound("prepare_store: instance " + std::to_string(req.instance_id) +
                            " has no engine-driven context");
  }
  if (Status st = KeyMatchesInstance("prepare_store", req.key, *inst); !st.ok()) {
    counters_->store_failures++;
    return st;
  }
  auto chunks = io_.KeysToWrite(req.key, *inst);  // tokens bound before CommitStore
  if (!chunks.ok()) {
    counters_->store_failures++;
    return chunks.status();
  }
  PendingStore pending;
  pending.started_ns = clock_->NowNanos();
  pending.cache_salt = req.key.cache_salt;
  ScopedPhase index_phase(Phase::kIndex);
  auto reserved = io_.Reserve(chunks->keys, *inst, static_cast<uint32_t>(*req.key.worker_id),
                              /*copy_in_flight=*/false);
  if (!reserved.ok()) {
    counters_->store_failures++;
    return reserved.status();
  }
  pending.writes = std::move(reserved).value();
  std::vector<wire::ShmSlot> slots;
  std::vector<int64_t> indices;
  if (pending.writes.empty()) return std::make_pair(std::move(slots), std::move(indices));
  if (io_.store_hook() && pending.writes.slot() == 0) {
    pending.hooked = std::make_shared<const std::pair<wire::CacheKey, RequestChunks>>(
        req.key, std::move(chunks).value());
  }
  std::vector<uint64_t> sizes;
  sizes.reserve(pending.writes.size());
  for (size_t j = 0; j < pending.writes.size(); ++j) {
    sizes.push_back(pending.writes.reservation(j).size());
  }
  const PendingKey key{req.instance_id, PendingId(req.key)};
  Dropped shed;
  {
    MutexLock lock(&mu_);
    HoldLedger::Admission a =
        ledger_.Admit(req.instance_id, sizes, 1, pending.started_ns, kStaging, key.second);
    if (!a.admitted) {
      refused_++;
      counters_->store_failures++;
      return Status::ResourceExhausted("prepare_store: " + a.refusal);  // aborts the writes
    }
    CountShed(a.shed, "prepare_store", req.instance_id);
    TakeHolds(a.shed, &shed);
    if (a.items < pending.writes.size()) {
      trimmed_chunks_ += pending.writes.size() - a.items;
      pending.writes.Truncate(a.items);
    }
    slots.reserve(pending.writes.size());
    indices.reserve(pending.writes.size());
    for (size_t j = 0; j < pending.writes.size(); ++j) {
      const l1::WriteReservation& r = pending.writes.reservation(j);
      slots.push_back({r.offset(), r.size(), inst->worker().object_shape, inst->worker().dtype});
      indices.push_back(pending.writes.chunk(j));
    }
    pending.hold = a.id;
    // The same request prepared again: the earlier operation goes.
    if (auto old = pending_stores_.find(key); old != pending_stores_.end()) {
      ledger_.Remove(old->second.hold);
      shed.stores.push_back(std::move(old->second));
      old->second = std::move(pending);
    } else {
      pending_stores_.emplace(key, std::move(pending));
    }
  }
  Finish(std::move(shed));
  return std::make_pair(std::move(slots), std::move(indices));
}

Status WorkerCopyTransfers::CommitStore(const wire::EngineDrivenRequest& req) {
  PendingStore pending;
  {
    MutexLock lock(&mu_);
    auto it = pending_stores_.find({req.instance_id, PendingId(req.key)});
    if (it == pending_stores_.end()) {
      counters_->store_failures++;
      return Status::NotFound("commit_store: no prepared store for request '" +
                              req.key.request_id + "'");
    }
    pending = std::move(it->second);
    pending_stores_.erase(it);
    ledger_.Remove(pending.hold);
  }
  if (!req.data.empty()) {
    counters_->store_failures++;
    return Status::InvalidArgument("commit_store: pickled tensor data is not supported; "
                                   "write into the shared-memory slots instead");
  }
  const uint64_t bytes = pending.writes.bytes();
  const std::vector<l1::ChunkKey> committed =
      pending.writes.CommitLastFirst("commit_store: a reservation expired before commit");
  if (pending.hooked && !committed.empty()) {
    io_.store_hook()(CommittedStore{&pending.hooked->first, &pending.hooked->second, committed,
                                    pending.writes.slot()});
  }
  // Written behind in the format the instance is registered with now.
  if (io_.tiers() && !committed.empty()) {
    if (auto inst = registry_->Peek(req.instance_id)) {
      StoreBehind(io_.tiers(), committed, *inst, pending.cache_salt, pending.writes.slot());
    }
  }
  counters_->stored_chunks += pending.writes.size();
  counters_->stored_bytes += bytes;
  return Status::Ok();
}

Result<std::vector<wire::ShmSlot>> WorkerCopyTransfers::PrepareRetrieve(
    const wire::EngineDrivenRequest& req) {
  counters_->retrieves++;
  auto inst = registry_->Find(req.instance_id);
  if (!inst || !inst->engine_driven()) {
    counters_->retrieve_failures++;
    return Status::NotFound("prepare_retrieve: instance " + std::to_string(req.instance_id) +
                            " has no engine-driven context");
  }
  if (Status st = KeyMatchesInstance("prepare_retrieve", req.key, *inst); !st.ok()) {
    counters_->retrieve_failures++;
    return st;
  }
  auto chunks = io_.KeysToRead(req.key, *inst);
  if (!chunks.ok()) {
    counters_->retrieve_failures++;
    return chunks.status();
  }
  const uint64_t count = static_cast<uint64_t>((req.key.end - req.key.start) / config_.chunk_size);
  PendingRetrieve pending;
  pending.slot = static_cast<uint32_t>(*req.key.worker_id);
  pending.started_ns = clock_->NowNanos();
  pending.request_id = req.key.request_id;
  pending.first_chunk = chunks->first_chunk;
  pending.count = count;
  ScopedPhase index_phase(Phase::kIndex);
  // On a failure the locks go first, then the miss's pin, then those taken before it.
  PinMiss miss;
  if (!io_.Pin(*chunks, count, pending.slot, inst->object_bytes, &pending.pins, &miss)) {
    l1_->ReleaseLocks(pending.request_id, pending.first_chunk, count, pending.slot);
    counters_->retrieve_failures++;
    return Status::NotFound("prepare_retrieve: chunk " + std::to_string(miss.chunk) +
                            " is not in L1");
  }
  std::vector<wire::ShmSlot> slots;
  std::vector<uint64_t> sizes;
  slots.reserve(pending.pins.size());
  sizes.reserve(pending.pins.size());
  for (const l1::ReadPin& pin : pending.pins) {
    slots.push_back({pin.offset(), pin.size(), inst->worker().object_shape, inst->worker().dtype});
    sizes.push_back(pin.size());
  }
  const PendingKey key{req.instance_id, PendingId(req.key)};
  Dropped shed;
  std::string refusal;
  {
    MutexLock lock(&mu_);
    HoldLedger::Admission a = ledger_.Admit(req.instance_id, sizes, sizes.size(),
                                            pending.started_ns, kPins, key.second);
    if (a.admitted) {
      CountShed(a.shed, "prepare_retrieve", req.instance_id);
      TakeHolds(a.shed, &shed);
      pending.hold = a.id;
      if (auto old = pending_retrieves_.find(key); old != pending_retrieves_.end()) {
        ledger_.Remove(old->second.hold);
        shed.retrieves.push_back(std::move(old->second));
        old->second = std::move(pending);
      } else {
        pending_retrieves_.emplace(key, std::move(pending));
      }
    } else {
      refusal = std::move(a.refusal);
      shed.retrieves.push_back(std::move(pending));  // released below
    }
  }
  Finish(std::move(shed));
  if (!refusal.empty()) {
    refused_++;
    counters_->retrieve_failures++;
    return Status::ResourceExhausted("prepare_retrieve: " + refusal);
  }
  return slots;
}

Status WorkerCopyTransfers::CommitRetrieve(const wire::EngineDrivenRequest& req) {
  PendingRetrieve pending;
  {
    MutexLock lock(&mu_);
    auto it = pending_retrieves_.find({req.instance_id, PendingId(req.key)});
    if (it == pending_retrieves_.end()) {
      return Status::NotFound("commit_retrieve: no prepared retrieve for request '" +
                              req.key.request_id + "'");
    }
    pending = std::move(it->second);
    pending_retrieves_.erase(it);
    ledger_.Remove(pending.hold);
  }
  counters_->retrieved_chunks += pending.count;
  for (const auto& p : pending.pins) counters_->retrieved_bytes += p.size();
  pending.Release(l1_);  // the locks, then the pins (and tells the tiers)
  return Status::Ok();
}

void WorkerCopyTransfers::DropInstance(int64_t instance_id) {
  Dropped dropped;
  {
    MutexLock lock(&mu_);
    TakeHolds(ledger_.RemoveInstance(instance_id), &dropped);
  }
  Finish(std::move(dropped));
}

void WorkerCopyTransfers::ExpirePending() {
  // A worker that prepared and never committed: its reservations and pins go back after
  // the hold timeout (or the write / read TTL, if shorter), pings or not.
  const int64_t now = clock_->NowNanos();
  const double hold_s = config_.engine_driven_hold_timeout_seconds;
  const auto wttl = static_cast<int64_t>(std::min(config_.l1_write_ttl_seconds, hold_s) * 1e9);
  const auto rttl = static_cast<int64_t>(std::min(config_.l1_read_ttl_seconds, hold_s) * 1e9);
  Dropped dropped;
  {
    MutexLock lock(&mu_);
    for (auto it = pending_stores_.begin(); it != pending_stores_.end();) {
      if (now - it->second.started_ns <= wttl) {
        ++it;
        continue;
      }
      ledger_.Remove(it->second.hold);
      dropped.stores.push_back(std::move(it->second));
      it = pending_stores_.erase(it);
    }
    for (auto it = pending_retrieves_.begin(); it != pending_retrieves_.end();) {
      if (now - it->second.started_ns <= rttl) {
        ++it;
        continue;
      }
      ledger_.Remove(it->second.hold);
      dropped.retrieves.push_back(std::move(it->second));
      it = pending_retrieves_.erase(it);
    }
  }
  if (!dropped.stores.empty() || !dropped.retrieves.empty()) {
    staging_expired_ += dropped.stores.size();
    pins_expired_ += dropped.retrieves.size();
    spdlog::warn("engine-driven: dropped {} prepared stores and {} prepared retrieves not "
                 "committed within {:.0f} / {:.0f} s", dropped.stores.size(),
                 dropped.retrieves.size(), static_cast<double>(wttl) / 1e9,
                 static_cast<double>(rttl) / 1e9);
  }
  Finish(std::move(dropped));
}

uint64_t WorkerCopyTransfers::HeldBytes() const {
  MutexLock lock(&mu_);
  return ledger_.held_bytes();
}

uint64_t WorkerCopyTransfers::HeldBytes(int64_t instance_id) const {
  MutexLock lock(&mu_);
  return ledger_.held_bytes(instance_id);
}

WorkerCopyTransfers::HoldStats WorkerCopyTransfers::hold_stats() const {
  HoldStats s;
  s.staging_shed = staging_shed_.load();
  s.pins_shed = pins_shed_.load();
  s.staging_expired = staging_expired_.load();
  s.pins_expired = pins_expired_.load();
  s.refused = refused_.load();
  s.trimmed_chunks = trimmed_chunks_.load();
  s.held_bytes = HeldBytes();
  return s;
}

void WorkerCopyTransfers::RegisterMetrics(metrics::Registry& registry) {
  using metrics::Kind;
  struct Family {
    const char* name;
    Kind kind;
    const char* help;
    uint64_t HoldStats::*value;
  };
  static constexpr Family kFamilies[] = {
      {"kvd_engine_driven_staging_shed_total", Kind::kCounter,
       "Prepared engine-driven stores never committed, shed to make room within the bounds.",
       &HoldStats::staging_shed},
      {"kvd_engine_driven_pins_shed_total", Kind::kCounter,
       "Prepared engine-driven retrieves never committed, shed (pins released) to make room.",
       &HoldStats::pins_shed},
      {"kvd_engine_driven_staging_expired_total", Kind::kCounter,
       "Prepared engine-driven stores dropped for not committing within the hold timeout.",
       &HoldStats::staging_expired},
      {"kvd_engine_driven_pins_expired_total", Kind::kCounter,
       "Prepared engine-driven retrieves dropped (pins released) for not committing in time.",
       &HoldStats::pins_expired},
      {"kvd_engine_driven_prepares_refused_total", Kind::kCounter,
       "PREPARE_STORE / PREPARE_RETRIEVE refused: nothing fit within the held-bytes bounds.",
       &HoldStats::refused},
      {"kvd_engine_driven_trimmed_chunks_total", Kind::kCounter,
       "Chunks of PREPARE_STORE given no slot: only a prefix fit within the bounds.",
       &HoldStats::trimmed_chunks},
      {"kvd_engine_driven_held_bytes", Kind::kGauge,
       "Bytes of L1 objects held by prepared, uncommitted engine-driven operations.",
       &HoldStats::held_bytes},
  };
  for (const Family& f : kFamilies) {
    metric_handles_.push_back(registry.AddCollected(
        {f.name, f.help, f.kind, {}, {}}, [this, v = f.value](metrics::SeriesSink& sink) {
          sink.Add(static_cast<double>(hold_stats().*v));
        }));
  }
}

std::pair<size_t, size_t> WorkerCopyTransfers::PendingCounts() const {
  MutexLock lock(&mu_);
  return {pending_stores_.size(), pending_retrieves_.size()};
}

}  // namespace kvd::server
