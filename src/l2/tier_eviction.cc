// A tier's accounting and eviction (TierState, tier_state.h): the object index of capacity
// tiers (l2/tier_index.h, filled at startup by a scan, so objects of earlier runs count) and
// the eviction round.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "l2/tier_state.h"

namespace kvd::l2 {

void TierState::AccountLocked(const ObjectKey& key, uint64_t bytes, const ChunkSlot* chunk) {
  if (capacity == 0) return;  // no declared capacity: usage only, no index
  index.Account(RespKey(key), bytes, chunk);
}

void TierState::BusyLocked(const ObjectKey& key, int busy_delta) {
  if (capacity == 0) return;
  index.Busy(RespKey(key), busy_delta);
}

void TierState::NoteError(const std::string& what, bool operational) {
  last_error = what;
  last_error_count++;
  if (operational) failures_in_a_row++;
}

void TierState::ScanEarlierRuns(TierCalls& calls) {
  TierState& t = *this;
  calls.Begin();
  t.spec.tier->Scan([&t, &calls](Result<std::vector<ScannedObject>> r) {
    if (!r.ok()) {
      spdlog::warn("l2 {}: could not list the objects of earlier runs ({}); only objects this "
                   "run touches are accounted", t.name, r.status().message());
    } else {
      auto objs = std::move(r).value();
      // Oldest first, so the LRU order of objects from earlier runs follows their age.
      std::sort(objs.begin(), objs.end(),
                [](const ScannedObject& a, const ScannedObject& b) { return a.mtime_ns < b.mtime_ns; });
      std::vector<std::pair<std::string, uint64_t>> older;  // oldest first
      older.reserve(objs.size());
      for (const auto& o : objs) older.emplace_back(RespKey(o.key), o.bytes);
      MutexLock lock(&t.mu);
      // Objects of earlier runs are the least recent; those this run saw already stay as they are.
      const uint64_t bytes = t.index.AddOlder(older);
      t.scanned = true;
      spdlog::info("l2 {}: {} object(s), {:.2f} GiB found from earlier runs (capacity {:.2f} GiB)",
                   t.name, objs.size(), static_cast<double>(bytes) / (1ull << 30),
                   static_cast<double>(t.capacity) / (1ull << 30));
    }
    calls.End();
  });
}

void TierState::Evict(TierCalls& calls, std::function<void(std::vector<ChunkSlot>)> removed) {
  TierState& t = *this;
  if (!t.eviction || t.eviction->policy == "noop" || t.capacity == 0) return;
  std::vector<ObjectKey> victims;
  {
    MutexLock lock(&t.mu);
    if (t.evicting) return;
    const double used = static_cast<double>(t.index.usage());
    if (used < t.eviction->trigger_watermark * static_cast<double>(t.capacity)) return;
    const uint64_t target = static_cast<uint64_t>(t.eviction->eviction_ratio * static_cast<double>(t.capacity));
    for (const std::string& id : t.index.PlanVictims(target)) {
      auto key = ParseRespKey(id);
      if (!key) continue;  // not a name kvd writes: stays planned, so never offered again
      victims.push_back(std::move(*key));
    }
    if (victims.empty()) return;
    t.evicting = true;
  }
  calls.Begin();
  auto keys = std::make_shared<std::vector<ObjectKey>>(victims);
  t.spec.tier->Delete(std::move(victims), [&t, &calls, keys, removed = std::move(removed)](
                                             std::vector<ItemResult> results) {
    uint64_t n = 0, bytes = 0;
    std::vector<ChunkSlot> slots;
    {
      MutexLock lock(&t.mu);
      for (size_t i = 0; i < keys->size(); ++i) {
        const std::string id = RespKey((*keys)[i]);
        if (i >= results.size() || !results[i].status.ok()) {
          if (i < results.size()) t.NoteError(results[i].status.message());
          t.index.Unplan(id);  // still there: a candidate again
          continue;
        }
        // Gone from the tier, so gone from the index, even when a load of it started after
        // the round was planned (that load answers NotFound, or read it before the delete).
        if (!t.index.contains(id)) continue;
        std::optional<ChunkSlot> slot;
        bytes += t.index.Remove(id, &slot);
        if (slot) slots.push_back(*slot);
        n++;
      }
      t.st.evicted_objects += n;
      t.st.evicted_bytes += bytes;
      t.evicting = false;
    }
    spdlog::info("l2 {}: evicted {} object(s), {:.1f} MiB", t.name, n, static_cast<double>(bytes) / (1 << 20));
    if (removed && !slots.empty()) removed(std::move(slots));
    calls.End();
  });
}

}  // namespace kvd::l2
