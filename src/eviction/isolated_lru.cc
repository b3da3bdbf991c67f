// IsolatedLRU: one LRU list per isolation group (Hook::group: the L1 gives each cache salt
// its own group) and the byte quotas of QuotaBook. Entries of groups that must shed (over
// their quota, or shedding down to it after an eviction round found them at the watermark)
// are offered first, with priority kForced, oldest first; then every group's entries in
// plain LRU order. A group with no quota has an effective limit of 0 (lmcache's allowlist
// semantics): its entries are always offered as forced.
#include <unordered_map>

#include "eviction/hook_list.h"

namespace kvd::eviction {
namespace {

constexpr uint8_t kListed = 1;
constexpr uint8_t kHeld = 2;

class IsolatedLruPolicy final : public EvictionPolicy {
 public:
  explicit IsolatedLruPolicy(const PolicyContext& c)
      : hooks_(c.hooks), clock_(c.clock), quotas_(c.quotas) {}
  const char* name() const override { return "IsolatedLRU"; }

  void Insert(EntryId id, const UseInfo&) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    ListOf(h.group).PushBack(id);
    ++tracked_;
  }
  void Access(EntryId id, const UseInfo&) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    if (h.queue == kListed) ListOf(h.group).MoveToBack(id);
  }
  void Hold(EntryId id) override {
    Hook& h = hooks_->hook(id);
    ListOf(h.group).Remove(id);
    h.queue = kHeld;
  }
  void Release(EntryId id) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    ListOf(h.group).PushBack(id);
  }
  void Evicted(EntryId id) override { Forget(id); }
  void Erase(EntryId id) override { Forget(id); }

  std::optional<Candidate> Victim() override {
    std::optional<Candidate> best;
    for (auto& [group, list] : lists_) {
      if (list.empty()) continue;
      const EntryId id = list.front();
      Candidate c{id, quotas_ != nullptr && quotas_->MustShed(group) ? kForced : kNormal,
                  AgeOf(*clock_, hooks_->hook(id).stamp)};
      if (!best || GoesBefore(c, *best)) best = c;
    }
    return best;
  }
  size_t size() const override { return tracked_; }

 private:
  HookList& ListOf(uint16_t group) {
    auto it = lists_.find(group);
    if (it == lists_.end()) it = lists_.emplace(group, HookList(hooks_, kListed)).first;
    return it->second;
  }
  void Forget(EntryId id) {
    Hook& h = hooks_->hook(id);
    if (h.queue == kListed) {
      HookList& list = ListOf(h.group);
      list.Remove(id);
      if (list.empty()) lists_.erase(h.group);
    }
    h.queue = 0;
    --tracked_;
  }

  HookArena* const hooks_;
  std::atomic<uint32_t>* const clock_;
  QuotaBook* const quotas_;
  std::unordered_map<uint16_t, HookList> lists_;  // groups with listed (evictable) entries
  size_t tracked_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeIsolatedLruPolicy(const PolicyContext& c) {
  return std::make_unique<IsolatedLruPolicy>(c);
}

}  // namespace kvd::eviction
