// S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23), counted
// in entries. New entries enter the small FIFO S; an entry whose key is in the ghost FIFO G
// enters the main FIFO M. Hits only raise a 2-bit frequency (no list movement). To evict:
// while S holds at least 10% of the entries, S's oldest either moves to M (it was hit while
// in S) or is the victim (its key goes to G); otherwise M's oldest is reinserted at M's back
// with its frequency decremented until one with frequency 0 is the victim. G keeps at most
// as many keys as M has entries. Held entries leave their FIFO and re-enter at its back when
// released.
#include <algorithm>

#include "eviction/ghost_fifo.h"
#include "eviction/hook_list.h"

namespace kvd::eviction {
namespace {

constexpr uint8_t kSmall = 1, kMain = 2, kHeldSmall = 3, kHeldMain = 4;
constexpr uint8_t kMaxFreq = 3;
constexpr uint8_t kPromote = 1;  // hits while in S that earn a place in M

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(const PolicyContext& c)
      : hooks_(c.hooks), clock_(c.clock), small_(c.hooks, kSmall), main_(c.hooks, kMain) {}
  const char* name() const override { return "S3-FIFO"; }

  void Insert(EntryId id, const UseInfo&) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    h.bits = 0;
    if (ghost_.Erase(hooks_->key(id))) {
      main_.PushBack(id);
      ++nm_;
    } else {
      small_.PushBack(id);
      ++ns_;
    }
  }

  void Access(EntryId id, const UseInfo&) override {
    Hook& h = hooks_->hook(id);
    h.bits = static_cast<uint8_t>(std::min<int>(h.bits + 1, kMaxFreq));
  }

  void Hold(EntryId id) override {
    Hook& h = hooks_->hook(id);
    if (h.queue == kSmall) {
      small_.Remove(id);
      h.queue = kHeldSmall;
    } else if (h.queue == kMain) {
      main_.Remove(id);
      h.queue = kHeldMain;
    }
  }

  void Release(EntryId id) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    if (h.queue == kHeldSmall) small_.PushBack(id);
    else if (h.queue == kHeldMain) main_.PushBack(id);
  }

  void Evicted(EntryId id) override {
    const uint8_t q = hooks_->hook(id).queue;
    const uint64_t key = hooks_->key(id);
    Forget(id);
    if (q == kSmall || q == kHeldSmall) {
      ghost_.Push(key);
      while (ghost_.size() > std::max<size_t>(nm_, 1)) ghost_.PopOldest();
    }
  }

  void Erase(EntryId id) override { Forget(id); }

  std::optional<Candidate> Victim() override {
    // Each pass either returns or moves one entry and lowers a frequency or moves it from S
    // to M, so the loop ends after at most |S| + 4|M| steps.
    for (;;) {
      const size_t total = ns_ + nm_;
      const bool from_small = !small_.empty() && (ns_ * 10 >= total || main_.empty());
      if (from_small) {
        const EntryId id = small_.front();
        Hook& h = hooks_->hook(id);
        if (h.bits < kPromote) return Candidate{id, kNormal, AgeOf(*clock_, h.stamp)};
        small_.Remove(id);
        h.bits = 0;
        h.stamp = Tick(*clock_);
        main_.PushBack(id);
        --ns_, ++nm_;
        continue;
      }
      if (main_.empty()) return std::nullopt;
      const EntryId id = main_.front();
      Hook& h = hooks_->hook(id);
      if (h.bits == 0) return Candidate{id, kNormal, AgeOf(*clock_, h.stamp)};
      --h.bits;
      h.stamp = Tick(*clock_);
      main_.MoveToBack(id);
    }
  }

  size_t size() const override { return ns_ + nm_; }
  size_t overhead_bytes() const override { return ghost_.overhead_bytes(); }

 private:
  void Forget(EntryId id) {
    Hook& h = hooks_->hook(id);
    switch (h.queue) {
      case kSmall: small_.Remove(id); --ns_; break;
      case kMain: main_.Remove(id); --nm_; break;
      case kHeldSmall: --ns_; break;
      case kHeldMain: --nm_; break;
      default: break;
    }
    h.queue = 0;
  }

  HookArena* const hooks_;
  std::atomic<uint32_t>* const clock_;
  HookList small_, main_;   // evictable members, oldest first
  size_t ns_ = 0, nm_ = 0;  // members of S / M, held ones included
  GhostFifo ghost_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy(const PolicyContext& c) {
  return std::make_unique<S3FifoPolicy>(c);
}

}  // namespace kvd::eviction
