// LookupResult: the state of one request's LOOKUP result, from the lookup to the
// QUERY_PREFETCH_STATUS that takes it. A value kept per session (sessions.h, under the
// session's lock); not thread-safe on its own.
//
//              Begin() -> g                   Finish(g, hits)
//    none ────────────────────▶ running(g) ─────────────────────▶ ready(hits)
//     ▲ │                        │    ▲                               │
//     │ │                        └────┘ Begin() -> g+1 (a late        │
//     │ │                               Finish(g) is then ignored)    │
//     │ └──── Set(hits), from any state ──────────────────────▶ ready(hits)
//     └───────────────────────────── Take() -> hits ──────────────────┘
//
//   Take() in none or running answers nullopt and changes nothing.
//
//   * Begin: a lookup whose prefix still loads from the tiers (its answer comes later, from
//     the prefetch's completion, as Finish with the generation Begin returned).
//   * Set: a lookup answered at once (no tiers, or nothing to load); it supersedes a running
//     one (whose Finish is then ignored).
//   * Take: QUERY_PREFETCH_STATUS takes a ready result once; while running it answers "still
//     running" instead (the caller asks running() first).
#pragma once

#include <cstdint>
#include <optional>

namespace kvd::server {

class LookupResult {
 public:
  // A lookup answered now with `hit_chunks`.
  void Set(int64_t hit_chunks) {
    hits_ = hit_chunks;
    ++generation_;
    running_ = false;
  }
  // A lookup whose answer comes later: returns the generation Finish must name.
  uint64_t Begin() {
    hits_.reset();
    running_ = true;
    return ++generation_;
  }
  // The answer of lookup `generation`; false (nothing recorded) when a later Begin or Set
  // superseded it.
  bool Finish(uint64_t generation, int64_t hit_chunks) {
    if (generation != generation_) return false;
    hits_ = hit_chunks;
    running_ = false;
    return true;
  }
  // True while `generation` is the latest lookup and it has not finished.
  bool Current(uint64_t generation) const { return running_ && generation == generation_; }
  bool running() const { return running_; }
  // The ready result, taken once (nullopt: none).
  std::optional<int64_t> Take() {
    auto r = hits_;
    hits_.reset();
    return r;
  }

 private:
  std::optional<int64_t> hits_;
  uint64_t generation_ = 0;
  bool running_ = false;
};

}  // namespace kvd::server
