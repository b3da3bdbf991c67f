#include "server/kvd_copy_transfers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "server/request_phases.h"
#include "server/tiers.h"
#include "transfer/copy_engine.h"
#include "transfer/shm_mapping.h"

namespace kvd::server {
namespace {

// Everything a REGISTER_KV_CACHE says, in one string: two registrations describe the same
// memory and layout exactly when their fingerprints are equal.
std::string RegistrationFingerprint(const wire::RegisterKvCacheRequest& req) {
  std::string s;
  auto put = [&](const auto& v) {
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>) {
      s += std::to_string(v.size());
      s += ':';
      s += v;
    } else if constexpr (std::is_same_v<T, bool>) {
      s += v ? 'T' : 'F';
    } else {
      s += std::to_string(v);
    }
    s += ';';
  };
  auto put_opt = [&](const auto& o) {
    if (o) {
      put(*o);
    } else {
      s += "-;";
    }
  };
  auto put_list = [&](const std::vector<int64_t>& v) {
    put(static_cast<int64_t>(v.size()));
    for (int64_t x : v) put(x);
  };
  put(req.model_name);
  put(req.world_size);
  put(req.engine_type);
  put(static_cast<int64_t>(req.tensors.size()));
  for (const auto& t : req.tensors) {
    put(static_cast<int64_t>(t.memory));
    put(t.dtype);
    put_list(t.shape);
    put_list(t.stride);
    put(t.storage_offset);
    put(t.device_uuid);
    put(t.shm_name);
    put(t.nbytes);
    put(t.cuda_device_index);
    put(t.cuda_mem_handle);
    put(t.cuda_storage_size);
    put(t.cuda_storage_offset_bytes);
    put(t.cuda_event_handle);
    put(t.cuda_event_sync_required);
    put(t.raw_ipc_handle);
    put(t.raw_alloc_offset);
  }
  const auto& h = req.layout_hints;
  put_opt(h.kv_layout);
  put_opt(h.num_kv_heads);
  put_opt(h.tokens_per_block);
  put_opt(h.head_dim);
  put_opt(h.kv_list_layout);
  put(static_cast<int64_t>(req.group_infos.size()));
  for (const auto& g : req.group_infos) {
    put(g.engine_group_id);
    put_list(g.layer_indices);
    put(g.tokens_per_block);
    put(g.sw_size_tokens);
    put(g.extra_object_group_tag);
    put(g.recurrent_state);
  }
  return s;
}

// The transfer is over (its completion ran, or the engine refused it): lmcache's
// finished-transfer counter of the instance's device (null: none).
void CountFinished(TransferValues* counts, bool store) {
  if (!counts) return;
  auto& n = store ? counts->finished_stores : counts->finished_retrieves;
  n.fetch_add(1, std::memory_order_relaxed);
}

// True when every shared-memory name of the instance still names the segment it mapped
// (a worker that recreated its segment under the same name gets a new mapping).
bool SegmentsUnchanged(const Instance& inst) {
  for (const auto& [name, id] : inst.kvd().shm_segments) {
    auto now = transfer::IdentifySegment(name);
    if (!now.ok() || !(*now == id)) return false;
  }
  return true;
}

}  // namespace

KvdCopyTransfers::KvdCopyTransfers(const ServiceContext& context,
                                   transfer::ShmAccessPolicy shm_policy)
    : config_(*context.config),
      clock_(context.clock),
      l1_(context.l1),
      registry_(context.registry),
      counters_(context.counters),
      io_(context),
      copy_threads_(config_.copy_threads > 0
                        ? config_.copy_threads
                        : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8)),
      shm_policy_(std::move(shm_policy)),
      pending_(context.pending_commits) {}

Status KvdCopyTransfers::Submit(const std::shared_ptr<const Instance>& inst,
                                transfer::CopyDirection direction,
                                const wire::TransferRequest& req,
                                std::vector<transfer::ChunkTask> tasks, uint64_t bytes,
                                std::function<void(const Status&)> on_complete,
                                std::string* event_handle) {
  if (event_handle) event_handle->clear();
  const bool store = direction == transfer::CopyDirection::kGather;
  TransferValues* const counts = inst->kvd().transfer_counts;
  if (tasks.empty()) {  // nothing to copy: an empty handle says so
    on_complete(Status::Ok());
    CountFinished(counts, store);
    return Status::Ok();
  }
  transfer::CopyEngine& engine = *inst->kvd().engine;
  // lmcache's L0<->L1 throughput: the bytes over the copy's time. A synchronous engine copies
  // inside Submit, so Submit to completion is the copy. An asynchronous (GPU) engine's copy
  // first waits for the client's event, which is not the copy's time: the engine times the
  // copy on the device and reports it (on_copy_timed), or it is not recorded.
  ThroughputValues* const throughput = inst->kvd().throughput;
  ThroughputHistogram* histogram =
      throughput ? (store ? &throughput->store : &throughput->load) : nullptr;
  const bool asynchronous = engine.caps().asynchronous;
  std::function<void(double)> on_copy_timed;
  if (histogram && asynchronous) {
    on_copy_timed = [histogram, bytes](double seconds) { histogram->Record(bytes, seconds); };
  }
  const InFlightCopies::Id watch = WatchIfAsynchronous(inst, store);
  // The copy's one completion, in this order: a synchronous copy's throughput, the caller's
  // completion (commit, or release), the transfer counted as finished, the watch removed.
  auto completion = [done = std::move(on_complete), counts, store, bytes,
                     histogram = asynchronous ? nullptr : histogram,
                     start = std::chrono::steady_clock::now(),
                     inflight = watch ? inflight_ : nullptr, watch](const Status& st) {
    if (histogram && st.ok()) {
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      histogram->Record(bytes, took.count());
    }
    done(st);
    CountFinished(counts, store);
    if (inflight) inflight->Remove(watch);
  };
  transfer::CopyPlan plan;
  plan.direction = direction;
  plan.block_ids = req.block_ids;
  plan.tasks = std::move(tasks);
  plan.wait_event = req.event_handle;
  plan.on_complete = std::move(completion);
  plan.on_copy_timed = std::move(on_copy_timed);
  auto sub = engine.Submit(std::move(plan));
  if (!sub.ok()) {  // refused: its completion never runs
    if (watch) inflight_->Remove(watch);
    CountFinished(counts, store);
    return sub.status();
  }
  if (event_handle) *event_handle = sub->event_handle;
  return sub->status;
}

InFlightCopies::Id KvdCopyTransfers::WatchIfAsynchronous(const std::shared_ptr<const Instance>& inst,
                                                          bool store) {
  if (!inst->kvd().engine->caps().asynchronous) return 0;
  const double ttl = store ? config_.l1_write_ttl_seconds : config_.l1_read_ttl_seconds;
  return inflight_->Add(inst, store, clock_->NowNanos() + static_cast<int64_t>(ttl * 1e9));
}

Result<transfer::Submitted> KvdCopyTransfers::SubmitDeviceWork(
    const std::shared_ptr<const Instance>& inst, transfer::DeviceWork work) {
  transfer::CopyEngine& engine = *inst->kvd().engine;
  const InFlightCopies::Id watch = WatchIfAsynchronous(inst, false);
  work.on_complete = [done = std::move(work.on_complete), inflight = watch ? inflight_ : nullptr,
                      watch](const Status& st) {
    if (done) done(st);
    if (inflight) inflight->Remove(watch);
  };
  auto sub = engine.SubmitDeviceWork(std::move(work));
  if (!sub.ok() && watch) inflight_->Remove(watch);
  return sub;
}

void KvdCopyTransfers::RegisterMetrics(metrics::Registry& registry) {
  using metrics::Kind;
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_l1_lookup_waits_for_commit_total",
       "LOOKUPs and RETRIEVEs that met chunks whose asynchronous (GPU) STORE copy was not "
       "committed yet and waited for the commit (bounded).",
       Kind::kCounter, {}, {}},
      [p = pending_](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(p->waits())); }));
  metric_handles_.push_back(registry.AddCollected(
      {"kvd_l1_commit_wait_timeouts_total",
       "Of those waits, the ones whose commits had not run within the bound (the chunks "
       "still in flight were a miss).",
       Kind::kCounter, {}, {}},
      [p = pending_](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(p->timeouts())); }));
}

size_t KvdCopyTransfers::CancelOverdueCopies() {
  {
    // Cancelled instances whose copies have all reported back can go now: their engines
    // have nothing left to drain.
    std::vector<std::shared_ptr<const Instance>> done;  // destroyed outside the lock
    MutexLock lock(&cancelled_mu_);
    for (auto it = cancelled_.begin(); it != cancelled_.end();) {
      if (inflight_->HasCopiesOf(it->get())) {
        ++it;
      } else {
        done.push_back(std::move(*it));
        it = cancelled_.erase(it);
      }
    }
  }
  size_t cancelled = 0;
  for (auto& o : inflight_->TakeOverdue(clock_->NowNanos())) {
    if (!o.instance) continue;  // unregistered meanwhile; its engine is being torn down
    spdlog::error("instance {}: a {} copy is {:.1f} s past its {} TTL (the client's event never "
                  "fired?); cancelling the instance. Its memory stays held until the copy "
                  "reports completion; the worker must register again.",
                  o.instance_id, o.store ? "STORE" : "RETRIEVE",
                  static_cast<double>(o.overdue_ns) * 1e-9, o.store ? "write" : "read");
    o.instance->kvd().engine->Cancel();
    registry_->RemoveIf(o.instance_id, o.instance.get());
    counters_->cancelled_instances++;
    // Kept until its copies report back, so the engine is not torn down (and its
    // destructor does not wait for them) on this thread.
    MutexLock lock(&cancelled_mu_);
    cancelled_.push_back(std::move(o.instance));
    ++cancelled;
  }
  return cancelled;
}

bool KvdCopyTransfers::ChunkIsAllNull(const layout::KvLayout& layout,
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

Status KvdCopyTransfers::Register(const wire::RegisterKvCacheRequest& req) {
  if (!config_.lmcache_driven_enabled()) {
    return Status::FailedPrecondition(
        "lmcache-driven transfers are off (--supported-transfer-mode engine_driven)");
  }
  if (Status st = CheckInstanceIdentity(req.model_name, req.world_size); !st.ok()) return st;
  const std::string registration = RegistrationFingerprint(req);
  if (auto old = registry_->Peek(req.instance_id); old && !old->engine_driven() &&
                                                   old->kvd().registration == registration &&
                                                   SegmentsUnchanged(*old)) {
    registry_->Touch(req.instance_id);
    return Status::Ok();  // the same registration again (after a recovery): liveness only
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
  KvdCopies& k = inst->kvd();  // the default alternative
  k.registration = registration;
  for (const auto& g : req.group_infos) k.engine_group_ids.push_back(g.engine_group_id);
  if (on_gpu) {
    // GPU KV caches (CUDA IPC): the device engine opens them; it refuses a registration
    // that mixes in CPU tensors, and says so when this build or machine has no CUDA.
    auto engine = transfer::MakeDeviceEngine(req.tensors, *layout,
                                             {l1_->base(), l1_->capacity_bytes()}, req.instance_id);
    if (!engine.ok()) return engine.status();
    k.engine = std::move(engine).value();
    inst->memory_ids = transfer::DeviceMemoryIds(req.tensors);
  } else {
    // Map each distinct segment once, covering every tensor that lives in it.
    std::map<std::string, uint64_t> need;
    for (const auto& t : req.tensors) need[t.shm_name] = std::max(need[t.shm_name], t.nbytes);
    std::map<std::string, uint8_t*> base_of;
    std::vector<transfer::ShmMapping> mappings;
    for (const auto& [name, nbytes] : need) {
      auto m = transfer::ShmMapping::Open(name, nbytes, shm_policy_);
      if (!m.ok()) return m.status();
      base_of[name] = m->data();
      inst->memory_ids.push_back("shm " + m->id().ToString());
      k.shm_segments.emplace_back(name, m->id());
      mappings.push_back(std::move(m).value());
    }
    std::vector<uint8_t*> bases;
    for (const auto& t : req.tensors) {
      bases.push_back(base_of[t.shm_name]);
      k.cpu_tensor_sizes.push_back(need[t.shm_name]);
    }
    k.cpu_tensor_bases = bases;
    k.num_mappings = mappings.size();
    k.engine = transfer::MakeCpuCopyEngine(*layout, std::move(bases), copy_threads_,
                                               std::move(mappings));
  }
  if (layout->block_size_dependent > 0) {
    // vLLM CPU kernels whose block layout kvd does not know: a worker with another block
    // size must not read these objects (docs/layouts.md).
    inst->key_namespace = "vllm-cpu blocks of " + std::to_string(layout->block_size_dependent);
  }
  k.layout = std::move(layout).value();
  inst->tier_format = TierFormatOf(k.layout, inst->key_namespace);
  io_.FormatRegistered(*inst);
  const transfer::EngineCaps& caps = k.engine->caps();
  k.device = !caps.device_memory ? "cpu"
                 : caps.device_index >= 0 ? "cuda:" + std::to_string(caps.device_index)
                                          : "cuda";
  k.transfer_counts = &counters_->transfers.Get({k.device});
  k.throughput = &counters_->throughput.Get(
      {k.device, std::to_string(req.instance_id), req.model_name});
  if (io_.tiers() && !inst->tier_format.layout_tag.empty()) {
    spdlog::info("instance {}: tier objects of this layout are kvd-private (layout tag {}): "
                 "lmcache servers sharing the tiers will not read them (docs/tiers.md)",
                 req.instance_id, inst->tier_format.layout_tag);
  }
  const std::string described = k.layout.Describe();
  if (Status st = registry_->PutExclusive(std::move(inst)); !st.ok()) {
    return Status::FailedPrecondition("instance " + std::to_string(req.instance_id) + ": " +
                                      st.message());
  }
  spdlog::info("registered instance {} model '{}' world_size {}: {} tensors, {}", req.instance_id,
               req.model_name, req.world_size, req.tensors.size(), described);
  if (!registry_->KeyNamespace(req.model_name, req.world_size).agreed) {
    spdlog::warn("model '{}' world_size {} now has workers whose objects differ in layout "
                 "(engine-driven single-plane objects of another block size); lookups for it "
                 "report no hits until they agree", req.model_name, req.world_size);
  }
  return Status::Ok();
}

Status KvdCopyTransfers::Store(const wire::TransferRequest& req, std::string* event_handle) {
  if (event_handle) event_handle->clear();
  counters_->stores++;
  // Set once the STORE counts as submitted on its instance's device: from then on it also
  // counts as finished, here when it fails before its copy, else when the copy is over.
  TransferValues* submitted = nullptr;
  auto fail = [&](Status st) {
    counters_->store_failures++;
    CountFinished(submitted, /*store=*/true);
    return st;
  };
  auto inst = registry_->Find(req.instance_id);
  if (!inst || inst->engine_driven()) {
    return fail(Status::NotFound("store: instance " + std::to_string(req.instance_id) +
                                 " has no registered KV cache"));
  }
  if (Status st = KeyMatchesInstance("store", req.key, *inst); !st.ok()) return fail(st);
  submitted = inst->kvd().transfer_counts;
  if (submitted) submitted->submitted_stores.fetch_add(1, std::memory_order_relaxed);
  auto chunks = io_.KeysToWrite(req.key, *inst);
  if (!chunks.ok()) return fail(chunks.status());
  const int64_t n = static_cast<int64_t>(chunks->keys.size());
  if (Status st = transfer::ValidateBlockIds(inst->kvd().layout, req.block_ids, n); !st.ok()) {
    return fail(st);
  }
  const uint32_t slot = static_cast<uint32_t>(*req.key.worker_id);
  std::optional<ScopedPhase> index_phase(std::in_place, Phase::kIndex);
  // A chunk whose blocks are all the engine's null block holds no KV (e.g. align-mode Mamba
  // chunks before the last state): storing it would serve garbage to a later hit.
  auto reserved = io_.Reserve(chunks->keys, *inst, slot, /*copy_in_flight=*/true,
                              [&](size_t i) {
                                return ChunkIsAllNull(inst->kvd().layout, req.block_ids,
                                                      static_cast<int64_t>(i));
                              });
  if (!reserved.ok()) return fail(reserved.status());
  // The reservations belong to the copy's completion, which commits them once every byte
  // landed (or aborts them by dropping them).
  auto held = std::make_shared<ChunkWrites>(std::move(reserved).value());
  // With a store hook (CacheBlend's fingerprints), worker 0's committed chunks are told to it
  // with the request's tokens: the completion may run after this request is gone.
  std::shared_ptr<const std::pair<wire::CacheKey, RequestChunks>> hooked;
  if (io_.store_hook() && slot == 0 && !held->empty()) {
    hooked = std::make_shared<const std::pair<wire::CacheKey, RequestChunks>>(
        req.key, std::move(chunks).value());
  }
  std::vector<transfer::ChunkTask> tasks;
  tasks.reserve(held->size());
  for (size_t j = 0; j < held->size(); ++j) {
    tasks.push_back({held->chunk(j), held->reservation(j).data(), 0});
  }
  // Listed until the completion committed them: a LOOKUP or RETRIEVE that comes after the
  // client saw the copy's event, but before the commit, waits for it (pending_commits.h).
  // Dropping the plan unrun (a refused Submit) releases the hold too.
  std::shared_ptr<PendingCommits::Hold> pending;
  if (inst->kvd().engine->caps().asynchronous && !held->empty()) {
    std::vector<l1::ChunkKey> keys;
    keys.reserve(held->size());
    for (size_t j = 0; j < held->size(); ++j) keys.push_back(held->key(j));
    pending = std::make_shared<PendingCommits::Hold>(pending_->Add(std::move(keys)));
  }
  const uint64_t bytes = held->bytes();
  const size_t stored = tasks.size();
  index_phase.reset();
  ScopedPhase copy_phase(Phase::kCopy);  // the copy, and the commit when it runs inline
  Status st = Submit(
      inst, transfer::CopyDirection::kGather, req, std::move(tasks), bytes,
      [held, pending, tiers = io_.tiers(), inst, salt = req.key.cache_salt, slot, hooked,
       hook = hooked ? io_.store_hook() : StoreCommittedHook()](const Status& done) {
        std::vector<l1::ChunkKey> committed;
        if (done.ok()) {
          committed = held->CommitLastFirst("store: a reservation expired before the copy ended");
        }
        held->Abort();  // aborts what was not committed
        if (pending) pending->Release();  // committed or gone: waiters look again
        if (hook && !committed.empty()) {
          hook(CommittedStore{&hooked->first, &hooked->second, committed, slot});
        }
        StoreBehind(tiers, committed, *inst, salt, slot);
      },
      event_handle);
  submitted = nullptr;  // Submit counted it finished (or will, when the copy is over)
  if (!st.ok()) return fail(st);
  counters_->stored_chunks += stored;
  counters_->stored_bytes += bytes;
  return Status::Ok();
}

Status KvdCopyTransfers::Retrieve(const wire::TransferRequest& req, std::string* event_handle) {
  if (event_handle) event_handle->clear();
  counters_->retrieves++;
  TransferValues* submitted = nullptr;  // as in Store
  auto fail = [&](Status st) {
    counters_->retrieve_failures++;
    CountFinished(submitted, /*store=*/false);
    return st;
  };
  auto inst = registry_->Find(req.instance_id);
  if (!inst || inst->engine_driven()) {
    return fail(Status::NotFound("retrieve: instance " + std::to_string(req.instance_id) +
                                 " has no registered KV cache"));
  }
  if (req.key.model_name != inst->model_name || req.key.world_size != inst->world_size) {
    return fail(Status::InvalidArgument("retrieve: key does not match the instance's model"));
  }
  submitted = inst->kvd().transfer_counts;
  if (submitted) submitted->submitted_retrieves.fetch_add(1, std::memory_order_relaxed);
  auto chunks = io_.KeysToRead(req.key, *inst);
  if (!chunks.ok()) return fail(chunks.status());
  const int64_t n = (req.key.end - req.key.start) / config_.chunk_size;
  if (Status st = transfer::ValidateBlockIds(inst->kvd().layout, req.block_ids, n); !st.ok()) {
    return fail(st);
  }
  const uint32_t slot = static_cast<uint32_t>(*req.key.worker_id);
  // This reader is done with its request's lookup locks on these chunks whatever happens
  // below (its pins keep what it copies).
  struct ReleaseLocks {
    l1::L1Cache* l1;
    const std::string& owner;
    uint64_t first, count;
    uint32_t slot;
    ~ReleaseLocks() { l1->ReleaseLocks(owner, first, count, slot); }
  } release{l1_, req.key.request_id, chunks->first_chunk, static_cast<uint64_t>(n), slot};
  if (!chunks->namespace_known) {
    return fail(Status::NotFound("retrieve: nothing of this model and salt is in L1"));
  }
  // The pins belong to the copy's completion, which drops them once the copy is done. On a
  // failure they go when this returns: the miss's pin first, then `held`, then the locks.
  auto held = std::make_shared<ChunkPins>();
  std::optional<ScopedPhase> index_phase(std::in_place, Phase::kIndex);
  // A chunk whose asynchronous STORE copy is still being committed is waited for (bounded):
  // the client may have seen that copy's event complete already (issue 26, item 2).
  if (pending_->any()) {
    pending_->Wait(std::span<const l1::ChunkKey>(chunks->keys.data(),
                                                 std::min<size_t>(chunks->keys.size(), n)),
                   PendingCommits::kRetrieveWait);
  }
  PinMiss miss;
  if (!io_.Pin(*chunks, static_cast<uint64_t>(n), slot, inst->object_bytes, held.get(), &miss)) {
    if (!miss.wrong_size.valid()) {
      return fail(Status::NotFound("retrieve: chunk " + std::to_string(miss.chunk) + " of [" +
                                   std::to_string(req.key.start) + ", " +
                                   std::to_string(req.key.end) + ") is not in L1"));
    }
    return fail(Status::FailedPrecondition(
        "retrieve: stored object has " + std::to_string(miss.wrong_size.size()) +
        " bytes, layout needs " + std::to_string(inst->object_bytes)));
  }
  std::vector<transfer::ChunkTask> tasks;
  tasks.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t skip = req.skip_first_n_tokens - i * config_.chunk_size;
    if (skip >= config_.chunk_size) continue;  // the whole chunk is the engine's already
    tasks.push_back({i, const_cast<uint8_t*>((*held)[i].data()), std::max<int64_t>(skip, 0)});
  }
  index_phase.reset();
  ScopedPhase copy_phase(Phase::kCopy);
  const uint64_t copied_bytes = tasks.size() * inst->object_bytes;
  Status st = Submit(
      inst, transfer::CopyDirection::kScatter, req, std::move(tasks), copied_bytes,
      [held](const Status&) { held->Release(); },
      event_handle);
  submitted = nullptr;  // Submit counted it finished (or will, when the copy is over)
  if (!st.ok()) return fail(st);
  counters_->retrieved_chunks += n;
  counters_->retrieved_bytes += n * inst->object_bytes;
  return Status::Ok();
}

}  // namespace kvd::server
