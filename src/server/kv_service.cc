#include "server/kv_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "l1/l1_metrics.h"
#include "l2/tier_metrics.h"
#include "server/peers.h"
#include "server/tiers.h"

namespace kvd::server {

Result<std::unique_ptr<KvService>> KvService::Create(const ServerConfig& config,
                                                     const Clock* clock) {
  l1::L1CacheOptions o;
  o.capacity_bytes = config.l1_size_bytes();
  o.align = config.l1_align_bytes;
  o.initial_bytes = config.l1_init_bytes();
  o.shm_name = config.shm_name;
  o.use_hugepages = config.l1_use_hugepages;
  if (auto mode = l1::ParsePopulateMode(config.l1_populate)) {
    o.populate.mode = *mode;
  } else {
    return Status::InvalidArgument("unknown --l1-populate mode '" + config.l1_populate + "'");
  }
  o.read_ttl_seconds = config.l1_read_ttl_seconds;
  o.max_lookup_holds = config.max_sessions;  // one hold per request, as one session
  o.write_ttl_seconds = config.l1_write_ttl_seconds;
  o.eviction_watermark = config.eviction_trigger_watermark;
  o.eviction_ratio = config.eviction_ratio;
  o.eviction_policy = config.eviction_policy.empty() ? "LRU" : config.eviction_policy;
  o.clock = clock;
  // L1's listeners: the KV-event log, blend's fingerprints, P2P's publisher; a fan-out when
  // there are several.
  std::unique_ptr<KvEventLog> events;
  if (config.kv_event_log_size > 0) {
    events = std::make_unique<KvEventLog>(static_cast<size_t>(config.kv_event_log_size), clock);
  }
  std::unique_ptr<BlendIndex> blend_index;
  if (config.blend()) {
    auto index = BlendIndex::Create(config);
    if (!index.ok()) return index.status();
    blend_index = std::move(index).value();
    blend_index->set_tiers(!config.l2_adapters.empty() || config.p2p());
  }
  std::function<void(std::span<const l1::ChunkKey>)> on_loaded;  // the log's "loaded" records
  if (events) on_loaded = [log = events.get()](auto keys) { log->OnLoadedFromPeer(keys); };
  auto peers = StartPeerNode(config, std::move(on_loaded));
  if (!peers.ok()) return peers.status();
  auto fanout = std::make_unique<L1ListenerFanOut>();
  if (events) fanout->Add(events.get());
  if (blend_index) fanout->Add(blend_index.get());
  if (*peers) fanout->Add(peers->get());
  o.listener = fanout->size() > 1 ? fanout.get() : fanout->only();
  if (fanout->size() <= 1) fanout.reset();
  auto l1 = l1::L1Cache::Create(o);
  if (!l1.ok()) return l1.status();
  if (events) events->AttachNamespaces(&(*l1)->namespaces());
  // Client registrations may map only what the policy allows, and never kvd's own pool.
  transfer::ShmAccessPolicy shm;
  shm.allowed_uids = config.allowed_shm_uids;
  shm.required_prefix = config.allowed_shm_prefix;
  if (!(*l1)->shm_name().empty()) {
    auto pool = transfer::IdentifySegment((*l1)->shm_name());
    if (!pool.ok()) return pool.status();
    shm.refused.push_back(*pool);
  }
  if (*peers) KVD_RETURN_IF_ERROR((*peers)->Attach(l1->get()));
  std::function<void(std::span<const l2::ChunkSlot>)> on_slots_gone;  // the matcher's removal
  if (blend_index) on_slots_gone = [index = blend_index.get()](auto slots) { index->OnChunkSlotsGone(slots); };
  auto tiers = MakeTierSet(config, l1->get(), clock, *peers ? (*peers)->tier() : nullptr,
                           std::move(on_slots_gone));
  if (!tiers.ok()) return tiers.status();
  if (blend_index) blend_index->AttachTiers(tiers->get(), l1->get());
  return std::unique_ptr<KvService>(new KvService(config, clock, std::move(events),
                                                  std::move(fanout), std::move(blend_index),
                                                  std::move(peers).value(),
                                                  std::move(l1).value(), std::move(shm),
                                                  std::move(tiers).value()));
}

KvService::KvService(const ServerConfig& config, const Clock* clock,
                     std::unique_ptr<KvEventLog> events, std::unique_ptr<L1ListenerFanOut> fanout,
                     std::unique_ptr<BlendIndex> blend_index,
                     std::unique_ptr<p2p::PeerNode> peers, std::unique_ptr<l1::L1Cache> l1,
                     transfer::ShmAccessPolicy shm_policy, std::unique_ptr<l2::TierSet> tiers)
    : config_(config),
      clock_(clock),
      kv_events_(std::move(events)),
      l1_listeners_(std::move(fanout)),
      blend_index_(std::move(blend_index)),
      peers_(std::move(peers)),
      l1_(std::move(l1)),
      tiers_(std::move(tiers)),
      sessions_(clock, static_cast<uint32_t>(config.chunk_size), config.session_ttl_seconds,
                SessionLimits{config.max_sessions, config.max_session_bytes},
                config.chunk_key_memo_bytes),
      counters_(config.metrics_max_label_sets),
      registry_(clock),
      lookups_(Context()),
      blend_(blend_index_ ? std::make_unique<BlendOps>(config_, clock, blend_index_.get(), l1_.get(),
                                                       &registry_, &lookups_, tiers_.get(),
                                                       &kvd_copy_, shm_policy)
                          : nullptr),
      kvd_copy_(Context(BlendStoreHook()), std::move(shm_policy)),
      worker_copy_(Context(BlendStoreHook())) {
  if (blend_) {
    spdlog::info("engine type blend: CacheBlend ops served (fingerprints on worker 0's stores{}{}{}{})",
                 config_.blend_lmcache_parity ? "; lmcache parity mode" : "",
                 config_.enable_dedup_content ? "; content dedup" : "",
                 config_.enable_segmented_prefix ? "; segmented prefix" : "",
                 config_.enable_blend_reorder ? "; reorder plans" : "");
  }
}

ServiceContext KvService::Context(StoreCommittedHook store_hook) {
  ServiceContext c;
  c.config = &config_;
  c.clock = clock_;
  c.l1 = l1_.get();
  c.sessions = &sessions_;
  c.registry = &registry_;
  c.counters = &counters_;
  c.tiers = tiers_.get();
  c.peers = peers_.get();
  // Stores bind their chunks' tokens for the "stored" KV events from the hashes they compute
  // for their keys (the tokens are hashed once per store).
  c.kv_events = kv_events_.get();
  c.pending_commits = pending_commits_;
  c.store_hook = std::move(store_hook);
  return c;
}

StoreCommittedHook KvService::BlendStoreHook() {
  if (!blend_) return {};
  return [blend = blend_.get()](const CommittedStore& s) { blend->OnStoreCommitted(s); };
}

KvService::~KvService() {
  if (blend_index_) blend_index_->DetachTiers();  // its L1 listener calls stop using tiers_
  if (tiers_) tiers_->Close();  // before anything its callbacks use goes away
  if (peers_) peers_->Detach();  // drops its L1 pins while the cache is alive
}

Status KvService::Unregister(int64_t instance_id) {
  std::shared_ptr<const Instance> gone = registry_.Remove(instance_id);
  if (!gone) {
    return Status::NotFound("instance " + std::to_string(instance_id) + " is not registered");
  }
  worker_copy_.DropInstance(instance_id);  // its half-done engine-driven operations
  if (blend_) blend_->UnregisterRope(instance_id);
  spdlog::info("unregistered instance {} (model '{}')", instance_id, gone->model_name);
  return Status::Ok();  // mappings are released when the last in-flight copy lets go
}

void KvService::RegisterMetrics(metrics::Registry& registry) {
  metric_handles_ = counters_.RegisterMetrics(registry, config_.chunk_size);
  for (auto& h : l1::RegisterL1Metrics(*l1_, registry)) metric_handles_.push_back(std::move(h));
  for (auto& h : RegisterStatusMetrics(registry)) metric_handles_.push_back(std::move(h));
  if (tiers_) {
    for (auto& h : l2::RegisterTierMetrics(*tiers_, registry)) metric_handles_.push_back(std::move(h));
  }
  if (kv_events_) kv_events_->RegisterMetrics(registry);
  if (peers_) peers_->RegisterMetrics(registry);
  if (blend_) blend_->RegisterMetrics(registry);
  worker_copy_.RegisterMetrics(registry);
  kvd_copy_.RegisterMetrics(registry);
}

std::vector<std::string> KvService::ExperimentalCapabilities() const {
  std::vector<std::string> caps;
  if (kv_events_) caps.push_back("kv_event_stream");
  return caps;
}

void KvService::Ping(std::optional<int64_t> instance_id) {
  if (instance_id) registry_.Ping(*instance_id);
}

void KvService::Clear() {
  l1_->Clear();
  spdlog::info("L1 cleared");
}

KvService::DeleteCounts KvService::DeleteL1Entries(std::span<const L1EntryName> names) {
  DeleteCounts n;
  std::vector<l1::ChunkKey> removed;
  for (const auto& name : names) {
    auto ns = l1_->namespaces().Find(name.model_name, name.world_size, name.cache_salt);
    if (!ns) continue;
    const l1::ChunkKey key{*ns, name.chunk_hash};
    if (!l1_->DescribeSlot(key, 0)) continue;  // absent
    if (l1_->RemoveIfIdle(std::span<const l1::ChunkKey>(&key, 1)) == 1) {
      ++n.removed;
      removed.push_back(key);
    } else {
      ++n.busy;
    }
  }
  if (kv_events_ && !removed.empty()) kv_events_->OnEntriesRemoved(removed, l1::RemovalCause::kCleared);
  if (n.removed > 0) spdlog::info("L1: {} entries deleted on request ({} in use kept)", n.removed, n.busy);
  return n;
}

void KvService::Maintain() {
  sessions_.Expire();
  lookups_.results().Expire();
  worker_copy_.ExpirePending();
  if (blend_) blend_->Maintain();
  kvd_copy_.CancelOverdueCopies();
  if (config_.worker_reap_timeout_seconds > 0) {
    const double grace_s =
        std::max(config_.worker_registration_grace_seconds, config_.worker_reap_timeout_seconds);
    const auto limit = static_cast<int64_t>(config_.worker_reap_timeout_seconds * 1e9);
    const auto grace = static_cast<int64_t>(grace_s * 1e9);
    for (const auto& s : registry_.SilentSince(clock_->NowNanos(), limit, grace)) {
      spdlog::warn("reaping instance {}: silent for {:.0f} s (limit {} s, {})", s.id,
                   static_cast<double>(s.silent_ns) * 1e-9,
                   s.pinged ? config_.worker_reap_timeout_seconds : grace_s,
                   s.pinged ? "it had been pinging" : "it never pinged");
      (void)Unregister(s.id);
    }
  }
  l1_->ExpireLocks();
  l1_->EvictToWatermark();
}

}  // namespace kvd::server
