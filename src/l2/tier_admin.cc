// TierSet's operator calls: listing and deleting a tier's objects (the /cache/objects routes).
#include <spdlog/spdlog.h>

#include "l2/tier_set.h"

namespace kvd::l2 {

const AdapterConfig& TierSet::adapter_config(size_t index) const {
  return tiers_.at(index)->spec.config;
}

void TierSet::ListObjects(size_t index, Tier::ScanDone done) {
  if (index >= tiers_.size()) {
    done(Status::InvalidArgument("no tier " + std::to_string(index)));
    return;
  }
  TierState& t = *tiers_[index];
  calls_.Begin();
  t.spec.tier->Scan([this, done = std::move(done)](Result<std::vector<ScannedObject>> r) {
    done(std::move(r));
    calls_.End();
  });
}

void TierSet::DeleteObjects(size_t index, std::vector<ObjectKey> keys, Tier::Done done) {
  if (index >= tiers_.size()) {
    done(std::vector<ItemResult>(keys.size(),
                                 ItemResult{Status::InvalidArgument("no tier " + std::to_string(index)), 0}));
    return;
  }
  TierState& t = *tiers_[index];
  auto ids = std::make_shared<std::vector<std::string>>();
  ids->reserve(keys.size());
  for (const auto& k : keys) ids->push_back(RespKey(k));
  calls_.Begin();
  t.spec.tier->Delete(std::move(keys), [this, &t, ids, done = std::move(done)](
                                           std::vector<ItemResult> results) {
    uint64_t n = 0;
    std::vector<ChunkSlot> slots;
    {
      MutexLock lock(&t.mu);
      for (size_t i = 0; i < results.size() && i < ids->size(); ++i) {
        if (!results[i].status.ok()) {
          t.NoteError(results[i].status.message());
          continue;
        }
        if (results[i].bytes > 0) n++;
        std::optional<ChunkSlot> slot;
        t.index.Remove((*ids)[i], &slot);
        if (slot) slots.push_back(*slot);
      }
    }
    spdlog::info("l2 {}: {} object(s) deleted on request", t.name, n);
    SlotsLeftATier(std::move(slots));
    done(std::move(results));
    calls_.End();
  });
}

}  // namespace kvd::l2
