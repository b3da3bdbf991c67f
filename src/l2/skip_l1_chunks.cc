#include "l2/skip_l1_chunks.h"

#include <utility>

namespace kvd::l2 {

void SkipL1Chunks::Stored(const std::vector<CommittedObject>& objects, const std::atomic<bool>* stored) {
  std::vector<l1::ChunkKey> complete;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < objects.size(); ++i) {
      const CommittedObject& o = objects[i];
      if (!stored[i] || o.num_slots == 0 || o.slot >= o.num_slots) continue;
      Chunk& c = chunks_[o.chunk];
      if (c.slots.size() != o.num_slots) c = Chunk{std::vector<bool>(o.num_slots, false), 0};
      if (c.slots[o.slot]) continue;
      c.slots[o.slot] = true;
      if (++c.held == o.num_slots) complete.push_back(o.chunk);
    }
  }
  if (complete.empty()) return;
  // Removed now when idle; a busy one (read-locked, pinned) stays recorded for the sweep.
  std::vector<l1::ChunkKey> gone;
  for (const auto& k : complete) {
    if (l1_->RemoveIfIdle({&k, 1}) > 0) {
      removed_++;
      gone.push_back(k);
    }
  }
  MutexLock lock(&mu_);
  for (const auto& k : gone) chunks_.erase(k);
}

void SkipL1Chunks::Sweep() {
  std::vector<std::pair<l1::ChunkKey, Chunk>> records;
  {
    MutexLock lock(&mu_);
    if (chunks_.empty()) return;
    records.assign(chunks_.begin(), chunks_.end());
  }
  // A complete chunk is removed once idle; a record is dropped once none of its held slots
  // is in L1 any more (evicted, cleared, removed by someone else).
  std::vector<std::pair<l1::ChunkKey, uint32_t>> drop;  // key, held count seen
  for (const auto& [k, c] : records) {
    if (c.held == c.slots.size() && l1_->RemoveIfIdle({&k, 1}) > 0) {
      removed_++;
      drop.emplace_back(k, c.held);
      continue;
    }
    bool any = false;
    for (uint32_t s = 0; s < c.slots.size() && !any; ++s) any = c.slots[s] && l1_->IsResident(k, s);
    if (!any) drop.emplace_back(k, c.held);
  }
  MutexLock lock(&mu_);
  for (const auto& [k, held] : drop) {
    auto it = chunks_.find(k);
    if (it != chunks_.end() && it->second.held == held) chunks_.erase(it);
  }
}

size_t SkipL1Chunks::waiting() const {
  MutexLock lock(&mu_);
  return chunks_.size();
}

}  // namespace kvd::l2
