#include "l2/prefetched_chunks.h"

#include <vector>

namespace kvd::l2 {

void PrefetchedChunks::Add(std::span<const l1::ChunkKey> committed) {
  if (committed.empty()) return;
  const int64_t now = clock_->NowNanos();
  MutexLock lock(&mu_);
  for (const auto& k : committed) added_ns_.insert_or_assign(k, now);
}

void PrefetchedChunks::AfterRetrieve(std::span<const l1::ChunkKey> chunks) {
  std::vector<l1::ChunkKey> mine;
  {
    MutexLock lock(&mu_);
    if (added_ns_.empty()) return;
    for (const auto& k : chunks) {
      if (added_ns_.count(k)) mine.push_back(k);
    }
  }
  Remove(mine);
}

void PrefetchedChunks::Sweep() {
  std::vector<l1::ChunkKey> keys;
  {
    // A chunk just committed is not taken yet: its lookup read-locks it right after (the
    // retrieve then lets it go); the sweep is for chunks no retrieve came for.
    const int64_t cutoff = clock_->NowNanos() - kGraceNs;
    MutexLock lock(&mu_);
    for (const auto& [k, added_ns] : added_ns_) {
      if (added_ns <= cutoff) keys.push_back(k);
    }
  }
  Remove(keys);
}

void PrefetchedChunks::Remove(const std::vector<l1::ChunkKey>& keys) {
  if (keys.empty()) return;
  l1_->RemoveIfIdle(keys);
  MutexLock lock(&mu_);
  for (const auto& k : keys) {
    if (!l1_->IsResident(k, 0)) added_ns_.erase(k);
  }
}

size_t PrefetchedChunks::size() const {
  MutexLock lock(&mu_);
  return added_ns_.size();
}

}  // namespace kvd::l2
