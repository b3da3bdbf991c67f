// LruPolicy: std::list ordered from least to most recently used, plus an id -> node map.
// All operations are O(1) except ForEachCandidate, which walks from the cold end.
#include <list>
#include <unordered_map>

#include "l1/eviction_policy.h"

namespace kvd::l1 {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  void OnInsert(EntryId id) override {
    auto [it, inserted] = nodes_.try_emplace(id);
    if (!inserted) {  // precondition violated; treat as an access rather than corrupt the list
      order_.splice(order_.end(), order_, it->second);
      return;
    }
    it->second = order_.insert(order_.end(), id);
  }

  void OnAccess(EntryId id) override {
    auto it = nodes_.find(id);
    if (it != nodes_.end()) order_.splice(order_.end(), order_, it->second);
  }

  void OnRemove(EntryId id) override {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) return;
    order_.erase(it->second);
    nodes_.erase(it);
  }

  void ForEachCandidate(const Visitor& visit) override {
    for (auto it = order_.begin(); it != order_.end();) {
      const EntryId id = *it;
      const Verdict verdict = visit(id);
      if (verdict == Verdict::kSkip) {
        ++it;
        continue;
      }
      if (verdict == Verdict::kStop) return;
      nodes_.erase(id);
      it = order_.erase(it);
      if (verdict == Verdict::kEvictedAndStop) return;
    }
  }

  size_t size() const override { return nodes_.size(); }
  const char* name() const override { return "lru"; }

 private:
  std::list<EntryId> order_;  // front: least recently used
  std::unordered_map<EntryId, std::list<EntryId>::iterator> nodes_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace kvd::l1
