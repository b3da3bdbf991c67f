#include "server/kv_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <thread>
#include <unistd.h>

#include "transfer/cpu_copy.h"

namespace kvd::server {
namespace {

l1::ChunkKey MakeChunkKey(const std::string& model, int64_t world_size, const std::string& salt,
                          const keys::Hash32& h) {
  l1::ChunkKey k;
  k.model_name = model;
  k.world_size = static_cast<int32_t>(world_size);
  k.cache_salt = salt;
  k.chunk_hash = h;
  return k;
}

std::string PendingId(const wire::CacheKey& key) {
  return key.request_id + "#" + std::to_string(key.start) + ":" + std::to_string(key.end);
}

// GPU instances: hands the chunk tasks to the instance's copy engine. `on_complete` runs once
// the device copy finished (it commits reservations / drops pins it captured); if the engine
// refuses the plan, nothing was enqueued and dropping the plan releases what it captured.
Status SubmitToEngine(transfer::CopyEngine& engine, transfer::CopyDirection direction,
                      const wire::TransferRequest& req, std::vector<transfer::ChunkTask> tasks,
                      std::function<void(const Status&)> on_complete, std::string* event_handle) {
  if (event_handle) event_handle->clear();
  if (tasks.empty()) {  // nothing for the device to do: an empty handle says so
    on_complete(Status::Ok());
    return Status::Ok();
  }
  transfer::CopyPlan plan;
  plan.direction = direction;
  plan.block_ids = req.block_ids;
  plan.tasks = std::move(tasks);
  plan.wait_event = req.event_handle;
  plan.on_complete = std::move(on_complete);
  auto sub = engine.Submit(std::move(plan));
  if (!sub.ok()) return sub.status();
  if (event_handle) *event_handle = sub->event_handle;
  return sub->status;
}

}  // namespace

Result<std::unique_ptr<KvService>> KvService::Create(const ServerConfig& config,
                                                     const Clock* clock) {
  l1::L1CacheOptions o;
  o.capacity_bytes = config.l1_size_bytes();
  o.shm_name = config.shm_name;
  o.read_ttl_seconds = config.l1_read_ttl_seconds;
  o.write_ttl_seconds = config.l1_write_ttl_seconds;
  o.eviction_watermark = config.eviction_trigger_watermark;
  o.eviction_ratio = config.eviction_ratio;
  o.clock = clock;
  auto l1 = l1::L1Cache::Create(o);
  if (!l1.ok()) return l1.status();
  return std::unique_ptr<KvService>(new KvService(config, clock, std::move(l1).value()));
}

KvService::KvService(const ServerConfig& config, const Clock* clock,
                     std::unique_ptr<l1::L1Cache> l1)
    : config_(config),
      clock_(clock),
      l1_(std::move(l1)),
      sessions_(clock, static_cast<uint32_t>(config.chunk_size), config.session_ttl_seconds),
      copy_threads_(config.copy_threads > 0
                        ? config.copy_threads
                        : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8)) {}

KvService::~KvService() {
  std::lock_guard<std::mutex> lock(pending_mu_);
  pending_stores_.clear();
  pending_retrieves_.clear();
}

size_t KvService::num_instances() const {
  std::lock_guard<std::mutex> lock(mu_);
  return instances_.size();
}

std::shared_ptr<const Instance> KvService::FindInstance(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = instances_.find(id);
  if (it == instances_.end()) return nullptr;
  last_seen_ns_[id] = clock_->NowNanos();
  return it->second;
}

bool KvService::ModelRegistered(const std::string& model, int64_t world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, inst] : instances_) {
    if (inst->model_name == model && inst->world_size == world_size) return true;
  }
  return false;
}

uint32_t KvService::ReadLocksPerSlot(const wire::CacheKey& key, int64_t tp_size) const {
  // Each reader's RETRIEVE releases one lock on its own object. 0.5.6 clients say how many
  // readers an object has; older ones did not (then: the TP size reads an MLA object).
  int64_t n = key.num_kv_readers > 0 ? key.num_kv_readers
                                     : (key.world_size == 1 ? std::max<int64_t>(1, tp_size) : 1);
  return static_cast<uint32_t>(std::clamp<int64_t>(n, 1, l1::L1Cache::kMaxReadLocksPerSlot));
}

bool KvService::ChunkIsAllNull(const layout::KvLayout& layout,
                               const std::vector<std::vector<int64_t>>& block_ids,
                               int64_t chunk) const {
  for (const auto& g : layout.groups) {
    const int64_t bpc = layout.chunk_tokens / g.tokens_per_block;
    const auto& ids = block_ids[g.engine_group];
    for (int64_t b = chunk * bpc; b < (chunk + 1) * bpc; ++b) {
      if (ids[b] != config_.null_block_id) return false;
    }
  }
  return true;
}

int KvService::CopyThreads(uint64_t bytes) const {
  // Threads pay off only for large copies: about one per 4 MiB, at most copy_threads.
  constexpr uint64_t kBytesPerThread = 4ull << 20;
  return static_cast<int>(std::clamp<uint64_t>(bytes / kBytesPerThread, 1, copy_threads_));
}

Result<std::vector<l1::ChunkKey>> KvService::ChunkKeys(const wire::CacheKey& key) {
  const int64_t c = config_.chunk_size;
  if (key.start % c != 0 || key.end % c != 0) {
    return Status::InvalidArgument("token range [" + std::to_string(key.start) + ", " +
                                   std::to_string(key.end) + ") is not aligned to chunk size " +
                                   std::to_string(c));
  }
  auto hashes = sessions_.ChunkHashes(key.request_id, key.token_ids,
                                      static_cast<size_t>(key.end / c),
                                      SessionIdentity{key.model_name, key.world_size, key.cache_salt});
  if (!hashes.ok()) return hashes.status();
  std::vector<l1::ChunkKey> out;
  out.reserve(static_cast<size_t>((key.end - key.start) / c));
  for (int64_t i = key.start / c; i < key.end / c; ++i) {
    out.push_back(MakeChunkKey(key.model_name, key.world_size, key.cache_salt, (*hashes)[i]));
  }
  return out;
}

Status KvService::RegisterKvCache(const wire::RegisterKvCacheRequest& req) {
  if (req.world_size < 1 || req.world_size > 4096) {
    return Status::InvalidArgument("world_size " + std::to_string(req.world_size) +
                                   " out of range [1, 4096]");
  }
  if (req.model_name.empty() || req.model_name.find('@') != std::string::npos) {
    return Status::InvalidArgument("model_name must be non-empty and must not contain '@'");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = instances_.find(req.instance_id);
    if (it != instances_.end() && !it->second->engine_driven &&
        it->second->model_name == req.model_name && it->second->world_size == req.world_size &&
        it->second->tensor_bases.size() == req.tensors.size()) {
      last_seen_ns_[req.instance_id] = clock_->NowNanos();
      return Status::Ok();  // re-registration after a recovery: liveness only
    }
  }
  const bool on_gpu = std::any_of(req.tensors.begin(), req.tensors.end(), [](const auto& t) {
    return t.memory != wire::TensorMemory::kCpuShm;
  });
  auto layout = layout::BuildLayout(req.tensors, req.layout_hints, req.group_infos,
                                    config_.chunk_size);
  if (!layout.ok()) return layout.status();
  auto inst = std::make_shared<Instance>();
  inst->id = req.instance_id;
  inst->model_name = req.model_name;
  inst->world_size = req.world_size;
  inst->object_bytes = layout->object_bytes;
  if (on_gpu) {
    // GPU KV caches (CUDA IPC): the device engine opens them; it refuses a registration
    // that mixes in CPU tensors, and says so when this build or machine has no CUDA.
    auto engine = transfer::MakeDeviceEngine(req.tensors, *layout,
                                             {l1_->base(), l1_->capacity_bytes()}, req.instance_id);
    if (!engine.ok()) return engine.status();
    inst->engine = std::move(engine).value();
    inst->tensor_bases.assign(req.tensors.size(), nullptr);
  } else {
    // Map each distinct segment once, covering every tensor that lives in it.
    std::map<std::string, uint64_t> need;
    for (const auto& t : req.tensors) need[t.shm_name] = std::max(need[t.shm_name], t.nbytes);
    std::map<std::string, uint8_t*> base_of;
    for (const auto& [name, nbytes] : need) {
      auto m = transfer::ShmMapping::Open(name, nbytes);
      if (!m.ok()) return m.status();
      base_of[name] = m->data();
      inst->mappings.push_back(std::move(m).value());
    }
    for (const auto& t : req.tensors) inst->tensor_bases.push_back(base_of[t.shm_name]);
  }
  inst->layout = std::move(layout).value();
  spdlog::info("registered instance {} model '{}' world_size {}: {} tensors, {}", req.instance_id,
               req.model_name, req.world_size, req.tensors.size(), inst->layout.Describe());
  std::lock_guard<std::mutex> lock(mu_);
  instances_[req.instance_id] = std::move(inst);
  last_seen_ns_[req.instance_id] = clock_->NowNanos();
  return Status::Ok();
}

Status KvService::Unregister(int64_t instance_id) {
  std::shared_ptr<const Instance> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = instances_.find(instance_id);
    if (it == instances_.end()) {
      return Status::NotFound("instance " + std::to_string(instance_id) + " is not registered");
    }
    gone = std::move(it->second);
    instances_.erase(it);
    last_seen_ns_.erase(instance_id);
    pinged_.erase(instance_id);
  }
  {
    // Drop the instance's half-done engine-driven operations.
    std::lock_guard<std::mutex> lock(pending_mu_);
    std::erase_if(pending_stores_, [&](const auto& kv) { return kv.first.first == instance_id; });
    std::erase_if(pending_retrieves_, [&](const auto& kv) { return kv.first.first == instance_id; });
  }
  spdlog::info("unregistered instance {} (model '{}')", instance_id, gone->model_name);
  return Status::Ok();  // mappings are released when the last in-flight copy lets go
}

Status KvService::Store(const wire::TransferRequest& req, std::string* event_handle) {
  counters_.stores++;
  auto inst = FindInstance(req.instance_id);
  if (!inst || inst->engine_driven) {
    counters_.store_failures++;
    return Status::NotFound("store: instance " + std::to_string(req.instance_id) +
                            " has no registered KV cache");
  }
  if (req.key.model_name != inst->model_name || req.key.world_size != inst->world_size) {
    counters_.store_failures++;
    return Status::InvalidArgument("store: key names model '" + req.key.model_name +
                                   "' world_size " + std::to_string(req.key.world_size) +
                                   ", the instance registered '" + inst->model_name + "' " +
                                   std::to_string(inst->world_size));
  }
  auto keys = ChunkKeys(req.key);
  if (!keys.ok()) {
    counters_.store_failures++;
    return keys.status();
  }
  const int64_t n = static_cast<int64_t>(keys->size());
  if (Status st = transfer::ValidateBlockIds(inst->layout, req.block_ids, n); !st.ok()) {
    counters_.store_failures++;
    return st;
  }
  const uint32_t slot = static_cast<uint32_t>(*req.key.worker_id);
  const uint32_t num_slots = static_cast<uint32_t>(inst->world_size);
  std::vector<std::pair<int64_t, l1::WriteReservation>> todo;
  for (int64_t i = 0; i < n; ++i) {
    // A chunk whose blocks are all the engine's null block holds no KV (e.g. align-mode
    // Mamba chunks before the last state): storing it would serve garbage to a later hit.
    if (ChunkIsAllNull(inst->layout, req.block_ids, i)) continue;
    auto r = l1_->ReserveWrite((*keys)[i], num_slots, slot, inst->object_bytes);
    if (r.ok()) {
      todo.emplace_back(i, std::move(r).value());
    } else if (r.status().code() != StatusCode::kAlreadyExists) {
      counters_.store_failures++;
      return r.status();  // reservations made so far are aborted by their destructors
    }
  }
  std::vector<transfer::ChunkTask> tasks;
  tasks.reserve(todo.size());
  for (auto& [i, res] : todo) tasks.push_back({i, res.data(), 0});
  if (inst->engine) {  // GPU: committed by the engine's completion, after the D2H copy
    auto held = std::make_shared<std::vector<l1::WriteReservation>>();
    uint64_t bytes = 0;
    for (auto& [i, res] : todo) {
      bytes += res.size();
      held->push_back(std::move(res));
    }
    Status st = SubmitToEngine(
        *inst->engine, transfer::CopyDirection::kGather, req, std::move(tasks),
        [held](const Status& done) {
          if (done.ok()) {
            for (auto& r : *held) {
              if (!r.Commit()) spdlog::debug("store: a reservation expired before the GPU copy ended");
            }
          }
          held->clear();  // aborts what was not committed
        },
        event_handle);
    if (!st.ok()) {
      counters_.store_failures++;
      return st;
    }
    counters_.stored_chunks += todo.size();
    counters_.stored_bytes += bytes;
    return Status::Ok();
  }
  transfer::GatherChunks(inst->layout, inst->tensor_bases, req.block_ids, tasks,
                         CopyThreads(tasks.size() * inst->object_bytes));
  uint64_t bytes = 0;
  for (auto& [i, res] : todo) {
    bytes += res.size();
    if (!res.Commit()) spdlog::debug("store: chunk {} lost its reservation before commit", i);
  }
  counters_.stored_chunks += todo.size();
  counters_.stored_bytes += bytes;
  return Status::Ok();
}

Status KvService::Retrieve(const wire::TransferRequest& req, std::string* event_handle) {
  counters_.retrieves++;
  auto fail = [&](Status st) {
    counters_.retrieve_failures++;
    return st;
  };
  auto inst = FindInstance(req.instance_id);
  if (!inst || inst->engine_driven) {
    return fail(Status::NotFound("retrieve: instance " + std::to_string(req.instance_id) +
                                 " has no registered KV cache"));
  }
  if (req.key.model_name != inst->model_name || req.key.world_size != inst->world_size) {
    return fail(Status::InvalidArgument("retrieve: key does not match the instance's model"));
  }
  auto keys = ChunkKeys(req.key);
  if (!keys.ok()) return fail(keys.status());
  const int64_t n = static_cast<int64_t>(keys->size());
  if (Status st = transfer::ValidateBlockIds(inst->layout, req.block_ids, n); !st.ok()) {
    return fail(st);
  }
  const uint32_t slot = static_cast<uint32_t>(*req.key.worker_id);
  // This reader is done with the lookup's locks whatever happens below.
  struct ReleaseLocks {
    l1::L1Cache* l1;
    const std::vector<l1::ChunkKey>* keys;
    uint32_t slot;
    ~ReleaseLocks() {
      for (const auto& k : *keys) l1->ReleaseReadLocks(k, slot, 1);
    }
  } release{l1_.get(), &*keys, slot};
  std::vector<l1::ReadPin> pins;
  pins.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    auto pin = l1_->PinForRead((*keys)[i], slot);
    if (!pin.ok()) {
      return fail(Status::NotFound("retrieve: chunk " + std::to_string(i) + " of [" +
                                   std::to_string(req.key.start) + ", " +
                                   std::to_string(req.key.end) + ") is not in L1"));
    }
    if (pin->size() != inst->object_bytes) {
      return fail(Status::FailedPrecondition("retrieve: stored object has " +
                                             std::to_string(pin->size()) + " bytes, layout needs " +
                                             std::to_string(inst->object_bytes)));
    }
    pins.push_back(std::move(pin).value());
  }
  std::vector<transfer::ChunkTask> tasks;
  tasks.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t skip = req.skip_first_n_tokens - i * config_.chunk_size;
    if (skip >= config_.chunk_size) continue;  // the whole chunk is the engine's already
    tasks.push_back({i, const_cast<uint8_t*>(pins[i].data()), std::max<int64_t>(skip, 0)});
  }
  if (inst->engine) {  // GPU: the pins live until the engine's H2D copies are done
    auto held = std::make_shared<std::vector<l1::ReadPin>>(std::move(pins));
    Status st = SubmitToEngine(
        *inst->engine, transfer::CopyDirection::kScatter, req, std::move(tasks),
        [held](const Status&) { held->clear(); }, event_handle);
    if (!st.ok()) return fail(st);
    counters_.retrieved_chunks += n;
    counters_.retrieved_bytes += n * inst->object_bytes;
    return Status::Ok();
  }
  transfer::ScatterChunks(inst->layout, inst->tensor_bases, req.block_ids, tasks,
                          CopyThreads(tasks.size() * inst->object_bytes));
  counters_.retrieved_chunks += n;
  counters_.retrieved_bytes += n * inst->object_bytes;
  return Status::Ok();
}

Status KvService::Lookup(const wire::LookupRequest& req) {
  counters_.lookups++;
  const auto& key = req.key;
  if (!ModelRegistered(key.model_name, key.world_size)) {
    // No worker of this model has registered: nothing can be retrieved, so 0 hits.
    sessions_.SetLookupResult(key.request_id, 0);
    return Status::Ok();
  }
  auto keys = ChunkKeys(key);
  if (!keys.ok()) {
    sessions_.SetLookupResult(key.request_id, 0);
    return keys.status();
  }
  size_t hits = l1_->LookupPrefixAndLock(*keys, static_cast<uint32_t>(key.world_size),
                                         ReadLocksPerSlot(key, req.tp_size));
  counters_.lookup_chunks += keys->size();
  counters_.hit_chunks += hits;
  sessions_.SetLookupResult(key.request_id, static_cast<int64_t>(hits));
  return Status::Ok();
}

std::optional<int64_t> KvService::QueryPrefetchStatus(const std::string& request_id) {
  return sessions_.TakeLookupResult(request_id);
}

Status KvService::FreeLookupLocks(const wire::LookupRequest& req) {
  auto keys = ChunkKeys(req.key);
  if (!keys.ok()) return keys.status();
  l1_->ReleaseReadLocksAllSlots(*keys, ReadLocksPerSlot(req.key, req.tp_size));
  return Status::Ok();
}

void KvService::EndSession(const std::string& request_id) {
  auto [identity, hashes] = sessions_.End(request_id);
  if (hashes.empty()) return;
  std::vector<l1::ChunkKey> keys;
  keys.reserve(hashes.size());
  for (const auto& h : hashes) {
    keys.push_back(MakeChunkKey(identity.model_name, identity.world_size, identity.cache_salt, h));
  }
  l1_->Touch(keys);
}

Result<std::pair<std::string, uint64_t>> KvService::RegisterEngineDriven(
    const wire::RegisterEngineDrivenRequest& req) {
  int64_t itemsize = layout::DtypeSize(req.dtype_str);
  int64_t slots = req.num_physical_slots.value_or(config_.chunk_size);
  if (itemsize == 0) return Status::InvalidArgument("dtype_str '" + req.dtype_str + "' unknown");
  if (req.world_size < 1 || req.world_size > 4096 || req.num_layers < 1 ||
      req.num_layers > 100000 || req.hidden_dim_size < 1 || req.hidden_dim_size > (1 << 24) ||
      slots < 1 || slots > (1 << 24) || req.block_size < 1) {
    return Status::InvalidArgument("engine-driven registration has out-of-range sizes");
  }
  if (config_.chunk_size % req.block_size != 0) {
    return Status::InvalidArgument("chunk size " + std::to_string(config_.chunk_size) +
                                   " is not a multiple of block size " +
                                   std::to_string(req.block_size));
  }
  auto inst = std::make_shared<Instance>();
  inst->id = req.instance_id;
  inst->engine_driven = true;
  inst->model_name = req.model_name;
  inst->world_size = req.world_size;
  inst->dtype = req.dtype_str;
  if (req.use_mla) {
    inst->object_shape = {req.num_layers, slots, req.hidden_dim_size};
  } else {
    inst->object_shape = {2, req.num_layers, slots, req.hidden_dim_size};
  }
  __int128 bytes = itemsize;
  for (int64_t d : inst->object_shape) bytes *= d;
  if (bytes > static_cast<__int128>(l1_->capacity_bytes())) {
    return Status::InvalidArgument("one chunk object (" + std::to_string(static_cast<int64_t>(bytes)) +
                                   " bytes) is larger than L1");
  }
  inst->object_bytes = static_cast<uint64_t>(bytes);
  spdlog::info("registered engine-driven instance {} model '{}' world_size {}: object {} bytes",
               req.instance_id, req.model_name, req.world_size, inst->object_bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    instances_[req.instance_id] = std::move(inst);
    last_seen_ns_[req.instance_id] = clock_->NowNanos();
  }
  return std::make_pair(l1_->shm_name(), l1_->capacity_bytes());
}

Result<std::pair<std::vector<wire::ShmSlot>, std::vector<int64_t>>> KvService::PrepareStore(
    const wire::EngineDrivenRequest& req) {
  counters_.stores++;
  auto inst = FindInstance(req.instance_id);
  if (!inst || !inst->engine_driven) {
    counters_.store_failures++;
    return Status::NotFound("prepare_store: instance " + std::to_string(req.instance_id) +
                            " has no engine-driven context");
  }
  auto keys = ChunkKeys(req.key);
  if (!keys.ok()) {
    counters_.store_failures++;
    return keys.status();
  }
  PendingStore pending;
  pending.started_ns = clock_->NowNanos();
  std::vector<wire::ShmSlot> slots;
  std::vector<int64_t> indices;
  for (size_t i = 0; i < keys->size(); ++i) {
    auto r = l1_->ReserveWrite((*keys)[i], static_cast<uint32_t>(inst->world_size),
                               static_cast<uint32_t>(*req.key.worker_id), inst->object_bytes);
    if (r.ok()) {
      slots.push_back({r->offset(), r->size(), inst->object_shape, inst->dtype});
      indices.push_back(static_cast<int64_t>(i));
      pending.reservations.push_back(std::move(r).value());
    } else if (r.status().code() != StatusCode::kAlreadyExists) {
      counters_.store_failures++;
      return r.status();
    }
  }
  if (!pending.reservations.empty()) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending_stores_[{req.instance_id, PendingId(req.key)}] = std::move(pending);
  }
  return std::make_pair(std::move(slots), std::move(indices));
}

Status KvService::CommitStore(const wire::EngineDrivenRequest& req) {
  PendingStore pending;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto it = pending_stores_.find({req.instance_id, PendingId(req.key)});
    if (it == pending_stores_.end()) {
      counters_.store_failures++;
      return Status::NotFound("commit_store: no prepared store for request '" +
                              req.key.request_id + "'");
    }
    pending = std::move(it->second);
    pending_stores_.erase(it);
  }
  if (!req.data.empty()) {
    counters_.store_failures++;
    return Status::InvalidArgument("commit_store: pickled tensor data is not supported; "
                                   "write into the shared-memory slots instead");
  }
  uint64_t bytes = 0;
  for (auto& r : pending.reservations) {
    bytes += r.size();
    if (!r.Commit()) spdlog::debug("commit_store: a reservation expired before commit");
  }
  counters_.stored_chunks += pending.reservations.size();
  counters_.stored_bytes += bytes;
  return Status::Ok();
}

Result<std::vector<wire::ShmSlot>> KvService::PrepareRetrieve(const wire::EngineDrivenRequest& req) {
  counters_.retrieves++;
  auto inst = FindInstance(req.instance_id);
  if (!inst || !inst->engine_driven) {
    counters_.retrieve_failures++;
    return Status::NotFound("prepare_retrieve: instance " + std::to_string(req.instance_id) +
                            " has no engine-driven context");
  }
  auto keys = ChunkKeys(req.key);
  if (!keys.ok()) {
    counters_.retrieve_failures++;
    return keys.status();
  }
  PendingRetrieve pending;
  pending.slot = static_cast<uint32_t>(*req.key.worker_id);
  pending.started_ns = clock_->NowNanos();
  std::vector<wire::ShmSlot> slots;
  for (size_t i = 0; i < keys->size(); ++i) {
    auto pin = l1_->PinForRead((*keys)[i], pending.slot);
    if (!pin.ok() || pin->size() != inst->object_bytes) {
      for (const auto& k : *keys) l1_->ReleaseReadLocks(k, pending.slot, 1);
      counters_.retrieve_failures++;
      return Status::NotFound("prepare_retrieve: chunk " + std::to_string(i) + " is not in L1");
    }
    slots.push_back({pin->offset(), pin->size(), inst->object_shape, inst->dtype});
    pending.pins.push_back(std::move(pin).value());
  }
  pending.keys = std::move(keys).value();
  std::lock_guard<std::mutex> lock(pending_mu_);
  pending_retrieves_[{req.instance_id, PendingId(req.key)}] = std::move(pending);
  return slots;
}

Status KvService::CommitRetrieve(const wire::EngineDrivenRequest& req) {
  PendingRetrieve pending;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto it = pending_retrieves_.find({req.instance_id, PendingId(req.key)});
    if (it == pending_retrieves_.end()) {
      return Status::NotFound("commit_retrieve: no prepared retrieve for request '" +
                              req.key.request_id + "'");
    }
    pending = std::move(it->second);
    pending_retrieves_.erase(it);
  }
  for (const auto& k : pending.keys) l1_->ReleaseReadLocks(k, pending.slot, 1);
  counters_.retrieved_chunks += pending.keys.size();
  for (const auto& p : pending.pins) counters_.retrieved_bytes += p.size();
  return Status::Ok();
}

void KvService::Ping(std::optional<int64_t> instance_id) {
  if (!instance_id) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (instances_.count(*instance_id)) {
    last_seen_ns_[*instance_id] = clock_->NowNanos();
    pinged_.insert(*instance_id);
  }
}

void KvService::Clear() {
  l1_->Clear();
  spdlog::info("L1 cleared");
}

void KvService::Maintain() {
  sessions_.Expire();
  const int64_t now = clock_->NowNanos();
  {
    // A worker that prepared and never committed: its reservations and pins go back
    // after the write / read TTL.
    std::lock_guard<std::mutex> lock(pending_mu_);
    const auto wttl = static_cast<int64_t>(config_.l1_write_ttl_seconds * 1e9);
    const auto rttl = static_cast<int64_t>(config_.l1_read_ttl_seconds * 1e9);
    std::erase_if(pending_stores_, [&](const auto& kv) { return now - kv.second.started_ns > wttl; });
    std::erase_if(pending_retrieves_, [&](const auto& kv) { return now - kv.second.started_ns > rttl; });
  }
  if (config_.worker_reap_timeout_seconds > 0) {
    const auto limit = static_cast<int64_t>(config_.worker_reap_timeout_seconds * 1e9);
    const auto grace = static_cast<int64_t>(
        std::max(config_.worker_registration_grace_seconds, config_.worker_reap_timeout_seconds) * 1e9);
    struct Silent {
      int64_t id;
      int64_t ns;
      bool pinged;
    };
    std::vector<Silent> silent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, seen] : last_seen_ns_) {
        const bool pinged = pinged_.count(id) > 0;
        if (now - seen > (pinged ? limit : grace)) silent.push_back({id, now - seen, pinged});
      }
    }
    for (const auto& [id, ns, pinged] : silent) {
      spdlog::warn("reaping instance {}: silent for {:.0f} s (limit {} s, {})", id,
                   static_cast<double>(ns) * 1e-9,
                   pinged ? config_.worker_reap_timeout_seconds
                          : std::max(config_.worker_registration_grace_seconds,
                                     config_.worker_reap_timeout_seconds),
                   pinged ? "it had been pinging" : "it never pinged");
      (void)Unregister(id);
    }
  }
  l1_->EvictToWatermark();
}

}  // namespace kvd::server
