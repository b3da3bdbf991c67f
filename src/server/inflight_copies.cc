#include "server/inflight_copies.h"

#include "server/instance_registry.h"

#include <set>

namespace kvd::server {

InFlightCopies::Id InFlightCopies::Add(const std::shared_ptr<const Instance>& instance,
                                       bool store, int64_t deadline_ns) {
  MutexLock lock(&mu_);
  const Id id = next_++;
  copies_.emplace(id, Copy{instance, instance.get(), instance->id, store, deadline_ns, false});
  return id;
}

bool InFlightCopies::HasCopiesOf(const Instance* instance) const {
  MutexLock lock(&mu_);
  for (const auto& [id, c] : copies_) {
    if (c.key == instance) return true;
  }
  return false;
}

void InFlightCopies::Remove(Id id) {
  std::weak_ptr<const Instance> released;  // dropped outside the lock
  MutexLock lock(&mu_);
  auto it = copies_.find(id);
  if (it == copies_.end()) return;
  released = std::move(it->second.instance);
  copies_.erase(it);
}

std::vector<InFlightCopies::Overdue> InFlightCopies::TakeOverdue(int64_t now) {
  std::vector<Overdue> out;
  std::set<int64_t> seen;
  MutexLock lock(&mu_);
  for (auto& [id, c] : copies_) {  // ids ascend with submission: the oldest comes first
    if (c.reported || now <= c.deadline_ns) continue;
    c.reported = true;
    if (!seen.insert(c.instance_id).second) continue;
    out.push_back({c.instance_id, c.instance.lock(), c.store, now - c.deadline_ns});
  }
  return out;
}

size_t InFlightCopies::size() const {
  MutexLock lock(&mu_);
  return copies_.size();
}

}  // namespace kvd::server
