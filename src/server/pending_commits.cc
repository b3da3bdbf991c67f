#include "server/pending_commits.h"

#include <utility>

namespace kvd::server {

void PendingCommits::Hold::Release() {
  if (!table_) return;
  table_->Remove(keys_);
  keys_.clear();
  table_.reset();
}

PendingCommits::Hold PendingCommits::Add(std::vector<l1::ChunkKey> keys) {
  Hold hold;
  if (keys.empty()) return hold;
  {
    MutexLock lock(&mu_);
    for (const auto& k : keys) ++keys_[k];
    listed_.fetch_add(keys.size(), std::memory_order_acq_rel);
  }
  hold.table_ = shared_from_this();
  hold.keys_ = std::move(keys);
  return hold;
}

void PendingCommits::Remove(std::span<const l1::ChunkKey> keys) {
  if (keys.empty()) return;
  {
    MutexLock lock(&mu_);
    for (const auto& k : keys) {
      auto it = keys_.find(k);
      if (it == keys_.end()) continue;
      if (--it->second == 0) keys_.erase(it);
    }
    listed_.fetch_sub(keys.size(), std::memory_order_acq_rel);
  }
  changed_.NotifyAll();
}

bool PendingCommits::Contains(const l1::ChunkKey& key) const {
  if (!any()) return false;
  MutexLock lock(&mu_);
  return keys_.count(key) != 0;
}

bool PendingCommits::AnyListedLocked(std::span<const l1::ChunkKey> keys) const {
  for (const auto& k : keys) {
    if (keys_.count(k) != 0) return true;
  }
  return false;
}

bool PendingCommits::Wait(std::span<const l1::ChunkKey> keys, std::chrono::milliseconds timeout) {
  if (keys.empty() || !any()) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  if (!AnyListedLocked(keys)) return false;
  waits_.fetch_add(1, std::memory_order_relaxed);
  while (AnyListedLocked(keys)) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      timeouts_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    changed_.WaitFor(&mu_, deadline - now);
  }
  return true;
}

}  // namespace kvd::server
