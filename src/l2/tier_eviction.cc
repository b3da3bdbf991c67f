// TierSet accounting and eviction: the object index of capacity tiers (filled at startup by
// a scan, so objects of earlier runs count), LRU recency, and the eviction round.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "l2/tier_set.h"
#include "l2/tier_set_internal.h"

namespace kvd::l2 {

void TierSet::TierState::AccountLocked(const ObjectKey& key, uint64_t bytes, int64_t now_ns) {
  if (capacity == 0) {  // no declared capacity: usage only, no index
    return;
  }
  const std::string id = RespKey(key);
  auto it = index.find(id);
  if (it == index.end()) {
    Obj o;
    o.bytes = bytes;
    lru.push_back(id);
    o.lru = std::prev(lru.end());
    index.emplace(id, o);
    usage += bytes;
    return;
  }
  TouchLocked(id, now_ns, 0);
}

void TierSet::TierState::TouchLocked(const std::string& id, int64_t, int busy_delta) {
  auto it = index.find(id);
  if (it == index.end()) return;
  lru.splice(lru.end(), lru, it->second.lru);
  it->second.busy = std::max(0, it->second.busy + busy_delta);
}

void TierSet::ScanTier(TierState& t) {
  calls_in_flight_++;
  t.spec.tier->Scan([this, &t](Result<std::vector<ScannedObject>> r) {
    if (!r.ok()) {
      spdlog::warn("l2 {}: could not list the objects of earlier runs ({}); only objects this "
                   "run touches are accounted", t.name, r.status().message());
    } else {
      auto objs = std::move(r).value();
      // Oldest first, so the LRU order of objects from earlier runs follows their age.
      std::sort(objs.begin(), objs.end(),
                [](const ScannedObject& a, const ScannedObject& b) { return a.mtime_ns < b.mtime_ns; });
      uint64_t bytes = 0;
      MutexLock lock(&t.mu);
      std::list<std::string> older;
      for (const auto& o : objs) {
        const std::string id = RespKey(o.key);
        if (t.index.count(id)) continue;  // this run saw it already
        older.push_back(id);
        TierState::Obj ob;
        ob.bytes = o.bytes;
        ob.lru = std::prev(older.end());
        t.index.emplace(id, ob);
        t.usage += o.bytes;
        bytes += o.bytes;
      }
      t.lru.splice(t.lru.begin(), older);  // objects of earlier runs are the least recent
      t.scanned = true;
      spdlog::info("l2 {}: {} object(s), {:.2f} GiB found from earlier runs (capacity {:.2f} GiB)",
                   t.name, objs.size(), static_cast<double>(bytes) / (1ull << 30),
                   static_cast<double>(t.capacity) / (1ull << 30));
    }
    calls_in_flight_--;
  });
}

void TierSet::EvictTier(TierState& t) {
  if (!t.eviction || t.eviction->policy != "LRU" || t.capacity == 0) return;
  std::vector<ObjectKey> victims;
  uint64_t planned = 0;
  {
    MutexLock lock(&t.mu);
    if (t.evicting) return;
    const double used = static_cast<double>(t.usage);
    if (used < t.eviction->trigger_watermark * static_cast<double>(t.capacity)) return;
    const uint64_t target = static_cast<uint64_t>(t.eviction->eviction_ratio * static_cast<double>(t.capacity));
    for (const auto& id : t.lru) {
      if (planned >= target) break;
      const auto& o = t.index.at(id);
      if (o.busy > 0) continue;
      auto key = ParseRespKey(id);
      if (!key) continue;
      victims.push_back(std::move(*key));
      planned += o.bytes;
    }
    if (victims.empty()) return;
    t.evicting = true;
  }
  calls_in_flight_++;
  auto keys = std::make_shared<std::vector<ObjectKey>>(victims);
  t.spec.tier->Delete(std::move(victims), [this, &t, keys](std::vector<ItemResult> results) {
    uint64_t n = 0, bytes = 0;
    {
      MutexLock lock(&t.mu);
      for (size_t i = 0; i < results.size() && i < keys->size(); ++i) {
        if (!results[i].status.ok()) {
          t.NoteError(results[i].status.message());
          continue;
        }
        // Gone from the tier, so gone from the index, even when a load of it started after
        // the round was planned (that load answers NotFound, or read it before the delete).
        auto it = t.index.find(RespKey((*keys)[i]));
        if (it == t.index.end()) continue;
        t.usage -= std::min(t.usage, it->second.bytes);
        bytes += it->second.bytes;
        t.lru.erase(it->second.lru);
        t.index.erase(it);
        n++;
      }
      t.st.evicted_objects += n;
      t.st.evicted_bytes += bytes;
      t.evicting = false;
    }
    spdlog::info("l2 {}: evicted {} object(s), {:.1f} MiB", t.name, n, static_cast<double>(bytes) / (1 << 20));
    calls_in_flight_--;
  });
}

}  // namespace kvd::l2
