// ARC (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST'03),
// counted in entries. T1 holds entries seen once since they entered, T2 entries hit again;
// B1/B2 remember the keys last evicted from each. A new entry whose key is in B1 (evicted
// from T1 too early) raises the target size p of T1, one found in B2 lowers it; REPLACE takes
// T1's oldest while T1 is above p, T2's oldest otherwise. The cache size c is the number of
// entries tracked right now (the owner evicts when memory, not a count, runs out), and the
// ghost lists are trimmed to |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
// Held entries leave their list but still count in |T1| / |T2|.
#include <algorithm>

#include "eviction/ghost_fifo.h"
#include "eviction/hook_list.h"

namespace kvd::eviction {
namespace {

constexpr uint8_t kT1 = 1, kT2 = 2, kHeldT1 = 3, kHeldT2 = 4;

class ArcPolicy final : public EvictionPolicy {
 public:
  explicit ArcPolicy(const PolicyContext& c)
      : hooks_(c.hooks), clock_(c.clock), t1_(c.hooks, kT1), t2_(c.hooks, kT2) {}
  const char* name() const override { return "ARC"; }

  void Insert(EntryId id, const UseInfo&) override {
    const uint64_t key = hooks_->key(id);
    hooks_->hook(id).stamp = Tick(*clock_);
    if (b1_.Contains(key)) {
      const double delta = std::max(1.0, static_cast<double>(b2_.size()) / b1_.size());
      p_ = std::min(p_ + delta, static_cast<double>(n1_ + n2_ + 1));
      b1_.Erase(key);
      t2_.PushBack(id);
      ++n2_;
    } else if (b2_.Contains(key)) {
      const double delta = std::max(1.0, static_cast<double>(b1_.size()) / b2_.size());
      p_ = std::max(p_ - delta, 0.0);
      b2_.Erase(key);
      t2_.PushBack(id);
      ++n2_;
    } else {
      t1_.PushBack(id);
      ++n1_;
    }
    TrimGhosts();
  }

  void Access(EntryId id, const UseInfo&) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    switch (h.queue) {
      case kT1:
        t1_.Remove(id);
        t2_.PushBack(id);
        --n1_, ++n2_;
        break;
      case kT2:
        t2_.MoveToBack(id);
        break;
      case kHeldT1:
        h.queue = kHeldT2;
        --n1_, ++n2_;
        break;
      default:
        break;
    }
  }

  void Hold(EntryId id) override {
    Hook& h = hooks_->hook(id);
    if (h.queue == kT1) {
      t1_.Remove(id);
      h.queue = kHeldT1;
    } else if (h.queue == kT2) {
      t2_.Remove(id);
      h.queue = kHeldT2;
    }
  }

  void Release(EntryId id) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    if (h.queue == kHeldT1) t1_.PushBack(id);
    else if (h.queue == kHeldT2) t2_.PushBack(id);
  }

  void Evicted(EntryId id) override {
    const uint8_t q = hooks_->hook(id).queue;
    const uint64_t key = hooks_->key(id);
    Forget(id);
    (q == kT1 || q == kHeldT1 ? b1_ : b2_).Push(key);
    TrimGhosts();
  }

  void Erase(EntryId id) override {
    Forget(id);
    TrimGhosts();
  }

  std::optional<Candidate> Victim() override {
    const HookList* from = nullptr;
    if (!t1_.empty() && (static_cast<double>(n1_) > p_ || t2_.empty())) from = &t1_;
    else if (!t2_.empty()) from = &t2_;
    else return std::nullopt;
    const EntryId id = from->front();
    return Candidate{id, kNormal, AgeOf(*clock_, hooks_->hook(id).stamp)};
  }

  size_t size() const override { return n1_ + n2_; }
  size_t overhead_bytes() const override { return b1_.overhead_bytes() + b2_.overhead_bytes(); }

 private:
  void Forget(EntryId id) {
    Hook& h = hooks_->hook(id);
    switch (h.queue) {
      case kT1: t1_.Remove(id); --n1_; break;
      case kT2: t2_.Remove(id); --n2_; break;
      case kHeldT1: --n1_; break;
      case kHeldT2: --n2_; break;
      default: break;
    }
    h.queue = 0;
    p_ = std::min(p_, static_cast<double>(n1_ + n2_));
  }

  void TrimGhosts() {
    const size_t c = n1_ + n2_;
    while (b1_.size() > 0 && n1_ + b1_.size() > c) b1_.PopOldest();
    while (b2_.size() > 0 && c + b1_.size() + b2_.size() > 2 * c) b2_.PopOldest();
  }

  HookArena* const hooks_;
  std::atomic<uint32_t>* const clock_;
  HookList t1_, t2_;            // evictable members, oldest first
  size_t n1_ = 0, n2_ = 0;      // members of T1 / T2, held ones included
  GhostFifo b1_, b2_;
  double p_ = 0;                // target size of T1
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeArcPolicy(const PolicyContext& c) {
  return std::make_unique<ArcPolicy>(c);
}

}  // namespace kvd::eviction
