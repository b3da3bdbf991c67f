// What the LHD policy (lhd.cc) learns, and the ranking it learns it for.
//
// OBSERVATIONS. An entry's class is how many times it has been used (1, 2, 3, 4 or more; its
// Insert is the first use). From the moment of its last use, each entry is one observation
// of "how long until this class of entry is used again", at ages measured in ticks of the
// owner's shared clock:
//   * hits: used again at age a (a hit while resident, or its key coming back as a new Insert
//     while a ghost of it was remembered);
//   * ends: given up at age a without a reuse (a ghost forgotten once older than the horizon);
//   * open: not resolved yet, at age a now (a resident entry, or a remembered ghost).
// Ghosts (keys of evicted entries, with their class and last-use stamp) make the statistics
// those of keeping every entry up to the horizon, whatever the policy evicted: what the cache
// would have gained by keeping an entry longer is seen, not only what it did gain.
//
// THE INDEX. For each class and age, the best hit rate per unit of space-time that keeping an
// entry of that class and age can still achieve: over every later age T at which it could be
// dropped, expected reuses before T / expected entry-ticks spent until then (the Gittins index
// of the reuse process). Hazards are Kaplan-Meier estimates (hits at an age / observations
// that reached it, open ones included as censored), so observations not resolved yet bias
// nothing, and ages with no observations keep the index of the oldest age that has some.
// Evicting the lowest index first keeps, per unit of memory, the entries most likely to be
// hit soon; with one class it is LRU.
//
// Two orders are imposed on the table because prefix caching needs them: the index never rises
// with age (within a class the older entry goes first: LRU) and never falls with uses (at equal
// age, an entry used more often goes after one used less). A request uses every chunk before
// one it uses, so a chunk's prefix has at least its uses, and of the chunks one lookup hits
// the prefix is touched last (the owner reports them last first): with both orders such a
// prefix never goes before its tail, which would leave the tail useless (a lookup stops at the
// first miss). (Chunks stored after a request's hits are newer than its prefix, as in LRU.)
//
// THREADS. ComputeIndex is a pure function. HitStats is thread-safe (one mutex, taken once
// every kSyncEvents observations of an instance, and by an instance's Victim() only when the
// index changed since it last looked).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/mutex.h"
#include "eviction/eviction_policy.h"

namespace kvd::eviction::lhd {

inline constexpr int kClasses = 4;    // used 1, 2, 3, 4+ times
inline constexpr int kBuckets = 124;  // ages 0..7 one each, then 4 per power of two up to 2^32

// The age bucket of `age` (ticks) and the ages a bucket covers.
int BucketOf(uint32_t age);
uint64_t BucketStart(int bucket);
uint64_t BucketWidth(int bucket);

struct Histogram {
  std::array<std::array<float, kBuckets>, kClasses> n{};

  void Add(int cls, uint32_t age, float count = 1) { n[cls][BucketOf(age)] += count; }
  void AddAll(const Histogram& other);
  void Scale(float factor);
  void Clear() { *this = Histogram{}; }
  double Total() const;
};

// index[cls][bucket]; 0 where nothing was learned yet.
using IndexTable = std::array<std::array<float, kBuckets>, kClasses>;

IndexTable ComputeIndex(const Histogram& hits, const Histogram& ends, const Histogram& open);

// The statistics of every instance ranked together (the L1's shards), and the index computed
// from them. Each instance batches its observations and calls Sync every kSyncEvents of them.
class HitStats final : public SharedState {
 public:
  static constexpr uint64_t kSyncEvents = 64;         // an instance's observations per Sync
  static constexpr uint64_t kRecomputeEvents = 4096;  // observations between index updates
  static constexpr float kDecay = 0.99f;              // weight kept by old observations per update
  static constexpr double kHorizonFactor = 3;         // ghosts are remembered for 3x the
                                                      // typical victim's age

  struct View {
    std::shared_ptr<const IndexTable> index;  // never null
    uint32_t horizon = 0;                     // ticks a ghost is remembered (0: not yet known)
    uint64_t version = 0;                     // of the index
  };

  HitStats();

  // Registers an instance; the slot names its snapshot of open observations.
  size_t Join();
  void Leave(size_t slot);

  // Adds an instance's new hits and ends (and clears them), replaces its snapshot of open
  // observations when `open` is given, and folds in the ages of its victims since the last
  // call. Recomputes the index once kRecomputeEvents observations arrived since the last
  // update. Returns the current index and ghost horizon.
  View Sync(size_t slot, Histogram& hits, Histogram& ends, const Histogram* open,
            double victim_age_sum, uint64_t victims);

  View view() const;
  // Bumped whenever the index changes: instances compare it to their copy's (cheap, no lock)
  // and take the new view, so that every instance ranks with the same index.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  std::atomic<uint64_t> version_{0};
  mutable Mutex mu_;
  Histogram hits_ KVD_GUARDED_BY(mu_);
  Histogram ends_ KVD_GUARDED_BY(mu_);
  std::vector<std::optional<Histogram>> open_ KVD_GUARDED_BY(mu_);  // per slot; empty: left
  double fresh_ KVD_GUARDED_BY(mu_) = 0;       // observations since the last update
  double victim_age_ KVD_GUARDED_BY(mu_) = 0;  // moving average, ticks
  bool victim_age_known_ KVD_GUARDED_BY(mu_) = false;
  View view_ KVD_GUARDED_BY(mu_);
};

}  // namespace kvd::eviction::lhd
