#include "server/blend_ops.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <unordered_set>

#include "blend/matcher_plan.h"
#include "blend/scatter.h"
#include "keys/chunk_hasher.h"
#include "layout/layout.h"
#include "server/chunk_keys.h"
#include "transfer/bus_error_guard.h"

namespace kvd::server {
namespace {

blend::StorageKey KeyOf(const l1::ChunkKey& k) { return blend::StorageKey::FromHash32(k.chunk_hash); }

// Where a cos/sin cache's view lies in the memory its descriptor names (a shared-memory
// segment, or a GPU storage): contiguous [max_positions, rot_dim] from its storage offset.
struct CacheView {
  uint64_t offset = 0;
  uint64_t length = 0;
};

Result<CacheView> CacheViewOf(const wire::TensorDescriptor& d, size_t index) {
  const std::string what = "cos_sin_caches[" + std::to_string(index) + "]";
  const int64_t elem = layout::DtypeSize(d.dtype);
  if (elem <= 0) return Status::InvalidArgument(what + ": unknown dtype '" + d.dtype + "'");
  if (d.shape.size() != 2 || d.shape[0] <= 0 || d.shape[1] <= 0) {
    return Status::InvalidArgument(what + ": expected a [max_positions, rot_dim] tensor");
  }
  if (!d.stride.empty() && (d.stride.size() != 2 || d.stride[1] != 1 || d.stride[0] != d.shape[1])) {
    return Status::InvalidArgument(what + ": must be contiguous");
  }
  if (d.storage_offset < 0) return Status::InvalidArgument(what + ": negative storage offset");
  const uint64_t n = static_cast<uint64_t>(d.shape[0]) * static_cast<uint64_t>(d.shape[1]);
  if (n > blend::RopeTable::kMaxFloats) return Status::InvalidArgument(what + ": too large");
  if (static_cast<uint64_t>(d.storage_offset) > (uint64_t{1} << 40)) {
    return Status::InvalidArgument(what + ": storage offset out of range");
  }
  return CacheView{static_cast<uint64_t>(d.storage_offset) * static_cast<uint64_t>(elem),
                   n * static_cast<uint64_t>(elem)};
}

}  // namespace

// ---- BlendIndex ----------------------------------------------------------------------

Result<std::unique_ptr<BlendIndex>> BlendIndex::Create(const ServerConfig& config) {
  blend::MatcherOptions o;
  o.window = static_cast<uint32_t>(config.chunk_size);
  o.dedup_content = config.enable_dedup_content;
  o.lmcache_parity = config.blend_lmcache_parity;
  auto m = blend::Matcher::Create(o);
  if (!m.ok()) return m.status();
  return std::unique_ptr<BlendIndex>(new BlendIndex(std::move(m).value()));
}

void BlendIndex::AttachTiers(const l2::TierSet* tiers, l1::L1Cache* l1) {
  l1_.store(l1);
  WriterMutexLock lock(&attach_mu_);
  tier_set_ = tiers;
}

void BlendIndex::DetachTiers() {
  WriterMutexLock lock(&attach_mu_);
  tier_set_ = nullptr;
}

void BlendIndex::OnEntriesRemoved(std::span<const l1::ChunkKey> keys, l1::RemovalCause) {
  // Parity mode learns of removals through strikes, as lmcache does.
  if (parity()) return;
  if (!tiers_) {
    for (const auto& k : keys) RemoveChunk(k);
    return;
  }
  // With tiers the chunk may still be in one: only the tiers' indexes can say it is not.
  l1::L1Cache* const l1 = l1_.load();
  ReaderMutexLock lock(&attach_mu_);
  if (tier_set_ == nullptr || l1 == nullptr) return;
  for (const auto& k : keys) {
    const auto world = static_cast<uint32_t>(std::max(l1->namespaces().Get(k.ns).world_size, 1));
    if (tier_set_->ChunkInNoTier(k, world)) RemoveChunk(k);
  }
}

void BlendIndex::OnChunkSlotsGone(std::span<const l2::ChunkSlot> slots) {
  if (parity()) return;
  // No lock held while asking L1: its shard mutexes come before attach_mu_ (the listener).
  l1::L1Cache* const l1 = l1_.load();
  if (l1 == nullptr) return;
  for (const auto& s : slots) {
    if (!l1->IsResident(s.chunk, s.slot)) RemoveChunk(s.chunk);
  }
}

void BlendIndex::RemoveChunk(const l1::ChunkKey& chunk) {
  if (matcher_->Remove(chunk.ns, KeyOf(chunk))) removed.Add();
}

// ---- BlendOps ------------------------------------------------------------------------

BlendOps::BlendOps(const ServerConfig& config, const Clock* clock, BlendIndex* index,
                   l1::L1Cache* l1, InstanceRegistry* registry,
                   Lookups* lookups, l2::TierSet* tiers, KvdCopyTransfers* copies,
                   transfer::ShmAccessPolicy shm_policy)
    : config_(config),
      clock_(clock),
      index_(index),
      l1_(l1),
      registry_(registry),
      lookups_(lookups),
      tiers_(tiers),
      copies_(copies),
      shm_policy_(std::move(shm_policy)),
      prompts_(config.enable_blend_reorder ? std::make_unique<blend::PromptStore>() : nullptr) {}

std::string BlendOps::LockOwner(std::string_view request_id) {
  std::string s(request_id);
  s += "\x1f" "blend";
  return s;
}

Status BlendOps::RegisterRope(const wire::CbRegisterRopeRequest& req) {
  auto inst = registry_->Find(req.instance_id);
  if (!inst || inst->engine_driven()) {
    return Status::InvalidArgument("Instance " + std::to_string(req.instance_id) +
                                   " has no paged KV cache registered; send REGISTER_KV_CACHE "
                                   "before CB_REGISTER_ROPE.");
  }
  const int64_t n_caches = static_cast<int64_t>(req.cos_sin_caches.size());
  int64_t max_eg = -1;
  for (const auto& g : inst->kvd().layout.groups) {
    const size_t list = g.engine_group;
    const int64_t id = list < inst->kvd().engine_group_ids.size() ? inst->kvd().engine_group_ids[list]
                                                            : static_cast<int64_t>(list);
    max_eg = std::max(max_eg, id);
  }
  if (!req.group_to_cache.empty()) {
    const auto [lo, hi] = std::minmax_element(req.group_to_cache.begin(), req.group_to_cache.end());
    if (*lo < -1 || *hi >= n_caches) {
      std::string list;
      for (int64_t v : req.group_to_cache) list += (list.empty() ? "" : ", ") + std::to_string(v);
      return Status::InvalidArgument("group_to_cache [" + list +
                                     "] contains indices outside [-1, " + std::to_string(n_caches) +
                                     ") for the sent cache(s).");
    }
    if (static_cast<int64_t>(req.group_to_cache.size()) <= max_eg) {
      return Status::InvalidArgument(
          "group_to_cache covers " + std::to_string(req.group_to_cache.size()) +
          " engine group(s) but the registered model has engine groups up to index " +
          std::to_string(max_eg) + ".");
    }
  }
  auto quant = blend::ParseKvQuant(req.kv_quant);
  if (!quant.ok()) {
    return Status::InvalidArgument("kv_quant='" + req.kv_quant +
                                   "': expected one of ['fp8_e4m3', 'fp8_e5m2'] or ''.");
  }
  for (size_t i = 0; i < req.group_rot.size(); ++i) {
    const auto& w = req.group_rot[i];
    if (w && (w->offset < 0 || w->width <= 0)) {
      return Status::InvalidArgument("group_rot[" + std::to_string(i) +
                                     "]: expected (offset >= 0, width > 0) or None.");
    }
  }
  auto state = std::make_shared<RopeState>();
  state->instance = inst;
  for (size_t i = 0; i < req.cos_sin_caches.size(); ++i) {
    const auto& d = req.cos_sin_caches[i];
    const std::string what = "cos_sin_caches[" + std::to_string(i) + "]";
    // The table's memory: a shared-memory segment mapped here, or GPU memory (CUDA IPC) of
    // which the instance's engine reads the view's bytes to the host once.
    auto view = CacheViewOf(d, i);
    if (!view.ok()) return view.status();
    std::optional<transfer::ShmMapping> segment;
    std::vector<uint8_t> from_device;
    std::span<const uint8_t> table_bytes;
    if (d.memory == wire::TensorMemory::kCpuShm) {
      auto m = transfer::ShmMapping::Open(d.shm_name, d.nbytes, shm_policy_);
      if (!m.ok()) return m.status();
      segment.emplace(std::move(m).value());
      if (view->offset > segment->size() || view->length > segment->size() - view->offset) {
        return Status::InvalidArgument(what + ": extends past its shared-memory segment (" +
                                       std::to_string(segment->size()) + " bytes mapped)");
      }
      table_bytes = {segment->data() + view->offset, view->length};
    } else {
      transfer::CopyEngine& engine = *inst->kvd().engine;
      if (!engine.caps().device_memory) {
        return Status::InvalidArgument(what + " is in GPU memory but instance " +
                                       std::to_string(req.instance_id) +
                                       " keeps its KV cache in host shared memory");
      }
      auto read = engine.ReadDeviceTensor(d, view->offset, view->length);
      if (!read.ok()) {
        const std::string msg = what + ": " + read.status().message();
        return read.status().code() == StatusCode::kInvalidArgument ? Status::InvalidArgument(msg)
                                                                     : Status::Internal(msg);
      }
      from_device = std::move(read).value();
      table_bytes = from_device;
    }
    // A client may truncate its segment under the read: the copy runs under the bus-error
    // guard, and a fault fails the registration.
    std::optional<Result<blend::RopeTable>> built;
    auto build = [&] { built.emplace(blend::RopeTable::FromCosSinCache(table_bytes, d.dtype, d.shape)); };
    if (!transfer::RunCatchingBusErrors(build) || !built) {
      return Status::InvalidArgument(what + ": the shared memory could not be read (truncated?)");
    }
    if (!built->ok()) {
      return Status::InvalidArgument("cos_sin_caches[" + std::to_string(i) + "]: " +
                                     built->status().message());
    }
    if ((*built)->mscale_stripped()) {
      spdlog::info("instance {}: rope table {} carries a magnitude of {:.4f} (YaRN/longrope); "
                   "divided out", req.instance_id, i, (*built)->mscale());
    }
    state->tables.push_back(std::make_unique<blend::RopeTable>(std::move(*built).value()));
  }
  blend::RopeRegistration reg;
  for (const auto& t : state->tables) reg.tables.push_back(t.get());
  reg.head_size = req.head_size;
  reg.is_neox_style = req.is_neox_style;
  reg.group_to_cache = req.group_to_cache;
  for (const auto& w : req.group_rot) {
    reg.group_rot.push_back(w ? std::vector<int64_t>{w->offset, w->width} : std::vector<int64_t>{});
  }
  reg.group_head_size = req.group_head_size;
  reg.kv_quant = *quant;
  if (Status st = blend::ValidateRopeRegistration(reg, max_eg); !st.ok()) return st;
  std::vector<std::string> skipped;
  auto groups = blend::GroupRopesFor(inst->kvd().layout, inst->kvd().engine_group_ids, reg, &skipped);
  if (!groups.ok()) return groups.status();
  for (const auto& line : skipped) spdlog::info("instance {}: re-RoPE skips {}", req.instance_id, line);
  state->groups = std::move(groups).value();
  {
    MutexLock lock(&rope_mu_);
    rope_[req.instance_id] = std::move(state);
  }
  spdlog::info("instance {}: CacheBlend rope registered ({} table(s), head_size {}, {})",
               req.instance_id, n_caches, req.head_size, req.is_neox_style ? "NeoX" : "GPT-J");
  return Status::Ok();
}

bool BlendOps::UnregisterRope(int64_t instance_id) {
  MutexLock lock(&rope_mu_);
  return rope_.erase(instance_id) > 0;
}

bool BlendOps::has_rope(int64_t instance_id) const {
  MutexLock lock(&rope_mu_);
  return rope_.count(instance_id) > 0;
}

size_t BlendOps::requests_held() const {
  MutexLock lock(&req_mu_);
  size_t n = 0;
  for (const auto& [rid, st] : requests_) n += st.finished ? 0 : 1;
  return n;
}

void BlendOps::OnStoreCommitted(const CommittedStore& s) {
  if (s.slot != 0 || s.committed.empty() || s.key == nullptr || s.chunks == nullptr) return;
  const auto& key = *s.key;
  const auto& keys = s.chunks->keys;
  if (keys.empty()) return;
  if (prompts_) RecordPrompt(key, *s.chunks);
  const int64_t c = config_.chunk_size;
  std::unordered_set<l1::ChunkKey, l1::ChunkKeyHash> done(s.committed.begin(), s.committed.end());
  std::vector<uint8_t> committed(keys.size());
  std::vector<blend::StorageKey> skeys(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    committed[i] = done.count(keys[i]) ? 1 : 0;
    skeys[i] = KeyOf(keys[i]);
  }
  blend::StoredRange r;
  r.tokens = key.token_ids.span();
  r.start = static_cast<int64_t>(s.chunks->first_chunk) * c;
  r.end = r.start + static_cast<int64_t>(keys.size()) * c;
  r.committed = committed;
  r.keys = skeys;
  auto windows = blend::PlanRegistration(r, static_cast<uint32_t>(c), index_->parity());
  if (!windows.ok()) {
    spdlog::debug("blend: fingerprints of request '{}' not registered: {}", key.request_id,
                  windows.status().ToString());
    return;
  }
  if (windows->empty()) return;
  auto counts = index_->matcher().Register(keys[0].ns, *windows);
  if (!counts.ok()) {
    spdlog::debug("blend: fingerprints of request '{}': {}", key.request_id, counts.status().ToString());
    return;
  }
  m_.fingerprints_registered.Add(counts->registered);
}

void BlendOps::RecordPrompt(const wire::CacheKey& key, const RequestChunks& chunks) {
  // The request's chain from chunk 0: the stored range's own keys when it starts there.
  std::vector<blend::ChainHash> chain;
  if (chunks.first_chunk == 0) {
    chain.reserve(chunks.keys.size());
    for (const auto& k : chunks.keys) chain.push_back(k.chunk_hash);
  } else {
    auto tokens = key.token_ids.span();
    const size_t end = std::min<size_t>(tokens.size(), static_cast<size_t>(std::max<int64_t>(key.end, 0)));
    std::vector<int64_t> t(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(end));
    auto hashes = keys::ComputeChunkHashes(t, static_cast<uint32_t>(config_.chunk_size));
    if (!hashes.ok()) return;  // best effort, as lmcache's: the store itself succeeded
    chain.assign(hashes->begin(), hashes->end());
  }
  prompts_->Record({key.model_name, key.world_size, key.cache_salt}, key.request_id,
                   key.token_ids.span(), chain);
}

std::optional<l1::NamespaceId> BlendOps::MatcherPartition(const std::string& model_name,
                                                          int64_t world_size,
                                                          const std::string& cache_salt,
                                                          bool* registered) const {
  const auto info = registry_->KeyNamespace(model_name, world_size);
  const bool known = info.registered && info.agreed;
  if (registered) *registered = known;
  if (!known) return std::nullopt;
  std::string model;
  KeyModelNameInto(&model, model_name, info.key_namespace);
  return l1_->namespaces().Find(model, static_cast<int32_t>(world_size), cache_salt);
}

std::vector<uint32_t> BlendOps::ReorderPlan(const wire::CbReorderPlanRequest& req) {
  m_.reorder_requests.Add();
  if (!prompts_) return {};
  const wire::CacheKey& key = req.key;
  const int64_t c = config_.chunk_size;
  const int64_t budget_ms = std::min<int64_t>(req.budget_ms, kMaxReorderBudgetMs);
  const blend::PlanDeadline deadline(clock_, clock_->NowNanos() + budget_ms * 1'000'000);
  const auto ns = prompts_->Resolve(key.model_name, key.world_size, key.cache_salt);
  if (!ns) return {};  // the salt must match; an empty model name or zero world size: any
  const std::span<const uint32_t> prompt = key.token_ids.span();
  // The matcher's hits for the prompt, in the resolved namespace's partition.
  std::vector<blend::ChainHash> hits;
  const auto l1ns = MatcherPartition(ns->model_name, ns->world_size, ns->cache_salt);
  std::vector<blend::MatchCandidate> matches;
  if (l1ns && prompt.size() >= static_cast<size_t>(c) &&
      index_->matcher().Probe(*l1ns, prompt, 0, &matches).ok()) {
    for (const auto& cand : matches) {
      if (cand.key.size() != 32) continue;
      blend::ChainHash h;
      std::copy(cand.key.bytes().begin(), cand.key.bytes().end(), h.begin());
      hits.push_back(h);
    }
  }
  // The prompt's own chain hashes from chunk 0 (its exact prefix among the stored prompts).
  std::vector<int64_t> t(prompt.begin(), prompt.end());
  auto chain = keys::ComputeChunkHashes(t, static_cast<uint32_t>(c));
  if (!chain.ok()) return {};
  const std::vector<blend::ChainHash> prompt_chain(chain->begin(), chain->end());
  const blend::PromptStore::Candidates found = prompts_->Find(*ns, hits, prompt_chain);
  std::vector<std::span<const uint32_t>> candidates;
  for (const auto& p : found.prompts) candidates.emplace_back(*p);
  auto perm = blend::PlanReorder(prompt, candidates, c, found.baseline_chunks, deadline,
                                 static_cast<size_t>(req.keep_prefix));
  if (!perm) return {};
  m_.reorder_plans.Add();
  std::vector<uint32_t> out;
  out.reserve(perm->size());
  for (uint32_t i : *perm) out.push_back(prompt[i]);
  return out;
}

Result<std::optional<wire::CbUnifiedLookupResult>> BlendOps::UnifiedLookup(
    const wire::LookupRequest& req) {
  const auto& key = req.key;
  const std::string& rid = key.request_id;
  const int64_t c = config_.chunk_size;
  // --- prefix leg: LOOKUP's, polled while its tier prefetch runs ---
  bool polling = false;
  {
    MutexLock lock(&req_mu_);
    polling = prefix_loading_.count(rid) > 0 || tier_loading_.count(rid) > 0;
  }
  if (!polling) {
    m_.lookup_requests.Add();
    {
      MutexLock lock(&req_mu_);
      DropRequestLocked(rid);  // a new lookup of the request replaces the old one's matches
    }
    if (Status st = lookups_->Lookup(req); !st.ok()) return st;
  }
  if (lookups_->results().Running(rid)) {
    MutexLock lock(&req_mu_);
    prefix_loading_[rid] = clock_->NowNanos();
    return std::optional<wire::CbUnifiedLookupResult>();
  }
  // The chunks L1 lacked are asked for once per lookup: after the loads answered, whatever
  // is still missing is a miss.
  std::optional<int64_t> asked_prefix_chunks;
  std::shared_ptr<TierLoadAnswers> tier_answers;  // the tiers' answers, once asked
  {
    MutexLock lock(&req_mu_);
    prefix_loading_.erase(rid);
    if (auto it = tier_loading_.find(rid); it != tier_loading_.end()) {
      if (it->second.answers->pending.load(std::memory_order_acquire) > 0) {
        return std::optional<wire::CbUnifiedLookupResult>();
      }
      asked_prefix_chunks = it->second.prefix_chunks;
      tier_answers = std::move(it->second.answers);
      tier_loading_.erase(it);
    }
  }
  const bool ask_tiers = tiers_ != nullptr && tier_answers == nullptr;
  std::vector<l1::ChunkKey> missing;  // chunks to ask the tiers for (ask_tiers)
  std::unordered_set<l1::ChunkKey, l1::ChunkKeyHash> missing_set;
  const int64_t prefix_chunks =
      asked_prefix_chunks ? *asked_prefix_chunks : lookups_->results().Take(rid).value_or(0);
  const int64_t prefix_tokens = prefix_chunks * c;

  wire::CbUnifiedLookupResult out;
  out.prefix_coverage_tokens = prefix_tokens;
  const int64_t num_tokens = std::min<int64_t>(static_cast<int64_t>(key.token_ids.size()),
                                               std::max<int64_t>(key.end, 0));

  // --- non-prefix leg: the matcher, then L1 ---
  bool registered = false;
  const std::optional<l1::NamespaceId> ns =
      MatcherPartition(key.model_name, key.world_size, key.cache_salt, &registered);
  if (!registered) m_.lookup_no_gpu_context_errors.Add();
  std::vector<blend::MatchCandidate> candidates;
  // The matcher sees every token of the key, as lmcache's does: the connector's key ends at
  // the prompt's last full chunk (`end`, the prefix leg's range), and a document at an
  // unaligned offset can run past it.
  if (ns && key.token_ids.size() >= static_cast<size_t>(c)) {
    std::span<const uint32_t> tokens = key.token_ids.span();
    if (Status st = index_->matcher().Probe(*ns, tokens, prefix_tokens, &candidates); !st.ok()) {
      return st;
    }
  }
  const uint32_t world = static_cast<uint32_t>(std::max<int64_t>(1, key.world_size));
  // --- segmented prefix (--enable-segmented-prefix): the chunks after the prefix's first
  // gap that L1 still holds for every rank at their own positions (their chained keys: same
  // tokens before them, so their KV is exact there). Delivered at old_st == cur_st for a
  // pure load; the engine recomputes only the gaps. ---
  std::vector<std::pair<int64_t, l1::ChunkKey>> tail;  // (chunk index, key)
  if (config_.enable_segmented_prefix && ns) {
    // The prompt's full chunks from 0. A lookup key usually names exactly that: then no copy
    // of its tokens is made.
    const int64_t whole_end = (num_tokens / c) * c;
    std::optional<wire::CacheKey> whole;
    if (key.start != 0 || key.end != whole_end) {
      whole = key;
      whole->start = 0;
      whole->end = whole_end;
    }
    auto chunks = lookups_->ChunkKeys(whole ? *whole : key);
    if (chunks.ok() && chunks->namespace_known) {
      for (size_t j = 0; j < chunks->keys.size(); ++j) {
        const int64_t i = static_cast<int64_t>(chunks->first_chunk + j);
        if (i <= prefix_chunks) continue;  // the prefix, and the gap that ends it
        const l1::ChunkKey& k = chunks->keys[j];
        if (k.ns != *ns) break;  // another namespace than the matcher's: never mixed
        if (ResidentOnEveryRank(k, world)) {
          tail.emplace_back(i, k);
        } else if (ask_tiers && missing_set.insert(k).second) {
          missing.push_back(k);
        }
      }
    }
  }
  auto in_tail = [&](int64_t chunk) {  // tail is in ascending chunk order
    auto it = std::lower_bound(tail.begin(), tail.end(), chunk,
                               [](const auto& t, int64_t i) { return t.first < i; });
    return it != tail.end() && it->first == chunk;
  };
  std::vector<blend::MatchCandidate> present;
  std::vector<const blend::MatchCandidate*> absent;  // not in L1 on every rank
  uint64_t stale = 0;
  for (const auto& cand : candidates) {
    if (cand.cur_st < prefix_tokens) continue;
    // A same-position match of a chunk the segmented prefix delivers is that chunk: once.
    if (cand.old_st == cand.cur_st && cand.cur_st % c == 0 && in_tail(cand.cur_st / c)) continue;
    if (cand.key.size() != 32) {
      ++stale;
      continue;
    }
    l1::ChunkKey k{*ns, {}};
    std::copy(cand.key.bytes().begin(), cand.key.bytes().end(), k.chunk_hash.begin());
    if (ResidentOnEveryRank(k, world)) {
      present.push_back(cand);
      if (index_->parity()) index_->matcher().ClearStrikes(*ns, cand.key);
      continue;
    }
    ++stale;
    absent.push_back(&cand);
    if (ask_tiers && missing_set.insert(k).second) missing.push_back(k);
  }
  if (!missing.empty() && LoadFromTiers(key, world, prefix_chunks, std::move(missing))) {
    return std::optional<wire::CbUnifiedLookupResult>();  // [tier loading]: the client polls
  }
  // Missing from L1 (and from the tiers, when they were asked). Parity mode strikes it
  // (lmcache's lazy removal). The default mode removed it when it left L1 (BlendIndex) if no
  // tier is configured; with tiers, it goes once every tier answered "not found" for it and
  // L1 still lacks it (a tier that failed or was late proves nothing: it stays).
  if (index_->parity()) {
    for (const blend::MatchCandidate* cand : absent) index_->matcher().Strike(*ns, cand->key);
  } else if (tier_answers) {
    RemoveInNoTier(*tier_answers, world);
  }
  m_.lookup_requested_tokens.Add(static_cast<uint64_t>((num_tokens / c) * c));
  m_.lookup_prefix_hit_tokens.Add(static_cast<uint64_t>(prefix_tokens));
  m_.fingerprint_matches.Add(candidates.size());
  auto selected = blend::SelectNonOverlapping(present, prefix_tokens);
  // Read-lock the selected chunks, then the segmented prefix's, for the workers' retrieves
  // (indices 0..n-1 of the owner).
  std::vector<l1::ChunkKey> lock_keys;
  lock_keys.reserve(selected.size() + tail.size());
  for (const auto& cand : selected) {
    l1::ChunkKey k{*ns, {}};
    std::copy(cand.key.bytes().begin(), cand.key.bytes().end(), k.chunk_hash.begin());
    lock_keys.push_back(k);
  }
  for (const auto& [chunk, k] : tail) lock_keys.push_back(k);
  const uint32_t readers = Lookups::ReadLocksPerSlot(key, req.tp_size);
  const std::string owner = LockOwner(rid);
  size_t locked = 0;
  if (!lock_keys.empty()) locked = l1_->LookupAndLock(owner, 0, lock_keys, world, readers);
  if (locked < lock_keys.size()) {
    // Evicted between the check and the lock: the rest is dropped (its locks never taken).
    stale += selected.size() - std::min(locked, selected.size());
    if (locked == 0) l1_->ReleaseAllLocks(owner);
  }
  RequestState state;
  state.ns = ns.value_or(0);
  state.world = world;
  state.readers = readers;
  state.created_ns = clock_->NowNanos();
  uint64_t non_prefix_tokens = 0, segmented_tokens = 0;
  for (size_t j = 0; j < std::min(locked, selected.size()); ++j) {
    const auto& cand = selected[j];
    wire::CbMatchResult r;
    r.old_st = cand.old_st;
    r.old_ed = cand.old_ed;
    r.cur_st = cand.cur_st;
    r.cur_ed = cand.cur_ed;
    r.hash.assign(reinterpret_cast<const char*>(cand.key.bytes().data()), cand.key.size());
    non_prefix_tokens += static_cast<uint64_t>(r.cur_ed - r.cur_st);
    state.found.push_back({r, lock_keys[j]});
    out.non_prefix_segments.push_back(std::move(r));
  }
  // The segmented prefix's chunks follow (their lock indices come after the matches').
  for (size_t j = selected.size(); j < locked; ++j) {
    const int64_t st = tail[j - selected.size()].first * c;
    wire::CbMatchResult r;
    r.old_st = r.cur_st = st;
    r.old_ed = r.cur_ed = st + c;
    const auto& hash = lock_keys[j].chunk_hash;
    r.hash.assign(reinterpret_cast<const char*>(hash.data()), hash.size());
    segmented_tokens += static_cast<uint64_t>(c);
    state.found.push_back({r, lock_keys[j]});
    out.segmented_prefix_segments.push_back(std::move(r));
  }
  m_.lookup_storage_hits.Add(std::min(locked, selected.size()));
  m_.lookup_stale_chunks.Add(stale);
  m_.lookup_non_prefix_hit_tokens.Add(non_prefix_tokens);
  m_.lookup_segmented_prefix_hit_tokens.Add(segmented_tokens);
  m_.lookup_hit_tokens.Add(static_cast<uint64_t>(prefix_tokens) + non_prefix_tokens + segmented_tokens);
  if (locked > 0) {
    MutexLock lock(&req_mu_);
    requests_[rid] = std::move(state);
  }
  return std::optional<wire::CbUnifiedLookupResult>(std::move(out));
}

bool BlendOps::LoadFromTiers(const wire::CacheKey& key, uint32_t world, int64_t prefix_chunks,
                             std::vector<l1::ChunkKey> chunks) {
  if (tiers_ == nullptr || chunks.empty()) return false;
  const auto format = lookups_->TierFormatFor(key.model_name, key.world_size);
  if (!format) return false;  // no registered worker of the model: nothing to load into
  m_.tier_load_chunks.Add(chunks.size());
  auto answers = std::make_shared<TierLoadAnswers>(std::move(chunks));
  {
    MutexLock lock(&req_mu_);
    tier_loading_[key.request_id] = {answers, prefix_chunks, clock_->NowNanos()};
  }
  // One prefetch per chunk: a tier prefetch stops at the first chunk it cannot load, and
  // these chunks are not a sequence. Their completions may run inline, here.
  for (size_t i = 0; i < answers->chunks.size(); ++i) {
    const l1::ChunkKey& k = answers->chunks[i];
    l2::PrefetchRequest p;
    p.chunks = {k};
    p.hashes = {k.chunk_hash};
    p.model_name = key.model_name;
    p.cache_salt = key.cache_salt;
    p.world_size = world;
    p.format = *format;
    tiers_->PrefetchWithAnswer(
        std::move(p), [answers, i, loaded = &m_.tier_loaded_chunks](l2::PrefetchAnswer a) {
          // The TierSet answers every prefetch before it closes, and KvService closes it
          // before this object goes: `loaded` is alive here.
          loaded->Add(a.chunks);
          answers->in_no_tier[i].store(a.next_in_no_tier, std::memory_order_relaxed);
          answers->pending.fetch_sub(1, std::memory_order_acq_rel);
        });
  }
  return true;
}

void BlendOps::RemoveInNoTier(const TierLoadAnswers& answers, uint32_t world) {
  for (size_t i = 0; i < answers.chunks.size(); ++i) {
    if (!answers.in_no_tier[i].load(std::memory_order_relaxed)) continue;
    // Stored again since the tiers answered: it is back, keep its fingerprint.
    if (!ResidentOnEveryRank(answers.chunks[i], world)) index_->RemoveChunk(answers.chunks[i]);
  }
}

bool BlendOps::ResidentOnEveryRank(const l1::ChunkKey& key, uint32_t world) const {
  for (uint32_t s = 0; s < world; ++s) {
    if (!l1_->IsResident(key, s)) return false;
  }
  return true;
}

void BlendOps::DropRequestLocked(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  requests_.erase(it);
  l1_->ReleaseAllLocks(LockOwner(request_id));
}

void BlendOps::EndSession(std::string_view request_id) {
  MutexLock lock(&req_mu_);
  const std::string rid(request_id);
  prefix_loading_.erase(rid);
  tier_loading_.erase(rid);
  DropRequestLocked(rid);
}

void BlendOps::Maintain() {
  const int64_t now = clock_->NowNanos();
  const auto ttl = static_cast<int64_t>(config_.session_ttl_seconds * 1e9);
  MutexLock lock(&req_mu_);
  std::vector<std::string> old;
  for (const auto& [rid, st] : requests_) {
    if (now - st.created_ns > ttl) old.push_back(rid);
  }
  for (const auto& rid : old) DropRequestLocked(rid);
  for (auto it = prefix_loading_.begin(); it != prefix_loading_.end();) {
    it = now - it->second > ttl ? prefix_loading_.erase(it) : std::next(it);
  }
  for (auto it = tier_loading_.begin(); it != tier_loading_.end();) {
    it = now - it->second.started_ns > ttl ? tier_loading_.erase(it) : std::next(it);
  }
}

void BlendOps::RegisterMetrics(metrics::Registry& registry) {
  struct Family {
    const char* name;
    const char* help;
    const metrics::Counter* counter;
  };
  const Family families[] = {
      {"lmcache_blend_lookup_requests_total", "cb_unified_lookup requests.", &m_.lookup_requests},
      {"lmcache_blend_lookup_requested_tokens_total", "Tokens asked for by blend lookups (whole chunks).",
       &m_.lookup_requested_tokens},
      {"lmcache_blend_lookup_hit_tokens_total", "Tokens found by blend lookups (prefix + non-prefix).",
       &m_.lookup_hit_tokens},
      {"lmcache_blend_lookup_prefix_hit_tokens_total", "Tokens found by the prefix leg.",
       &m_.lookup_prefix_hit_tokens},
      {"lmcache_blend_lookup_non_prefix_hit_tokens_total", "Tokens found at other positions (non-prefix).",
       &m_.lookup_non_prefix_hit_tokens},
      {"lmcache_blend_lookup_segmented_prefix_hit_tokens_total",
       "Tokens past a gap in the prefix found at their own positions (--enable-segmented-prefix).",
       &m_.lookup_segmented_prefix_hit_tokens},
      {"lmcache_blend_lookup_fingerprint_hits_total", "Windows the matcher reported.",
       &m_.fingerprint_matches},
      {"lmcache_blend_lookup_storage_hits_total", "Non-prefix matches found in the cache and locked.",
       &m_.lookup_storage_hits},
      {"lmcache_blend_lookup_stale_chunks_total", "Non-prefix matches whose chunk was not in the cache.",
       &m_.lookup_stale_chunks},
      {"lmcache_blend_lookup_no_gpu_context_errors_total", "Blend lookups for a model no worker registered.",
       &m_.lookup_no_gpu_context_errors},
      {"lmcache_blend_retrieve_requests_total", "cb_retrieve_pre_computed requests.", &m_.retrieve_requests},
      {"lmcache_blend_retrieve_chunks_total", "Chunks scattered by cb_retrieve_pre_computed.",
       &m_.retrieve_chunks},
      {"lmcache_blend_retrieve_failures_total", "cb_retrieve_pre_computed requests that scattered nothing and answered false or an error.",
       &m_.retrieve_failures},
      {"lmcache_blend_retrieve_noops_total", "cb_retrieve_pre_computed requests with nothing to do (no matches, deferred, repeated).",
       &m_.retrieve_noops},
      {"lmcache_blend_fingerprints_registered_total", "Fingerprints registered on STORE.",
       &m_.fingerprints_registered},
      {"lmcache_blend_chunks_evicted_total", "Fingerprints removed because their chunk left the cache.",
       &index_->removed},
      {"lmcache_blend_scatter_tokens_total", "Token rows scattered into workers' KV caches.", &m_.scatter_tokens},
      {"lmcache_blend_scatter_shifted_chunks_total", "Scattered chunks whose K was re-rotated.",
       &m_.scatter_shifted_chunks},
      {"kvd_blend_reorder_requests_total", "cb_reorder_plan requests.", &m_.reorder_requests},
      {"kvd_blend_reorder_plans_total", "cb_reorder_plan requests answered with a new order.",
       &m_.reorder_plans},
      {"kvd_blend_lookup_tier_load_chunks_total",
       "Chunks blend lookups asked the tiers for (non-prefix matches, and segmented-prefix "
       "chunks, that L1 lacked).",
       &m_.tier_load_chunks},
      {"kvd_blend_lookup_tier_loaded_chunks_total", "Of those, the chunks the tiers brought into L1.",
       &m_.tier_loaded_chunks},
  };
  for (const auto& f : families) {
    metric_handles_.push_back(registry.AddCollected(
        {f.name, f.help, metrics::Kind::kCounter, {}, {}},
        [c = f.counter](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(c->value())); }));
  }
  if (prompts_) {
    metric_handles_.push_back(registry.AddCollected(
        {"kvd_blend_reorder_stored_prompts", "Stored prompts cb_reorder_plan can copy from.",
         metrics::Kind::kGauge, {}, {}},
        [p = prompts_.get()](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(p->prompts())); }));
    metric_handles_.push_back(registry.AddCollected(
        {"kvd_blend_reorder_stored_tokens",
         "Their tokens (at most 2^24; the oldest recorded prompts leave first).", metrics::Kind::kGauge,
         {}, {}},
        [p = prompts_.get()](metrics::SeriesSink& sink) { sink.Add(static_cast<double>(p->tokens())); }));
  }
}

}  // namespace kvd::server
