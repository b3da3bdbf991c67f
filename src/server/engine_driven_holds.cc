#include "server/engine_driven_holds.h"

#include <algorithm>
#include <tuple>

namespace kvd::server {
namespace {

uint64_t Room(uint64_t cap, uint64_t used) { return used >= cap ? 0 : cap - used; }

// The longest prefix of `sizes` whose bytes fit in `room`, and those bytes.
std::pair<size_t, uint64_t> PrefixWithin(std::span<const uint64_t> sizes, uint64_t room) {
  uint64_t bytes = 0;
  size_t n = 0;
  while (n < sizes.size() && sizes[n] <= room - bytes) bytes += sizes[n++];
  return {n, bytes};
}

}  // namespace

HoldLedger::Admission HoldLedger::Admit(int64_t instance, std::span<const uint64_t> sizes,
                                        size_t min_items, int64_t now_ns, int kind,
                                        std::string name) {
  Admission a;
  const InstanceUse empty;
  auto found = instances_.find(instance);
  const InstanceUse& use = found == instances_.end() ? empty : found->second;
  auto refuse = [&](size_t could) {
    a.refusal = "instance " + std::to_string(instance) + " holds " + std::to_string(use.bytes) +
                " of its " + std::to_string(limits_.instance_bytes) + " bytes (" +
                std::to_string(use.ids.size()) + " of " + std::to_string(limits_.instance_ops) +
                " operations) and all instances " + std::to_string(total_bytes_) + " of " +
                std::to_string(limits_.total_bytes) +
                " bytes of L1 in prepared, uncommitted operations; " + std::to_string(could) +
                " of the " + std::to_string(sizes.size()) +
                " objects asked for fit, and no hold is old enough to shed";
    return a;
  };
  // The most this operation could get with every other hold gone.
  size_t n = 0;
  uint64_t need = 0;
  std::tie(n, need) = PrefixWithin(sizes, std::min(limits_.instance_bytes, limits_.total_bytes));
  if (n < min_items || limits_.instance_ops == 0) return refuse(n);

  // Plan the shedding: the instance's own old holds, oldest first, then anyone's.
  auto old_enough = [&](const Hold& h) { return now_ns - h.since_ns >= limits_.shed_age_ns; };
  std::vector<uint64_t> plan;
  uint64_t own_bytes = use.bytes, total = total_bytes_;
  size_t own_ops = use.ids.size();
  auto own_fits = [&] {
    return need <= Room(limits_.instance_bytes, own_bytes) && own_ops < limits_.instance_ops;
  };
  for (uint64_t id : use.ids) {
    if (own_fits()) break;
    const Hold& h = holds_.at(id);
    if (!old_enough(h)) continue;
    plan.push_back(id);
    own_bytes -= h.bytes;
    total -= h.bytes;
    --own_ops;
  }
  if (own_fits()) {
    for (const auto& [id, h] : holds_) {
      if (need <= Room(limits_.total_bytes, total)) break;
      if (!old_enough(h) || std::find(plan.begin(), plan.end(), id) != plan.end()) continue;
      plan.push_back(id);
      total -= h.bytes;
    }
  }
  if (!own_fits() || need > Room(limits_.total_bytes, total)) {
    // Shedding what may be shed is not enough: nothing is shed; what fits now.
    plan.clear();
    std::tie(n, need) = PrefixWithin(
        sizes, std::min(Room(limits_.instance_bytes, use.bytes),
                        Room(limits_.total_bytes, total_bytes_)));
    if (n < min_items || use.ids.size() >= limits_.instance_ops) return refuse(n);
  }
  for (uint64_t id : plan) {
    a.shed.push_back(holds_.at(id));
    Take(id);
  }
  a.admitted = true;
  a.items = n;
  a.id = next_id_++;
  holds_[a.id] = Hold{a.id, instance, need, now_ns, kind, std::move(name)};
  InstanceUse& mine = instances_[instance];
  mine.bytes += need;
  mine.ids.insert(a.id);
  total_bytes_ += need;
  return a;
}

void HoldLedger::Take(uint64_t id) {
  auto it = holds_.find(id);
  auto inst = instances_.find(it->second.instance);
  inst->second.bytes -= it->second.bytes;
  inst->second.ids.erase(id);
  if (inst->second.ids.empty()) instances_.erase(inst);
  total_bytes_ -= it->second.bytes;
  holds_.erase(it);
}

bool HoldLedger::Remove(uint64_t id) {
  if (!holds_.contains(id)) return false;
  Take(id);
  return true;
}

std::vector<HoldLedger::Hold> HoldLedger::RemoveInstance(int64_t instance) {
  std::vector<Hold> out;
  auto inst = instances_.find(instance);
  if (inst == instances_.end()) return out;
  const std::set<uint64_t> ids = inst->second.ids;
  for (uint64_t id : ids) {
    out.push_back(holds_.at(id));
    Take(id);
  }
  return out;
}

uint64_t HoldLedger::held_bytes(int64_t instance) const {
  auto it = instances_.find(instance);
  return it == instances_.end() ? 0 : it->second.bytes;
}

}  // namespace kvd::server
