// HookList: a doubly linked list threaded through the Hooks of an owner's entries (no
// allocation). Front = oldest (next victim), back = newest. Each list has a non-zero queue
// id written into Hook::queue of its members, so a policy with several lists can tell where
// an entry is. Not thread-safe (policies are serialised by their owner).
#pragma once

#include <cstddef>

#include "eviction/eviction_policy.h"

namespace kvd::eviction {

class HookList {
 public:
  HookList(HookArena* hooks, uint8_t queue) : hooks_(hooks), queue_(queue) {}

  bool empty() const { return head_ == kNoEntry; }
  size_t size() const { return size_; }
  EntryId front() const { return head_; }
  uint8_t queue() const { return queue_; }
  bool Contains(EntryId id) const { return hooks_->hook(id).queue == queue_; }

  void PushBack(EntryId id) {
    Hook& h = hooks_->hook(id);
    h.queue = queue_;
    h.prev = tail_;
    h.next = kNoEntry;
    if (tail_ != kNoEntry) hooks_->hook(tail_).next = id; else head_ = id;
    tail_ = id;
    ++size_;
  }

  void Remove(EntryId id) {
    Hook& h = hooks_->hook(id);
    if (h.prev != kNoEntry) hooks_->hook(h.prev).next = h.next; else head_ = h.next;
    if (h.next != kNoEntry) hooks_->hook(h.next).prev = h.prev; else tail_ = h.prev;
    h.prev = h.next = kNoEntry;
    h.queue = 0;
    --size_;
  }

  void MoveToBack(EntryId id) {
    Remove(id);
    PushBack(id);
  }

 private:
  HookArena* const hooks_;
  const uint8_t queue_;
  EntryId head_ = kNoEntry;
  EntryId tail_ = kNoEntry;
  size_t size_ = 0;
};

// Ticks of the shared clock since `stamp` (wraps modulo 2^32; see eviction_policy.h).
inline uint32_t AgeOf(const std::atomic<uint32_t>& clock, uint32_t stamp) {
  return clock.load(std::memory_order_relaxed) - stamp;
}
inline uint32_t Tick(std::atomic<uint32_t>& clock) {
  return clock.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace kvd::eviction
