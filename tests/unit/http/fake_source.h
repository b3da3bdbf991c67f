// A StatsSource and AdminPort with settable answers, for the http tests.
#pragma once

#include <atomic>
#include <map>
#include <mutex>

#include "http/stats_source.h"

namespace kvd::http {

// Sets series `label_values` of family `name` (created with `label_names` when absent).
inline void SetValue(Snapshot& s, const std::string& name, metrics::Kind kind, double value,
                     std::vector<std::string> label_names = {}, std::vector<std::string> label_values = {}) {
  metrics::FamilySnapshot* f = nullptr;
  for (auto& x : s.families) {
    if (x.desc.name == name) f = &x;
  }
  if (f == nullptr) {
    f = &s.families.emplace_back();
    f->desc = {name, name, kind, std::move(label_names), {}};
  }
  for (auto& series : f->series) {
    if (series.label_values == label_values) {
      series.value = value;
      return;
    }
  }
  metrics::Series series;
  series.label_values = std::move(label_values);
  series.value = value;
  f->series.push_back(std::move(series));
}

// Adds one histogram series (per-bucket counts, not cumulative) to family `name`.
inline void AddHistogram(Snapshot& s, const std::string& name, std::vector<std::string> label_names,
                         std::vector<std::string> label_values, std::vector<double> bounds,
                         std::vector<uint64_t> buckets, double sum) {
  metrics::FamilySnapshot* f = nullptr;
  for (auto& x : s.families) {
    if (x.desc.name == name) f = &x;
  }
  if (f == nullptr) {
    f = &s.families.emplace_back();
    f->desc = {name, name, metrics::Kind::kHistogram, std::move(label_names), std::move(bounds)};
  }
  metrics::Series series;
  series.label_values = std::move(label_values);
  series.buckets = std::move(buckets);
  series.sum = sum;
  f->series.push_back(std::move(series));
}

class FakeSource : public StatsSource, public AdminPort {
 public:
  Health CheckHealth() override {
    std::lock_guard<std::mutex> lock(mu_);
    return health;
  }
  Snapshot Collect() override {
    collects++;
    std::lock_guard<std::mutex> lock(mu_);
    return snapshot;
  }
  uint64_t ClearCache() override {
    clears++;
    std::lock_guard<std::mutex> lock(mu_);
    const auto n = static_cast<uint64_t>(metrics::ValueOf(snapshot.families, "kvd_l1_entries"));
    SetValue(snapshot, "kvd_l1_entries", metrics::Kind::kGauge, 0);
    SetValue(snapshot, "lmcache_mp_l1_memory_usage_bytes", metrics::Kind::kGauge, 0);
    return n;
  }
  Status SetQuota(const std::string& salt, uint64_t limit_bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (salt.size() > 64) return Status::InvalidArgument("cache salt too long");
    limits[salt] = limit_bytes;
    return Status::Ok();
  }
  bool DeleteQuota(const std::string& salt) override {
    std::lock_guard<std::mutex> lock(mu_);
    return limits.erase(salt) > 0;
  }
  QuotaView GetQuota(const std::string& salt) override {
    std::lock_guard<std::mutex> lock(mu_);
    QuotaView q{salt, std::nullopt, usage.count(salt) ? usage[salt] : 0};
    if (auto it = limits.find(salt); it != limits.end()) q.limit_bytes = it->second;
    return q;
  }
  std::vector<QuotaView> ListQuotas() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<QuotaView> out;
    for (const auto& [salt, limit] : limits) {
      out.push_back({salt, limit, usage.count(salt) ? usage[salt] : 0});
    }
    return out;
  }
  void SetUsage(const std::string& salt, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    usage[salt] = bytes;
  }
  // Keys whose model name is "busy" are skipped, "absent" ones ignored, others deleted.
  DeleteResult DeleteL1Objects(const std::vector<ObjectKeyRef>& keys, bool /*force*/) override {
    DeleteResult r;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& k : keys) {
      deleted_keys.push_back(k);
      if (k.model_name == "absent") continue;
      if (k.model_name == "busy") {
        ++r.skipped;
      } else {
        ++r.deleted;
      }
    }
    return r;
  }
  void ResetMetrics() override {
    resets++;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& f : snapshot.families) {
      if (f.desc.kind != metrics::Kind::kCounter) continue;
      for (auto& series : f.series) series.value = 0;
    }
  }
  std::vector<L2AdapterView> L2Adapters() override {
    std::lock_guard<std::mutex> lock(mu_);
    return adapters;
  }
  Result<std::vector<L2ObjectView>> ListL2Objects(size_t index) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (index >= adapters.size()) return Status::InvalidArgument("no such tier");
    if (!list_error.empty()) return Status::Unavailable(list_error);
    return l2_objects;
  }
  // Deletes from l2_objects the keys that match one (model, rank, group, hash, salt, tag).
  Result<DeleteResult> DeleteL2Objects(size_t index, const std::vector<ObjectKeyRef>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (index >= adapters.size()) return Status::InvalidArgument("no such tier");
    l2_delete_tier = static_cast<int>(index);
    DeleteResult r;
    for (const auto& k : keys) {
      auto same = [&](const L2ObjectView& o) {
        return o.key.model_name == k.model_name && o.key.kv_rank == k.kv_rank &&
               o.key.object_group_id == k.object_group_id && o.key.chunk_hash == k.chunk_hash &&
               o.key.cache_salt == k.cache_salt && o.key.layout_tag == k.layout_tag;
      };
      const auto before = l2_objects.size();
      std::erase_if(l2_objects, same);
      if (l2_objects.size() < before) r.deleted++;
    }
    return r;
  }
  void SetL2(std::vector<L2AdapterView> a, std::vector<L2ObjectView> objects) {
    std::lock_guard<std::mutex> lock(mu_);
    adapters = std::move(a);
    l2_objects = std::move(objects);
  }
  std::vector<L2ObjectView> L2Objects() {
    std::lock_guard<std::mutex> lock(mu_);
    return l2_objects;
  }
  std::vector<ObjectKeyRef> DeletedKeys() {
    std::lock_guard<std::mutex> lock(mu_);
    return deleted_keys;
  }
  void Set(const Snapshot& s) {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot = s;
  }
  void SetHealth(Health h) {
    std::lock_guard<std::mutex> lock(mu_);
    health = std::move(h);
  }

  std::atomic<int> collects{0};
  std::atomic<int> clears{0};
  std::atomic<int> resets{0};

 private:
  std::mutex mu_;
  Health health;
  Snapshot snapshot;
  std::map<std::string, uint64_t> limits;
  std::map<std::string, uint64_t> usage;
  std::vector<ObjectKeyRef> deleted_keys;
  std::vector<L2AdapterView> adapters;
  std::vector<L2ObjectView> l2_objects;

 public:
  std::string list_error;   // set before use: ListL2Objects fails with it
  int l2_delete_tier = -1;  // the tier the last DeleteL2Objects addressed
};

// A snapshot with some of everything, under the names the owners register.
inline Snapshot SampleSnapshot() {
  using metrics::Kind;
  Snapshot s;
  s.chunk_size = 256;
  SetValue(s, "kvd_uptime_seconds", Kind::kGauge, 42.5);
  SetValue(s, "kvd_build_info", Kind::kGauge, 1, {"version", "lmcache_protocol"}, {"1.2.3", "0.5.6"});
  SetValue(s, "kvd_l1_capacity_bytes", Kind::kGauge, 1000);
  SetValue(s, "lmcache_mp_l1_memory_usage_bytes", Kind::kGauge, 250);
  SetValue(s, "kvd_l1_entries", Kind::kGauge, 7);
  SetValue(s, "kvd_l1_locked_entries", Kind::kGauge, 2);
  SetValue(s, "lmcache_mp_l1_evicted_chunks_total", Kind::kCounter, 3);
  SetValue(s, "kvd_l1_evicted_bytes_total", Kind::kCounter, 300);
  SetValue(s, "kvd_l1_info", Kind::kGauge, 1, {"page_kind"}, {"thp"});
  // Two (cache_salt, model_name) series: /status sums them.
  for (const char* salt : {"", "tenant"}) {
    SetValue(s, "lmcache_mp_lookups_requests_total", Kind::kCounter, 2, {"cache_salt", "model_name"}, {salt, "m"});
    SetValue(s, "lmcache_mp_lookup_requested_tokens_total", Kind::kCounter, 1024, {"cache_salt", "model_name"},
             {salt, "m"});
    SetValue(s, "lmcache_mp_lookup_hit_tokens_total", Kind::kCounter, 256, {"cache_salt", "model_name"}, {salt, "m"});
  }
  SetValue(s, "kvd_store_requests_total", Kind::kCounter, 10);
  SetValue(s, "kvd_store_failures_total", Kind::kCounter, 1);
  SetValue(s, "lmcache_mp_l1_write_chunks_total", Kind::kCounter, 12);
  SetValue(s, "kvd_stored_bytes_total", Kind::kCounter, 12 << 20);
  SetValue(s, "kvd_retrieve_requests_total", Kind::kCounter, 5);
  SetValue(s, "lmcache_mp_l1_read_chunks_total", Kind::kCounter, 2);
  SetValue(s, "kvd_retrieved_bytes_total", Kind::kCounter, 2 << 20);
  s.instances.push_back({17, false, "llama\"3", 2, "2 groups: ...", 1 << 20, 1.5, true});
  SetValue(s, "kvd_registered_instances", Kind::kGauge, 1);
  SetValue(s, "kvd_active_sessions", Kind::kGauge, 3);
  SetValue(s, "kvd_engine_driven_pending_operations", Kind::kGauge, 4, {"op"}, {"store"});
  SetValue(s, "kvd_requests_total", Kind::kCounter, 10, {"op"}, {"store"});
  SetValue(s, "kvd_requests_total", Kind::kCounter, 4, {"op"}, {"lookup"});
  SetValue(s, "kvd_requests_in_flight", Kind::kGauge, 1, {"op"}, {"store"});
  SetValue(s, "kvd_requests_in_flight", Kind::kGauge, 0, {"op"}, {"lookup"});
  const std::vector<double> bounds = {0.001, 0.01, 0.1};
  AddHistogram(s, "kvd_request_duration_seconds", {"op"}, {"store"}, bounds, {6, 3, 1, 0}, 0.02);
  AddHistogram(s, "kvd_request_duration_seconds", {"op"}, {"lookup"}, bounds, {0, 0, 0, 4}, 1.0);
  AddHistogram(s, "kvd_request_phase_seconds", {"op", "phase"}, {"store", "decode"}, bounds, {10, 0, 0, 0}, 0.001);
  AddHistogram(s, "kvd_request_phase_seconds", {"op", "phase"}, {"store", "copy"}, bounds, {2, 7, 1, 0}, 0.015);
  return s;
}

}  // namespace kvd::http
