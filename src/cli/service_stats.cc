#include "cli/service_stats.h"

#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <future>
#include <optional>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/mutex.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "wire/codec.h"
#include "wire/ops.h"

namespace kvd::cli {
namespace {

// The lookup totals (every label set summed) for /status and the dashboard; the series per
// model and salt, like the transfer and copy-throughput ones, are registry families
// (ServiceCounters::RegisterMetrics). The overflow label set counts once it counted.
void SumLookupCounters(const kvd::server::ServiceCounters& c, uint64_t chunk, kvd::http::Snapshot* s) {
  using kvd::server::LookupValues;
  auto load = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  auto lookup = [&](const std::array<std::string, 2>&, const LookupValues& v) {
    auto& t = s->counters;
    const uint64_t l1 = load(v.hit_l1_chunks) * chunk, l2 = load(v.hit_l2_chunks) * chunk;
    t.lookups += load(v.lookups);
    t.lookup_tokens += load(v.requested_chunks) * chunk;
    t.hit_tokens += l1 + l2;
    t.hit_l1_tokens += l1;
    t.hit_l2_tokens += l2;
  };
  c.lookups.ForEach(lookup);
  if (load(c.lookups.overflow().lookups) > 0) {
    lookup(c.lookups.overflow_labels(), c.lookups.overflow());
  }
}

class ServiceStatsImpl final : public ServiceStats {
 public:
  explicit ServiceStatsImpl(ServiceStatsParts parts)
      : svc_(parts.service),
        metrics_(parts.request_metrics),
        registry_(parts.registry),
        cfg_(*parts.config),
        stopping_(parts.stopping),
        beat_ns_(parts.maintenance_beat_ns),
        started_(Now()),
        probe_endpoint_(std::move(parts.probe_endpoint)) {}

  kvd::http::Health CheckHealth() override {
    if (stopping_->load()) return {false, "shutting down"};
    const int64_t now = Now();
    const double stalled = static_cast<double>(now - beat_ns_->load()) * 1e-9;
    if (stalled > 30) {
      return {false, "maintenance loop stalled for " + std::to_string(static_cast<int>(stalled)) +
                         " s (eviction, TTLs and worker reaping are not running)"};
    }
    kvd::MutexLock lock(&probe_mu_);
    if (now - probed_ns_ > 1'000'000'000LL) {  // probe at most once a second
      probed_ns_ = now;
      probe_ok_ = ProbeZmq();
    }
    if (!probe_ok_) return {false, "the request loop on " + probe_endpoint_ + " did not answer a NOOP within 1 s"};
    return {};
  }

  // Counters count from the last POST /metrics/reset (gauges and histograms are absolute).
  kvd::http::Snapshot Collect() override {
    kvd::http::Snapshot s = CollectRaw();
    kvd::MutexLock lock(&baseline_mu_);
    if (!baseline_) return s;
    const kvd::http::Snapshot& b = *baseline_;
    auto sub = [](uint64_t& v, uint64_t base) { v = v > base ? v - base : 0; };
    auto& c = s.counters;
    const auto& bc = b.counters;
    sub(c.lookups, bc.lookups);
    sub(c.lookup_tokens, bc.lookup_tokens);
    sub(c.hit_tokens, bc.hit_tokens);
    sub(c.hit_l1_tokens, bc.hit_l1_tokens);
    sub(c.hit_l2_tokens, bc.hit_l2_tokens);
    sub(c.stores, bc.stores);
    sub(c.store_failures, bc.store_failures);
    sub(c.stored_chunks, bc.stored_chunks);
    sub(c.stored_bytes, bc.stored_bytes);
    sub(c.retrieves, bc.retrieves);
    sub(c.retrieve_failures, bc.retrieve_failures);
    sub(c.retrieved_chunks, bc.retrieved_chunks);
    sub(c.retrieved_bytes, bc.retrieved_bytes);
    sub(s.l1.evictions, b.l1.evictions);
    sub(s.l1.evicted_bytes, b.l1.evicted_bytes);
    sub(s.unknown_ops, b.unknown_ops);
    sub(s.chunk_key_memo_hits, b.chunk_key_memo_hits);
    sub(s.chunk_key_memo_misses, b.chunk_key_memo_misses);
    for (auto& o : s.ops) {
      for (const auto& bo : b.ops) {
        if (bo.name != o.name) continue;
        sub(o.requests, bo.requests);
        sub(o.refused, bo.refused);
      }
    }
    return s;
  }

  kvd::http::Snapshot CollectRaw() {
    kvd::http::Snapshot s;
    s.uptime_seconds = static_cast<double>(Now() - started_) * 1e-9;
    s.chunk_size = cfg_.chunk_size;
    const kvd::l1::L1Stats l1 = svc_->l1_stats();
    s.l1 = {l1.capacity_bytes, l1.used_bytes,      l1.entries,    l1.locked_entries,
            l1.resident_objects, l1.staging_objects, l1.pinned_objects, l1.evictions,
            l1.evicted_bytes, l1.populated_bytes, kvd::l1::PageKindName(svc_->l1().page_kind()),
            l1.lookup_locks, l1.shed_lookup_locks};
    const auto& c = svc_->counters();
    SumLookupCounters(c, static_cast<uint64_t>(cfg_.chunk_size), &s);
    s.counters.stores = c.stores.load();
    s.counters.store_failures = c.store_failures.load();
    s.counters.stored_chunks = c.stored_chunks.load();
    s.counters.stored_bytes = c.stored_bytes.load();
    s.counters.retrieves = c.retrieves.load();
    s.counters.retrieve_failures = c.retrieve_failures.load();
    s.counters.retrieved_chunks = c.retrieved_chunks.load();
    s.counters.retrieved_bytes = c.retrieved_bytes.load();
    kvd::server::ServiceStatus st = svc_->StatusSnapshot();
    for (auto& i : st.instances) {
      s.instances.push_back({i.instance_id, i.engine_driven, std::move(i.model_name), i.world_size,
                             std::move(i.layout), i.object_bytes, i.idle_seconds, i.pinged});
    }
    s.sessions = st.sessions;
    s.session_bytes = st.session_bytes;
    s.sessions_evicted = st.sessions_evicted;
    s.chunk_key_memo_hits = st.chunk_key_memo_hits;
    s.chunk_key_memo_misses = st.chunk_key_memo_misses;
    s.chunk_key_memo_bytes = st.chunk_key_memo_bytes;
    s.pending_engine_stores = st.pending_engine_stores;
    s.pending_engine_retrieves = st.pending_engine_retrieves;
    const auto& metrics = *metrics_;
    s.latency_bounds.assign(kvd::server::RequestMetrics::kLatencyBounds.begin(),
                            kvd::server::RequestMetrics::kLatencyBounds.end());
    for (auto& o : metrics.Snapshot()) {
      std::vector<kvd::http::PhaseView> phases;
      for (auto& p : o.phases) phases.push_back({std::move(p.name), std::move(p.buckets), p.sum_seconds});
      s.ops.push_back({std::move(o.name), o.requests, o.in_flight, std::move(o.buckets),
                       o.latency_sum_seconds, std::move(phases), o.refused});
    }
    s.unknown_ops = metrics.unknown_ops();
    auto loop = metrics.Loop();
    s.loop = {loop.iterations,       std::move(loop.buckets),      loop.sum_seconds,
              loop.longest_seconds,  loop.longest_inline_seconds,  std::move(loop.longest_inline_op)};
    s.families = registry_->Collect();  // counters already net of the registry's own reset
    return s;
  }

  uint64_t ClearCache() override {
    const uint64_t before = svc_->l1_stats().entries;
    svc_->Clear();
    const uint64_t after = svc_->l1_stats().entries;
    return before > after ? before - after : 0;
  }

  kvd::Status SetQuota(const std::string& salt, uint64_t limit_bytes) override {
    return svc_->l1().SetQuota(salt, limit_bytes);
  }
  bool DeleteQuota(const std::string& salt) override { return svc_->l1().DeleteQuota(salt); }
  kvd::http::QuotaView GetQuota(const std::string& salt) override {
    kvd::l1::QuotaInfo q = svc_->l1().GetQuota(salt);
    return {std::move(q.cache_salt), q.limit_bytes, q.usage_bytes};
  }
  std::vector<kvd::http::QuotaView> ListQuotas() override {
    std::vector<kvd::http::QuotaView> out;
    for (auto& q : svc_->l1().ListQuotas()) {
      out.push_back({std::move(q.cache_salt), q.limit_bytes, q.usage_bytes});
    }
    return out;
  }

  kvd::http::DeleteResult DeleteL1Objects(const std::vector<kvd::http::ObjectKeyRef>& keys,
                                          bool /*force: kvd never removes an entry in use*/) override {
    std::vector<kvd::server::KvService::L1EntryName> names;
    names.reserve(keys.size());
    for (const auto& k : keys) {
      // lmcache's kv_rank = (world << 24) | (rank << 16) | (world << 8) | rank.
      names.push_back({k.model_name, static_cast<int32_t>((k.kv_rank >> 24) & 0xff), k.cache_salt,
                       k.chunk_hash});
    }
    const auto n = svc_->DeleteL1Entries(names);
    return {n.removed, n.busy, {}};
  }

  void ResetMetrics() override {
    registry_->ResetCounters();
    kvd::http::Snapshot now = CollectRaw();
    kvd::MutexLock lock(&baseline_mu_);
    baseline_ = std::move(now);
  }

  std::vector<kvd::http::L2AdapterView> L2Adapters() override {
    std::vector<kvd::http::L2AdapterView> out;
    const kvd::l2::TierSet* tiers = svc_->tiers();
    if (!tiers) return out;
    const kvd::l2::TierSetStats ts = tiers->stats();
    for (size_t i = 0; i < ts.tiers.size(); ++i) {
      out.push_back({ts.tiers[i].type, ts.tiers[i].name, tiers->adapter_config(i).shared});
    }
    return out;
  }

  kvd::Result<std::vector<kvd::http::L2ObjectView>> ListL2Objects(size_t index) override {
    kvd::l2::TierSet* tiers = svc_->tiers();
    if (!tiers) return kvd::Status::Unavailable("no L2 adapters configured");
    using Listing = kvd::Result<std::vector<kvd::l2::ScannedObject>>;
    auto answer = std::make_shared<std::promise<Listing>>();
    auto future = answer->get_future();
    tiers->ListObjects(index, [answer](Listing r) { answer->set_value(std::move(r)); });
    if (future.wait_for(kTierCallTimeout) != std::future_status::ready) {
      return kvd::Status::Unavailable("the tier did not list its objects within 30 s");
    }
    Listing r = future.get();
    if (!r.ok()) return r.status();
    std::vector<kvd::http::L2ObjectView> out;
    for (const auto& o : r.value()) {
      kvd::http::L2ObjectView v;
      v.key.chunk_hash = o.key.chunk_hash;
      v.key.model_name = o.key.model_name;
      v.key.kv_rank = o.key.kv_rank;
      v.key.object_group_id = o.key.object_group;
      v.key.cache_salt = o.key.cache_salt;
      v.key.layout_tag = o.key.layout_tag;
      v.size_bytes = o.bytes;
      out.push_back(std::move(v));
    }
    return out;
  }

  kvd::Result<kvd::http::DeleteResult> DeleteL2Objects(
      size_t index, const std::vector<kvd::http::ObjectKeyRef>& keys) override {
    kvd::l2::TierSet* tiers = svc_->tiers();
    if (!tiers) return kvd::Status::Unavailable("no L2 adapters configured");
    std::vector<kvd::l2::ObjectKey> names;
    names.reserve(keys.size());
    for (const auto& k : keys) {
      kvd::l2::ObjectKey key;
      key.model_name = k.model_name;
      key.kv_rank = static_cast<uint32_t>(k.kv_rank);
      key.object_group = static_cast<uint32_t>(k.object_group_id);
      key.chunk_hash = k.chunk_hash;
      key.cache_salt = k.cache_salt;
      key.layout_tag = k.layout_tag;
      names.push_back(std::move(key));
    }
    auto answer = std::make_shared<std::promise<std::vector<kvd::l2::ItemResult>>>();
    auto future = answer->get_future();
    tiers->DeleteObjects(index, std::move(names),
                         [answer](std::vector<kvd::l2::ItemResult> r) { answer->set_value(std::move(r)); });
    if (future.wait_for(kTierCallTimeout) != std::future_status::ready) {
      return kvd::Status::Unavailable("the tier did not answer the delete within 30 s");
    }
    kvd::http::DeleteResult out;
    for (const auto& r : future.get()) {
      if (!r.status.ok()) {
        if (out.error.empty()) out.error = r.status.message();
      } else if (r.bytes > 0) {
        out.deleted++;
      }
    }
    return out;
  }

 private:
  static constexpr std::chrono::seconds kTierCallTimeout{30};

  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // One NOOP through the real socket loop.
  bool ProbeZmq() KVD_REQUIRES(probe_mu_) {
    try {
      zmq::socket_t sock(ctx_, zmq::socket_type::dealer);
      sock.set(zmq::sockopt::linger, 0);
      if (probe_endpoint_.find('[') != std::string::npos) sock.set(zmq::sockopt::ipv6, 1);
      sock.connect(probe_endpoint_);
      const std::string uid = kvd::wire::EncodeInt(++probe_uid_);
      const std::string op = kvd::wire::EncodeInt(kvd::wire::InfoOf(kvd::wire::Op::kNoop).legacy_id);
      sock.send(zmq::buffer(uid), zmq::send_flags::sndmore);
      sock.send(zmq::buffer(op), zmq::send_flags::none);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (std::chrono::steady_clock::now() < deadline) {
        zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(100));
        if (!(item.revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> reply;
        if (!zmq::recv_multipart(sock, std::back_inserter(reply), zmq::recv_flags::dontwait)) continue;
        if (!reply.empty() && reply[0].to_string() == uid) return true;
      }
    } catch (const zmq::error_t& e) {
      spdlog::debug("healthcheck probe failed: {}", e.what());
    }
    return false;
  }

  kvd::server::KvService* const svc_;
  const kvd::server::RequestMetrics* const metrics_;  // owned by RunServer
  kvd::metrics::Registry* const registry_;            // owned by RunServer
  const kvd::server::ServerConfig cfg_;
  const std::atomic<bool>* const stopping_;
  const std::atomic<int64_t>* const beat_ns_;
  const int64_t started_;
  kvd::Mutex baseline_mu_;
  std::optional<kvd::http::Snapshot> baseline_ KVD_GUARDED_BY(baseline_mu_);  // see ResetMetrics
  std::string probe_endpoint_;
  zmq::context_t ctx_{1};
  kvd::Mutex probe_mu_;
  int64_t probed_ns_ KVD_GUARDED_BY(probe_mu_) = 0;
  bool probe_ok_ KVD_GUARDED_BY(probe_mu_) = false;
  int64_t probe_uid_ KVD_GUARDED_BY(probe_mu_) = 0;
};


}  // namespace

std::unique_ptr<ServiceStats> NewServiceStats(ServiceStatsParts parts) {
  return std::make_unique<ServiceStatsImpl>(std::move(parts));
}

}  // namespace kvd::cli
