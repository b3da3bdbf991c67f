// LRU: one HookList ordered by last use (front = least recent). Held entries leave the
// list and come back at the back (they were just used). Every operation is O(1).
#include "eviction/hook_list.h"

namespace kvd::eviction {
namespace {

constexpr uint8_t kListed = 1;
constexpr uint8_t kHeld = 2;  // Hook::queue of a held entry (on no list)

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(const PolicyContext& c) : hooks_(c.hooks), clock_(c.clock), list_(c.hooks, kListed) {}
  const char* name() const override { return "LRU"; }

  void Insert(EntryId id, const UseInfo&) override {
    hooks_->hook(id).stamp = Tick(*clock_);
    list_.PushBack(id);
    ++tracked_;
  }
  void Access(EntryId id, const UseInfo&) override {
    Hook& h = hooks_->hook(id);
    h.stamp = Tick(*clock_);
    if (h.queue == kListed) list_.MoveToBack(id);
  }
  void Hold(EntryId id) override {
    list_.Remove(id);
    hooks_->hook(id).queue = kHeld;
  }
  void Release(EntryId id) override {
    hooks_->hook(id).stamp = Tick(*clock_);
    list_.PushBack(id);
  }
  void Evicted(EntryId id) override { Forget(id); }
  void Erase(EntryId id) override { Forget(id); }
  std::optional<Candidate> Victim() override {
    if (list_.empty()) return std::nullopt;
    const EntryId id = list_.front();
    return Candidate{id, kNormal, AgeOf(*clock_, hooks_->hook(id).stamp)};
  }
  size_t size() const override { return tracked_; }

 private:
  void Forget(EntryId id) {
    Hook& h = hooks_->hook(id);
    if (h.queue == kListed) list_.Remove(id);
    h.queue = 0;
    --tracked_;
  }

  HookArena* const hooks_;
  std::atomic<uint32_t>* const clock_;
  HookList list_;
  size_t tracked_ = 0;
};

class NoopPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "noop"; }
  void Insert(EntryId, const UseInfo&) override { ++tracked_; }
  void Access(EntryId, const UseInfo&) override {}
  void Hold(EntryId) override {}
  void Release(EntryId) override {}
  void Evicted(EntryId) override { --tracked_; }
  void Erase(EntryId) override { --tracked_; }
  std::optional<Candidate> Victim() override { return std::nullopt; }
  size_t size() const override { return tracked_; }

 private:
  size_t tracked_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy(const PolicyContext& c) {
  return std::make_unique<LruPolicy>(c);
}
std::unique_ptr<EvictionPolicy> MakeNoopPolicy(const PolicyContext&) {
  return std::make_unique<NoopPolicy>();
}

}  // namespace kvd::eviction
