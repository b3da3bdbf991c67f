// LHD: evicts the entry with the lowest learned hit index (hit_index.h): in the spirit of
// "least hit density" (Beckmann, Chen and Cidon, NSDI'18), with entries classed by how many
// times they were used, the index learned from every instance's observations together
// (HitStats, shared through PolicyContext::shared) and ghosts that see past the evictions.
//
// Per instance: one HookList per class (1, 2, 3, 4+ uses), each in last-use order, so the
// lowest index of a class is its oldest entry and Victim() compares four fronts. Held
// entries are off the lists and come back at the back of their class when released.
// Hook::bits is the class (uses - 1, at most 3). Counting a use: Insert (the first), and an
// Access that belongs to a request (UseInfo::chunks != 0: a lookup); an Access without one (a
// read pin after the lookup, a touch) only refreshes recency. An owner that passes no
// UseInfo at all thus gets one class: LRU.
//
// Ghosts: the keys of evicted entries with their class and last-use stamp, remembered until
// they are older than the horizon (HitStats) or eight times the instance's entries. An Insert
// whose key is remembered is a reuse at that age (and the entry keeps its uses + 1); a ghost
// forgotten unused is an end. Candidates rank across instances by their index (priority:
// higher index = higher priority value, evicted later), then by age.
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "eviction/hit_index.h"
#include "eviction/hook_list.h"

namespace kvd::eviction {
namespace {

using lhd::HitStats;
using lhd::Histogram;
using lhd::kClasses;

constexpr uint8_t kHeld = kClasses + 1;  // Hook::queue of a held entry; lists are 1..kClasses
constexpr size_t kGhostsPerEntry = 8;

uint8_t QueueOf(int cls) { return static_cast<uint8_t>(cls + 1); }

// Candidate priority for an index: monotone, above kNormal unless nothing is known (0).
uint32_t PriorityOf(float index) {
  if (!(index > 0)) return EvictionPolicy::kNormal;
  const double scaled = (std::log2(static_cast<double>(index)) + 160) * 65536;
  return EvictionPolicy::kNormal + 1 +
         static_cast<uint32_t>(std::clamp(scaled, 0.0, static_cast<double>(1u << 30)));
}

class LhdPolicy final : public EvictionPolicy {
 public:
  explicit LhdPolicy(const PolicyContext& c)
      : hooks_(c.hooks),
        clock_(c.clock),
        own_stats_(dynamic_cast<HitStats*>(c.shared) == nullptr ? std::make_unique<HitStats>()
                                                                 : nullptr),
        stats_(own_stats_ ? own_stats_.get() : dynamic_cast<HitStats*>(c.shared)),
        slot_(stats_->Join()),
        view_(stats_->view()) {
    lists_.reserve(kClasses);
    for (int i = 0; i < kClasses; ++i) lists_.emplace_back(c.hooks, QueueOf(i));
  }
  ~LhdPolicy() override { stats_->Leave(slot_); }
  LhdPolicy(const LhdPolicy&) = delete;
  LhdPolicy& operator=(const LhdPolicy&) = delete;

  const char* name() const override { return "LHD"; }

  void Insert(EntryId id, const UseInfo&) override {
    Hook& h = hooks_->hook(id);
    const uint32_t now = Tick(*clock_);
    h.bits = 0;
    if (auto it = ghosts_.find(hooks_->key(id)); it != ghosts_.end()) {
      hits_.Add(it->second.cls, now - it->second.stamp);
      h.bits = static_cast<uint8_t>(std::min(it->second.cls + 1, kClasses - 1));
      ghosts_.erase(it);
      Observed();
    }
    h.stamp = now;
    lists_[h.bits].PushBack(id);
    ++tracked_;
  }

  void Access(EntryId id, const UseInfo& use) override {
    Hook& h = hooks_->hook(id);
    const uint32_t now = Tick(*clock_);
    const bool listed = h.queue != kHeld;
    if (listed) lists_[h.bits].Remove(id);
    if (use.chunks != 0) {  // a request used it: a reuse
      hits_.Add(h.bits, now - h.stamp);
      h.bits = static_cast<uint8_t>(std::min(h.bits + 1, kClasses - 1));
      Observed();
    }
    h.stamp = now;
    if (listed) lists_[h.bits].PushBack(id);
  }

  void Hold(EntryId id) override {
    Hook& h = hooks_->hook(id);
    lists_[h.bits].Remove(id);
    h.queue = kHeld;
  }

  void Release(EntryId id) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    lists_[h.bits].PushBack(id);
  }

  void Evicted(EntryId id) override {
    const Hook& h = hooks_->hook(id);
    const uint32_t now = clock_->load(std::memory_order_relaxed);
    victim_age_sum_ += static_cast<double>(now - h.stamp);
    ++victims_;
    Remember(hooks_->key(id), h.stamp, h.bits);
    Forget(id);
    ForgetOldGhosts(now);
    Observed();
  }

  void Erase(EntryId id) override { Forget(id); }

  std::optional<Candidate> Victim() override {
    if (stats_->version() != view_.version) view_ = stats_->view();
    const uint32_t now = clock_->load(std::memory_order_relaxed);
    std::optional<Candidate> best;
    float best_index = 0;
    for (int c = 0; c < kClasses; ++c) {
      if (lists_[c].empty()) continue;
      const EntryId id = lists_[c].front();
      const uint32_t age = now - hooks_->hook(id).stamp;
      const float index = (*view_.index)[c][lhd::BucketOf(age)];
      if (!best || index < best_index || (index == best_index && age > best->age)) {
        best = Candidate{id, kNormal, age};
        best_index = index;
      }
    }
    if (best) best->priority = PriorityOf(best_index);
    return best;
  }

  size_t size() const override { return tracked_; }
  size_t overhead_bytes() const override {
    return ghosts_.size() * 48 + order_.size() * 16 + 3 * sizeof(Histogram);
  }

 private:
  struct Ghost {
    uint64_t seq;
    uint32_t stamp;  // last use
    int cls;
  };

  void Forget(EntryId id) {
    Hook& h = hooks_->hook(id);
    if (h.queue != kHeld && h.queue != 0) lists_[h.bits].Remove(id);
    h.queue = 0;
    --tracked_;
  }

  void Remember(uint64_t key, uint32_t stamp, int cls) {
    const uint64_t seq = next_seq_++;
    ghosts_[key] = Ghost{seq, stamp, cls};
    order_.emplace_back(key, seq);
    if (order_.size() > 2 * ghosts_.size() + 64) {  // drop the slots of reused ghosts
      std::deque<std::pair<uint64_t, uint64_t>> kept;
      for (const auto& e : order_) {
        auto it = ghosts_.find(e.first);
        if (it != ghosts_.end() && it->second.seq == e.second) kept.push_back(e);
      }
      order_.swap(kept);
    }
  }

  // Ghosts older than the horizon, or beyond the memory bound, end unused.
  void ForgetOldGhosts(uint32_t now) {
    const size_t cap = kGhostsPerEntry * std::max<size_t>(tracked_, 64);
    while (!order_.empty()) {
      const auto [key, seq] = order_.front();
      auto it = ghosts_.find(key);
      if (it == ghosts_.end() || it->second.seq != seq) {  // reused or remembered again since
        order_.pop_front();
        continue;
      }
      const uint32_t age = now - it->second.stamp;
      if (ghosts_.size() <= cap && (view_.horizon == 0 || age <= view_.horizon)) break;
      ends_.Add(it->second.cls, age);
      ghosts_.erase(it);
      order_.pop_front();
      Observed();
    }
  }

  // Counts an observation; every kSyncEvents of them, trades them for the current index.
  void Observed() {
    if (++events_ % HitStats::kSyncEvents != 0) return;
    const Histogram* open = nullptr;
    // A snapshot walks every entry and ghost: at most once per quarter of that many events.
    if (events_ - open_at_ >= std::max<uint64_t>(HitStats::kSyncEvents,
                                                  (tracked_ + ghosts_.size()) / 4)) {
      SnapshotOpen();
      open = &open_;
      open_at_ = events_;
    }
    view_ = stats_->Sync(slot_, hits_, ends_, open, victim_age_sum_, victims_);
    victim_age_sum_ = 0;
    victims_ = 0;
  }

  // The unresolved observations at their ages now: listed entries and live ghosts.
  void SnapshotOpen() {
    open_.Clear();
    const uint32_t now = clock_->load(std::memory_order_relaxed);
    for (int c = 0; c < kClasses; ++c) {
      for (EntryId id = lists_[c].front(); id != kNoEntry; id = hooks_->hook(id).next) {
        open_.Add(c, now - hooks_->hook(id).stamp);
      }
    }
    for (const auto& [key, g] : ghosts_) open_.Add(g.cls, now - g.stamp);
  }

  HookArena* const hooks_;
  std::atomic<uint32_t>* const clock_;
  const std::unique_ptr<HitStats> own_stats_;  // when the owner shares none
  HitStats* const stats_;
  const size_t slot_;
  HitStats::View view_;
  std::vector<HookList> lists_;  // by class, evictable members, least recent first
  size_t tracked_ = 0;
  std::unordered_map<uint64_t, Ghost> ghosts_;          // by key
  std::deque<std::pair<uint64_t, uint64_t>> order_;     // (key, seq), oldest first
  uint64_t next_seq_ = 0;
  Histogram hits_, ends_, open_;  // observations not yet synced; the open snapshot
  uint64_t events_ = 0;
  uint64_t open_at_ = 0;
  double victim_age_sum_ = 0;
  uint64_t victims_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLhdPolicy(const PolicyContext& c) {
  return std::make_unique<LhdPolicy>(c);
}
std::unique_ptr<SharedState> MakeLhdSharedState() { return std::make_unique<HitStats>(); }

}  // namespace kvd::eviction
