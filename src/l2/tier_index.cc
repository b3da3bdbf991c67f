#include "l2/tier_index.h"

#include <algorithm>
#include <functional>
#include <cstdio>
#include <cstdlib>

namespace kvd::l2 {

TierIndex::TierIndex(std::string_view policy)
    : policy_name_(policy),
      policy_(eviction::MakePolicy(policy, {this, &clock_, nullptr, nullptr})) {
  if (!policy_) {  // a programming error: the tier's configuration was checked before
    std::fprintf(stderr, "kvd: tier index: unknown eviction policy '%s'\n", policy_name_.c_str());
    std::abort();
  }
}

TierIndex::~TierIndex() = default;

uint64_t TierIndex::key(eviction::EntryId e) { return std::hash<std::string>{}(entries_[e].id); }

eviction::EntryId TierIndex::Slot() {
  if (!free_.empty()) {
    const eviction::EntryId e = free_.back();
    free_.pop_back();
    return e;
  }
  entries_.emplace_back();
  return static_cast<eviction::EntryId>(entries_.size() - 1);
}

void TierIndex::Insert(const std::string& id, uint64_t bytes, uint64_t last_use) {
  const eviction::EntryId e = Slot();
  Entry& en = entries_[e];
  en = Entry{};
  en.id = id;
  en.bytes = bytes;
  en.last_use = last_use;
  ids_.emplace(id, e);
  usage_ += bytes;
  policy_->Insert(e);
}

void TierIndex::Account(const std::string& id, uint64_t bytes, const ChunkSlot* chunk) {
  if (contains(id)) {
    Touch(id);
  } else {
    Insert(id, bytes, ++sequence_);
  }
  if (chunk == nullptr) return;
  Entry& en = entries_[ids_.at(id)];
  if (en.chunk) return;
  en.chunk = *chunk;
  ++chunk_slots_[*chunk];
}

void TierIndex::Touch(const std::string& id) {
  auto it = ids_.find(id);
  if (it == ids_.end()) return;
  entries_[it->second].last_use = ++sequence_;
  policy_->Access(it->second);
}

uint64_t TierIndex::AddOlder(const std::vector<std::pair<std::string, uint64_t>>& objects) {
  // The policy can only add entries as the most recent, so the order is rebuilt: the older
  // objects first (oldest first), then the indexed ones by their last use.
  std::vector<eviction::EntryId> known;
  known.reserve(ids_.size());
  for (const auto& [id, e] : ids_) known.push_back(e);
  std::sort(known.begin(), known.end(), [this](eviction::EntryId a, eviction::EntryId b) {
    return entries_[a].last_use < entries_[b].last_use;
  });
  for (eviction::EntryId e : known) policy_->Erase(e);
  uint64_t added = 0;
  for (const auto& [id, bytes] : objects) {
    if (contains(id)) continue;
    Insert(id, bytes, 0);
    added += bytes;
  }
  for (eviction::EntryId e : known) {
    policy_->Insert(e);
    if (Held(entries_[e])) policy_->Hold(e);
  }
  return added;
}

void TierIndex::Busy(const std::string& id, int delta) {
  auto it = ids_.find(id);
  if (it == ids_.end()) return;
  Entry& en = entries_[it->second];
  const bool was_held = Held(en);
  en.busy = std::max(0, en.busy + delta);
  en.last_use = ++sequence_;
  if (!was_held && Held(en)) {
    policy_->Hold(it->second);
  } else if (was_held && !Held(en)) {
    policy_->Release(it->second);
  } else if (!Held(en)) {
    policy_->Access(it->second);
  }
}

std::vector<std::string> TierIndex::PlanVictims(uint64_t target) {
  std::vector<std::string> victims;
  uint64_t planned = 0;
  while (planned < target) {
    auto c = policy_->Victim();
    if (!c) break;
    Entry& en = entries_[c->id];
    en.planned = true;
    policy_->Hold(c->id);
    victims.push_back(en.id);
    planned += en.bytes;
  }
  return victims;
}

void TierIndex::Unplan(const std::string& id) {
  auto it = ids_.find(id);
  if (it == ids_.end()) return;
  Entry& en = entries_[it->second];
  if (!en.planned) return;
  en.planned = false;
  if (!Held(en)) policy_->Release(it->second);
}

uint64_t TierIndex::Remove(const std::string& id, std::optional<ChunkSlot>* chunk) {
  if (chunk) chunk->reset();
  auto it = ids_.find(id);
  if (it == ids_.end()) return 0;
  const eviction::EntryId e = it->second;
  Entry& en = entries_[e];
  const uint64_t bytes = en.bytes;
  if (en.chunk) {
    auto cs = chunk_slots_.find(*en.chunk);
    if (cs != chunk_slots_.end() && --cs->second == 0) chunk_slots_.erase(cs);
    if (chunk) *chunk = en.chunk;
  }
  if (en.planned && en.busy == 0) {
    policy_->Release(e);  // evictable again, then evicted: the policy may remember it
    policy_->Evicted(e);
  } else {
    policy_->Erase(e);
  }
  usage_ -= std::min(usage_, bytes);
  ids_.erase(it);
  en = Entry{};
  free_.push_back(e);
  return bytes;
}

}  // namespace kvd::l2
