#include "cli/service_stats.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <future>
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

class ServiceStatsImpl final : public ServiceStats {
 public:
  explicit ServiceStatsImpl(ServiceStatsParts parts)
      : svc_(parts.service),
        registry_(parts.registry),
        cfg_(*parts.config),
        stopping_(parts.stopping),
        beat_ns_(parts.maintenance_beat_ns),
        started_(Now()),
        probe_endpoint_(std::move(parts.probe_endpoint)) {
    using kvd::metrics::Kind;
    metric_handles_.push_back(registry_->AddCollected(
        {"kvd_build_info", "kvd version (value is always 1).", Kind::kGauge, {"version", "lmcache_protocol"}, {}},
        [version = std::move(parts.version)](kvd::metrics::SeriesSink& sink) { sink.Add({version, "0.5.6"}, 1); }));
    metric_handles_.push_back(registry_->AddCollected(
        {"kvd_uptime_seconds", "Seconds since kvd started.", Kind::kGauge, {}, {}},
        [this](kvd::metrics::SeriesSink& sink) { sink.Add(static_cast<double>(Now() - started_) * 1e-9); }));
  }

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

  // Counters count from the last POST /metrics/reset (the registry rebases them; gauges and
  // histograms are absolute).
  kvd::http::Snapshot Collect() override {
    kvd::http::Snapshot s;
    s.chunk_size = cfg_.chunk_size;
    for (auto& i : svc_->StatusSnapshot().instances) {
      s.instances.push_back({i.instance_id, i.engine_driven, std::move(i.model_name), i.world_size,
                             std::move(i.layout), i.object_bytes, i.idle_seconds, i.pinged});
    }
    s.families = registry_->Collect();
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

  void ResetMetrics() override { registry_->ResetCounters(); }

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
  kvd::metrics::Registry* const registry_;            // owned by RunServer
  const kvd::server::ServerConfig cfg_;
  const std::atomic<bool>* const stopping_;
  const std::atomic<int64_t>* const beat_ns_;
  const int64_t started_;
  std::string probe_endpoint_;
  zmq::context_t ctx_{1};
  kvd::Mutex probe_mu_;
  int64_t probed_ns_ KVD_GUARDED_BY(probe_mu_) = 0;
  bool probe_ok_ KVD_GUARDED_BY(probe_mu_) = false;
  int64_t probe_uid_ KVD_GUARDED_BY(probe_mu_) = 0;
  std::vector<kvd::metrics::CollectorHandle> metric_handles_;  // last: unregistered first
};


}  // namespace

std::unique_ptr<ServiceStats> NewServiceStats(ServiceStatsParts parts) {
  return std::make_unique<ServiceStatsImpl>(std::move(parts));
}

}  // namespace kvd::cli
