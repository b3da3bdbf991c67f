// A StatsSource and AdminPort with settable answers, for the http tests.
#pragma once

#include <atomic>
#include <map>
#include <mutex>

#include "http/stats_source.h"

namespace kvd::http {

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
    uint64_t n = snapshot.l1.entries;
    snapshot.l1.entries = 0;
    snapshot.l1.used_bytes = 0;
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
    snapshot.counters = {};
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

// A snapshot with some of everything.
inline Snapshot SampleSnapshot() {
  Snapshot s;
  s.uptime_seconds = 42.5;
  s.chunk_size = 256;
  s.l1.capacity_bytes = 1000;
  s.l1.used_bytes = 250;
  s.l1.entries = 7;
  s.l1.locked_entries = 2;
  s.l1.evictions = 3;
  s.l1.evicted_bytes = 300;
  s.counters.lookups = 4;
  s.counters.lookup_tokens = 2048;
  s.counters.hit_tokens = 512;
  s.counters.hit_l1_tokens = 256;
  s.counters.hit_l2_tokens = 256;
  s.counters.stores = 10;
  s.counters.store_failures = 1;
  s.counters.stored_chunks = 12;
  s.counters.stored_bytes = 12 << 20;
  s.counters.retrieves = 5;
  s.counters.retrieved_chunks = 2;
  s.counters.retrieved_bytes = 2 << 20;
  s.instances.push_back({17, false, "llama\"3", 2, "2 groups: ...", 1 << 20, 1.5, true});
  s.sessions = 3;
  s.latency_bounds = {0.001, 0.01, 0.1};
  s.ops.push_back({"store", 10, 1, {6, 3, 1, 0}, 0.02,
                   {{"decode", {10, 0, 0, 0}, 0.001}, {"copy", {2, 7, 1, 0}, 0.015}}, 2});
  s.ops.push_back({"lookup", 4, 0, {0, 0, 0, 4}, 1.0, {}, 0});
  s.loop = {50, {45, 4, 1, 0}, 0.03, 0.02, 0.0005, "lookup"};
  return s;
}

}  // namespace kvd::http
