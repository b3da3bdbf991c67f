#include "eviction/hit_index.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvd::eviction::lhd {
namespace {

// Ages with fewer observations than this reaching them are "beyond the data".
constexpr double kMinRisk = 1;

}  // namespace

int BucketOf(uint32_t age) {
  if (age < 8) return static_cast<int>(age);
  const int e = 31 - __builtin_clz(age);  // 3..31
  return 8 + (e - 3) * 4 + static_cast<int>((age >> (e - 2)) & 3);
}

uint64_t BucketStart(int bucket) {
  if (bucket < 8) return static_cast<uint64_t>(bucket);
  const int e = (bucket - 8) / 4 + 3;
  return static_cast<uint64_t>(4 + (bucket - 8) % 4) << (e - 2);
}

uint64_t BucketWidth(int bucket) {
  if (bucket < 8) return 1;
  return uint64_t{1} << ((bucket - 8) / 4 + 1);
}

void Histogram::AddAll(const Histogram& other) {
  for (int c = 0; c < kClasses; ++c) {
    for (int b = 0; b < kBuckets; ++b) n[c][b] += other.n[c][b];
  }
}

void Histogram::Scale(float factor) {
  for (auto& row : n) {
    for (float& v : row) v *= factor;
  }
}

double Histogram::Total() const {
  double t = 0;
  for (const auto& row : n) {
    for (float v : row) t += v;
  }
  return t;
}

IndexTable ComputeIndex(const Histogram& hits, const Histogram& ends, const Histogram& open) {
  IndexTable index{};
  for (int c = 0; c < kClasses; ++c) {
    // risk[b]: observations that reached bucket b; hazard[b]: the share of them used there.
    std::array<double, kBuckets + 1> risk{};
    for (int b = kBuckets - 1; b >= 0; --b) {
      risk[b] = risk[b + 1] + hits.n[c][b] + ends.n[c][b] + open.n[c][b];
    }
    std::array<double, kBuckets> hazard{};
    for (int b = 0; b < kBuckets; ++b) {
      hazard[b] = risk[b] >= kMinRisk ? std::min(1.0, hits.n[c][b] / risk[b]) : 0;
    }
    auto& row = index[c];
    for (int b = 0; b < kBuckets; ++b) {
      if (risk[b] < kMinRisk) {  // beyond the data: as the oldest age that has some
        row[b] = b > 0 ? row[b - 1] : 0;
        continue;
      }
      // Keep from bucket b until some later bucket x: reuses / entry-ticks, best over x.
      double best = 0, reuses = 0, ticks = 0, alive = 1;
      for (int x = b; x < kBuckets && risk[x] >= kMinRisk; ++x) {
        reuses += alive * hazard[x];
        ticks += alive * static_cast<double>(BucketWidth(x));
        alive *= 1 - hazard[x];
        best = std::max(best, reuses / ticks);
      }
      row[b] = static_cast<float>(best);
    }
    // Never rising with age: within a class the older entry goes first.
    for (int b = kBuckets - 2; b >= 0; --b) row[b] = std::max(row[b], row[b + 1]);
  }
  // Never falling with uses: at one age, the entry used more often goes last.
  for (int c = 1; c < kClasses; ++c) {
    for (int b = 0; b < kBuckets; ++b) index[c][b] = std::max(index[c][b], index[c - 1][b]);
  }
  return index;
}

HitStats::HitStats() { view_.index = std::make_shared<const IndexTable>(); }

size_t HitStats::Join() {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < open_.size(); ++i) {
    if (!open_[i]) {
      open_[i].emplace();
      return i;
    }
  }
  open_.emplace_back(std::in_place);
  return open_.size() - 1;
}

void HitStats::Leave(size_t slot) {
  MutexLock lock(&mu_);
  if (slot < open_.size()) open_[slot].reset();
}

HitStats::View HitStats::Sync(size_t slot, Histogram& hits, Histogram& ends,
                              const Histogram* open, double victim_age_sum, uint64_t victims) {
  const double added = hits.Total() + ends.Total();
  MutexLock lock(&mu_);
  hits_.AddAll(hits);
  ends_.AddAll(ends);
  hits.Clear();
  ends.Clear();
  if (open != nullptr && slot < open_.size() && open_[slot]) *open_[slot] = *open;
  if (victims > 0) {
    const double mean = victim_age_sum / static_cast<double>(victims);
    if (!victim_age_known_) {
      victim_age_ = mean;
      victim_age_known_ = true;
    } else {
      // About the last thousand victims.
      victim_age_ += (1 - std::pow(0.999, static_cast<double>(victims))) * (mean - victim_age_);
    }
    view_.horizon = static_cast<uint32_t>(std::min<double>(
        kHorizonFactor * victim_age_, std::numeric_limits<uint32_t>::max()));
  }
  fresh_ += added;
  if (fresh_ >= static_cast<double>(kRecomputeEvents)) {
    fresh_ = 0;
    Histogram open_all;
    for (const auto& o : open_) {
      if (o) open_all.AddAll(*o);
    }
    view_.index = std::make_shared<const IndexTable>(ComputeIndex(hits_, ends_, open_all));
    view_.version = version_.load(std::memory_order_relaxed) + 1;
    version_.store(view_.version, std::memory_order_release);
    hits_.Scale(kDecay);
    ends_.Scale(kDecay);
  }
  return view_;
}

HitStats::View HitStats::view() const {
  MutexLock lock(&mu_);
  return view_;
}

}  // namespace kvd::eviction::lhd
