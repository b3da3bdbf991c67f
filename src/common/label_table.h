// LabelTable<Values, N>: the label sets of one family of metrics whose label values come from
// clients (model names, cache salts, instance ids), each with its own block of counters.
//
// BOUNDED. At most `capacity` label sets are kept. A label set beyond that, or one with a
// value longer than `max_value_bytes`, is refused: its counts go to the overflow block, which
// stands for one fixed label set the caller names (the overflow label set; a request naming
// exactly that label set is counted there too, so it never appears twice). How many distinct
// label sets were refused is counted, telling apart up to kRefusedTracked of them (beyond
// that, refusals still count under the overflow block but no longer add to refused()).
//
// THREADS. Get may be called from any thread, concurrently. A label set already present is
// found without a lock (an open-addressing index of atomic pointers, read with acquire
// loads); a refused one is recognised without a lock too (a set of 64-bit fingerprints).
// Only the first Get of a new label set takes the mutex, to insert it. ForEach takes the
// mutex (a metrics reader; never the request path's found case).
//
// OWNERSHIP. Entries are allocated on insertion and never removed or moved: a Values&
// returned by Get or overflow() stays valid for the table's lifetime. Values must be
// default-constructible and thread-safe by itself (atomics).
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvd {

template <typename Values, size_t N>
class LabelTable {
 public:
  using Labels = std::array<std::string_view, N>;
  static constexpr size_t kRefusedTracked = 4096;

  // `capacity` >= 1. `overflow_labels` name the overflow block (e.g. "__other__").
  LabelTable(size_t capacity, const std::array<std::string, N>& overflow_labels,
             size_t max_value_bytes = 512)
      : capacity_(capacity < 1 ? 1 : capacity),
        max_value_bytes_(max_value_bytes),
        mask_(std::bit_ceil(2 * capacity_) - 1),
        index_(std::make_unique<std::atomic<Entry*>[]>(mask_ + 1)),
        refused_fp_(std::make_unique<std::atomic<uint64_t>[]>(kRefusedTracked)) {
    overflow_.labels = overflow_labels;
    overflow_.hash = Hash(View(overflow_labels));
    for (size_t i = 0; i <= mask_; ++i) index_[i].store(nullptr, std::memory_order_relaxed);
    for (size_t i = 0; i < kRefusedTracked; ++i) refused_fp_[i].store(0, std::memory_order_relaxed);
  }
  LabelTable(const LabelTable&) = delete;
  LabelTable& operator=(const LabelTable&) = delete;

  // The counters of `labels`: inserted on first use while there is room; else the overflow
  // block. Never allocates once the label set is present (or refused).
  Values& Get(const Labels& labels) {
    const uint64_t h = Hash(labels);
    if (Entry* e = Find(labels, h)) return e->values;
    if (h == overflow_.hash && Equal(overflow_.labels, labels)) return overflow_.values;
    bool fits = true;
    for (std::string_view v : labels) fits = fits && v.size() <= max_value_bytes_;
    if (fits && size_.load(std::memory_order_acquire) < capacity_) {
      MutexLock lock(&mu_);
      if (Entry* e = Find(labels, h)) return e->values;  // inserted meanwhile
      if (owned_.size() < capacity_) return Insert(labels, h)->values;
    } else if (Entry* e = Find(labels, h)) {
      return e->values;  // it took the last place just now (published before size_)
    }
    Refuse(h);
    return overflow_.values;
  }

  Values& overflow() { return overflow_.values; }
  const Values& overflow() const { return overflow_.values; }
  const std::array<std::string, N>& overflow_labels() const { return overflow_.labels; }
  size_t capacity() const { return capacity_; }
  // Label sets kept (the overflow one not included).
  size_t size() const { return size_.load(std::memory_order_acquire); }
  // Distinct label sets refused so far (see BOUNDED).
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

  // f(const std::array<std::string, N>& labels, const Values&) for every label set kept, in
  // insertion order (the overflow block not included).
  template <typename F>
  void ForEach(F&& f) const {
    MutexLock lock(&mu_);
    for (const auto& e : owned_) f(e->labels, e->values);
  }

 private:
  struct Entry {
    uint64_t hash = 0;
    std::array<std::string, N> labels;
    Values values{};
  };

  static Labels View(const std::array<std::string, N>& a) {
    Labels v;
    for (size_t i = 0; i < N; ++i) v[i] = a[i];
    return v;
  }
  static bool Equal(const std::array<std::string, N>& a, const Labels& b) {
    for (size_t i = 0; i < N; ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }
  // Never 0 (0 marks an empty fingerprint slot).
  static uint64_t Hash(const Labels& labels) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (std::string_view v : labels) {
      // Each value's own hash, mixed with its position (("a","") differs from ("","a")).
      h ^= std::hash<std::string_view>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdull;
      h ^= h >> 33;
    }
    return h == 0 ? 1 : h;
  }

  Entry* Find(const Labels& labels, uint64_t h) const {
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Entry* e = index_[i].load(std::memory_order_acquire);
      if (e == nullptr) return nullptr;  // the index is never full: at most half its slots
      if (e->hash == h && Equal(e->labels, labels)) return e;
    }
  }

  Entry* Insert(const Labels& labels, uint64_t h) KVD_REQUIRES(mu_) {
    auto e = std::make_unique<Entry>();
    e->hash = h;
    for (size_t i = 0; i < N; ++i) e->labels[i].assign(labels[i]);
    Entry* raw = e.get();
    owned_.push_back(std::move(e));
    size_t i = h & mask_;
    while (index_[i].load(std::memory_order_relaxed) != nullptr) i = (i + 1) & mask_;
    index_[i].store(raw, std::memory_order_release);  // the entry is complete before it is seen
    size_.store(owned_.size(), std::memory_order_release);
    return raw;
  }

  // Counts `h` once (lock-free; bounded probing: past kRefusedTracked distinct sets, or a long
  // probe run, it is not counted).
  void Refuse(uint64_t h) {
    constexpr size_t kMaxProbe = 64;
    for (size_t n = 0, i = h % kRefusedTracked; n < kMaxProbe; ++n, i = (i + 1) % kRefusedTracked) {
      uint64_t seen = refused_fp_[i].load(std::memory_order_relaxed);
      if (seen == h) return;
      if (seen == 0) {
        if (refused_fp_[i].compare_exchange_strong(seen, h, std::memory_order_relaxed)) {
          refused_.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        if (seen == h) return;  // another thread counted it just now
      }
    }
  }

  const size_t capacity_;
  const size_t max_value_bytes_;
  const size_t mask_;  // index slots - 1 (a power of two, at least twice the capacity)
  // Slot -> entry (null: empty). Written under mu_, read without it.
  std::unique_ptr<std::atomic<Entry*>[]> index_;
  std::unique_ptr<std::atomic<uint64_t>[]> refused_fp_;  // fingerprints of refused label sets
  std::atomic<uint64_t> refused_{0};
  std::atomic<size_t> size_{0};
  Entry overflow_;  // labels and hash fixed at construction
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Entry>> owned_ KVD_GUARDED_BY(mu_);
};

}  // namespace kvd
