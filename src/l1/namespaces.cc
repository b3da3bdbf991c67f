#include "l1/namespaces.h"

#include <bit>
#include <cstring>
#include <functional>

namespace kvd::l1 {
namespace {

uint64_t HashOf(std::string_view s) { return Mix64(std::hash<std::string_view>{}(s)); }

// Unambiguous composite key: length-prefixed model, world size, salt.
void CompositeKeyInto(std::string* k, std::string_view model, int32_t world_size,
                      std::string_view salt) {
  const uint32_t n = static_cast<uint32_t>(model.size());
  k->clear();
  k->append(reinterpret_cast<const char*>(&n), sizeof(n));
  k->append(model);
  k->append(reinterpret_cast<const char*>(&world_size), sizeof(world_size));
  k->append(salt);
}

std::string CompositeKey(std::string_view model, int32_t world_size, std::string_view salt) {
  std::string k;
  CompositeKeyInto(&k, model, world_size, salt);
  return k;
}

}  // namespace

InternTable::InternTable(uint32_t max_ids)
    : max_ids_(max_ids),
      mask_(static_cast<uint32_t>(std::bit_ceil(uint64_t{max_ids} * 2)) - 1),
      slots_(new std::atomic<uint32_t>[mask_ + 1]),
      pages_(new std::atomic<std::string*>[(max_ids + kPage - 1) / kPage]) {
  for (uint32_t i = 0; i <= mask_; ++i) slots_[i].store(0, std::memory_order_relaxed);
  for (uint32_t i = 0; i < (max_ids + kPage - 1) / kPage; ++i) pages_[i].store(nullptr);
}

InternTable::~InternTable() {
  for (uint32_t i = 0; i < (max_ids_ + kPage - 1) / kPage; ++i) delete[] pages_[i].load();
}

const std::string& InternTable::Key(uint32_t id) const {
  return pages_[id / kPage].load(std::memory_order_acquire)[id % kPage];
}

std::optional<uint32_t> InternTable::Probe(std::string_view key, uint64_t hash,
                                           uint32_t* empty) const {
  for (uint32_t i = static_cast<uint32_t>(hash) & mask_;; i = (i + 1) & mask_) {
    const uint32_t v = slots_[i].load(std::memory_order_acquire);
    if (v == 0) {
      if (empty != nullptr) *empty = i;
      return std::nullopt;
    }
    if (Key(v - 1) == key) return v - 1;
  }
}

std::optional<uint32_t> InternTable::Find(std::string_view key) const {
  return Probe(key, HashOf(key), nullptr);
}

Result<uint32_t> InternTable::Intern(std::string_view key) {
  const uint64_t hash = HashOf(key);
  MutexLock lock(&mu_);
  uint32_t empty = 0;
  if (auto id = Probe(key, hash, &empty)) return *id;
  const uint32_t id = size_.load(std::memory_order_relaxed);
  if (id >= max_ids_) {
    return Status::ResourceExhausted("more than " + std::to_string(max_ids_) + " distinct values");
  }
  std::string* page = pages_[id / kPage].load(std::memory_order_relaxed);
  if (page == nullptr) {
    page = new std::string[kPage];
    pages_[id / kPage].store(page, std::memory_order_release);
  }
  page[id % kPage] = std::string(key);
  // Publish: the key is written before the slot that leads to it.
  slots_[empty].store(id + 1, std::memory_order_release);
  size_.store(id + 1, std::memory_order_release);
  return id;
}

Namespaces::Namespaces()
    : table_(kMaxNamespaces), salts_(kMaxSalts), infos_(new std::atomic<NamespaceInfo*>[kMaxNamespaces]) {
  for (uint32_t i = 0; i < kMaxNamespaces; ++i) infos_[i].store(nullptr, std::memory_order_relaxed);
}

Namespaces::~Namespaces() {
  for (uint32_t i = 0; i < kMaxNamespaces; ++i) delete infos_[i].load();
}

std::optional<NamespaceId> Namespaces::Find(std::string_view model, int32_t world_size,
                                            std::string_view salt) const {
  // Built in this thread's scratch: a lookup of a known namespace allocates nothing once
  // the scratch has grown (END_SESSION and lookups run on the request loop's thread).
  thread_local std::string key;
  CompositeKeyInto(&key, model, world_size, salt);
  return table_.Find(key);
}

Result<NamespaceId> Namespaces::Intern(std::string_view model, int32_t world_size,
                                       std::string_view salt) {
  const std::string key = CompositeKey(model, world_size, salt);
  if (auto id = table_.Find(key)) return *id;
  MutexLock lock(&mu_);
  if (auto id = table_.Find(key)) return *id;
  auto group = InternSalt(salt);
  if (!group.ok()) {
    return Status::ResourceExhausted("L1 holds " + std::to_string(kMaxSalts) +
                                     " distinct cache salts, the most it can tell apart");
  }
  const uint32_t id = table_.size();  // the id table_.Intern hands out next (mu_ is held)
  if (id >= kMaxNamespaces) {
    return Status::ResourceExhausted("L1 holds " + std::to_string(kMaxNamespaces) +
                                     " distinct (model, world size, cache salt) namespaces, "
                                     "the most it can tell apart");
  }
  auto* info = new NamespaceInfo{std::string(model), world_size, std::string(salt), *group};
  infos_[id].store(info, std::memory_order_release);  // before the id can be found
  auto interned = table_.Intern(key);
  if (!interned.ok() || *interned != id) {  // cannot happen while mu_ serialises Intern
    infos_[id].store(nullptr);
    delete info;
    return Status::Internal("namespace table out of step");
  }
  return id;
}

const NamespaceInfo& Namespaces::Get(NamespaceId ns) const {
  return *infos_[ns].load(std::memory_order_acquire);
}

Result<uint16_t> Namespaces::InternSalt(std::string_view salt) {
  auto id = salts_.Intern(salt);
  if (!id.ok()) return id.status();
  return static_cast<uint16_t>(*id);
}

std::optional<uint16_t> Namespaces::FindSalt(std::string_view salt) const {
  auto id = salts_.Find(salt);
  if (!id) return std::nullopt;
  return static_cast<uint16_t>(*id);
}

}  // namespace kvd::l1
