// GhostFifo: keys of recently evicted entries, oldest first, with O(1) membership, erase and
// pop of the oldest. Used by ARC (B1, B2) and S3-FIFO (G). Erased keys leave a stale slot in
// the FIFO that PopOldest skips; the FIFO is compacted when stale slots dominate.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>

namespace kvd::eviction {

class GhostFifo {
 public:
  bool Contains(uint64_t key) const { return live_.count(key) != 0; }
  size_t size() const { return live_.size(); }

  void Push(uint64_t key) {
    const uint64_t seq = next_++;
    live_[key] = seq;
    fifo_.emplace_back(key, seq);
    if (fifo_.size() > 2 * live_.size() + 64) Compact();
  }
  bool Erase(uint64_t key) { return live_.erase(key) != 0; }
  void PopOldest() {
    while (!fifo_.empty()) {
      auto [key, seq] = fifo_.front();
      fifo_.pop_front();
      auto it = live_.find(key);
      if (it != live_.end() && it->second == seq) {
        live_.erase(it);
        return;
      }
    }
  }
  // Bytes this structure holds (approximate).
  size_t overhead_bytes() const { return fifo_.size() * 16 + live_.size() * 40; }

 private:
  void Compact() {
    std::deque<std::pair<uint64_t, uint64_t>> kept;
    for (const auto& e : fifo_) {
      auto it = live_.find(e.first);
      if (it != live_.end() && it->second == e.second) kept.push_back(e);
    }
    fifo_.swap(kept);
  }

  std::deque<std::pair<uint64_t, uint64_t>> fifo_;  // (key, seq), oldest first
  std::unordered_map<uint64_t, uint64_t> live_;     // key -> seq of its live FIFO slot
  uint64_t next_ = 0;
};

}  // namespace kvd::eviction
