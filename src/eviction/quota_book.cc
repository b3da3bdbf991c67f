#include "eviction/quota_book.h"

#include <algorithm>

namespace kvd::eviction {

QuotaBook::~QuotaBook() {
  for (auto& p : pages_) delete[] p.load();
}

QuotaBook::Group* QuotaBook::Find(uint16_t group) const {
  Group* page = pages_[group / kPageGroups].load(std::memory_order_acquire);
  return page == nullptr ? nullptr : &page[group % kPageGroups];
}

QuotaBook::Group& QuotaBook::Get(uint16_t group) {
  auto& slot = pages_[group / kPageGroups];
  Group* page = slot.load(std::memory_order_acquire);
  if (page == nullptr) {
    auto* fresh = new Group[kPageGroups];
    if (slot.compare_exchange_strong(page, fresh, std::memory_order_acq_rel)) {
      page = fresh;
    } else {
      delete[] fresh;  // another thread published its page first; `page` is that one
    }
  }
  return page[group % kPageGroups];
}

void QuotaBook::SetLimit(uint16_t group, uint64_t bytes) {
  Get(group).limit.store(static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX)));
}

bool QuotaBook::ClearLimit(uint16_t group) {
  Group* g = Find(group);
  return g != nullptr && g->limit.exchange(-1) >= 0;
}

std::optional<uint64_t> QuotaBook::Limit(uint16_t group) const {
  const Group* g = Find(group);
  if (g == nullptr) return std::nullopt;
  const int64_t l = g->limit.load();
  if (l < 0) return std::nullopt;
  return static_cast<uint64_t>(l);
}

void QuotaBook::AddUsage(uint16_t group, int64_t delta_bytes) {
  Get(group).usage.fetch_add(delta_bytes, std::memory_order_relaxed);
}

uint64_t QuotaBook::Usage(uint16_t group) const {
  const Group* g = Find(group);
  return g == nullptr ? 0 : static_cast<uint64_t>(std::max<int64_t>(0, g->usage.load()));
}

void QuotaBook::UpdateShedding() {
  for (uint32_t p = 0; p < pages_.size(); ++p) {
    Group* page = pages_[p].load(std::memory_order_acquire);
    if (page == nullptr) continue;
    for (uint32_t i = 0; i < kPageGroups; ++i) {
      Group& g = page[i];
      const double usage = static_cast<double>(std::max<int64_t>(0, g.usage.load()));
      const int64_t l = g.limit.load();
      const double limit = l < 0 ? 0.0 : static_cast<double>(l);
      bool shed = g.shedding.load();
      if (!shed && usage > 0 && usage >= watermark_ * limit) shed = true;
      if (shed && usage <= std::max(0.0, watermark_ - ratio_) * limit) shed = false;
      g.shedding.store(shed);
    }
  }
}

bool QuotaBook::MustShed(uint16_t group) const {
  const Group* g = Find(group);
  if (g == nullptr) return false;
  const int64_t usage = g->usage.load();
  if (usage <= 0) return false;
  const double limit = static_cast<double>(std::max<int64_t>(g->limit.load(), 0));
  if (static_cast<double>(usage) > limit) return true;
  return g->shedding.load() &&
         static_cast<double>(usage) > std::max(0.0, watermark_ - ratio_) * limit;
}

std::vector<std::pair<uint16_t, uint64_t>> QuotaBook::Limits() const {
  std::vector<std::pair<uint16_t, uint64_t>> out;
  for (uint32_t p = 0; p < pages_.size(); ++p) {
    const Group* page = pages_[p].load(std::memory_order_acquire);
    if (page == nullptr) continue;
    for (uint32_t i = 0; i < kPageGroups; ++i) {
      const int64_t l = page[i].limit.load();
      if (l >= 0) out.emplace_back(static_cast<uint16_t>(p * kPageGroups + i), static_cast<uint64_t>(l));
    }
  }
  return out;
}

}  // namespace kvd::eviction
