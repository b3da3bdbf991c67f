// QuotaBook: per-group (per cache salt) byte quotas and usage, the input of the IsolatedLRU
// policy and of the /quota HTTP API.
//
// Groups are small integer ids (the L1 gives every distinct cache salt one). Usage is the
// bytes of cache memory the group's entries hold, kept up to date by the owner of the
// memory; limits are set by an operator. Semantics follow lmcache's quota registry:
// a group without a limit has an effective limit of 0 (allowlist), and quotas are soft
// (writes are never refused; IsolatedLRU evicts what is over).
//
// Shedding: a group starts shedding when an UpdateShedding round finds its usage at
// `watermark x limit` or more, and stops as soon as it is back at `(watermark - ratio) x
// limit` — the whole cache's watermark rule, per group. MustShed says whether a group's
// entries must go now: it is shedding and still above the stop level, or it is over its
// limit.
//
// Thread-safe: every method may be called from any thread (atomics only; the storage for
// groups is allocated on first use and never freed before the book).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace kvd::eviction {

class QuotaBook {
 public:
  static constexpr uint32_t kMaxGroups = 1u << 16;

  // The shedding rule's parameters (the cache's eviction watermark and ratio).
  explicit QuotaBook(double watermark = 0.8, double ratio = 0.2)
      : watermark_(watermark), ratio_(ratio) {}
  ~QuotaBook();
  QuotaBook(const QuotaBook&) = delete;
  QuotaBook& operator=(const QuotaBook&) = delete;

  void SetLimit(uint16_t group, uint64_t bytes);
  // Returns true when a limit was set.
  bool ClearLimit(uint16_t group);
  // nullopt: no limit set (effective limit 0).
  std::optional<uint64_t> Limit(uint16_t group) const;
  uint64_t EffectiveLimit(uint16_t group) const { return Limit(group).value_or(0); }

  void AddUsage(uint16_t group, int64_t delta_bytes);
  uint64_t Usage(uint16_t group) const;

  // Starts shedding the groups at or above their watermark; ends it for those back under.
  void UpdateShedding();
  bool MustShed(uint16_t group) const;

  // Groups that have a limit, with it.
  std::vector<std::pair<uint16_t, uint64_t>> Limits() const;

 private:
  struct Group {
    std::atomic<int64_t> limit{-1};  // -1: none
    std::atomic<int64_t> usage{0};
    std::atomic<bool> shedding{false};
  };
  static constexpr uint32_t kPageGroups = 256;
  Group* Find(uint16_t group) const;
  Group& Get(uint16_t group);

  const double watermark_;
  const double ratio_;

  std::array<std::atomic<Group*>, kMaxGroups / kPageGroups> pages_{};
};

}  // namespace kvd::eviction
