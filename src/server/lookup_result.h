// LookupResult: the state of one request's LOOKUP result, from the lookup to the
// QUERY_PREFETCH_STATUS that takes it. A value kept per request by LookupResults (under its
// lock); not thread-safe on its own.
//
//              Begin(g)                       Finish(g, hits)
//    none ────────────────────▶ running(g) ─────────────────────▶ ready(hits)
//     ▲ │                        │    ▲                               │
//     │ │                        └────┘ Begin(g') (a late             │
//     │ │                               Finish(g) is then ignored)    │
//     │ └──── Set(g', hits), from any state ──────────────────▶ ready(hits)
//     └───────────────────────────── Take() -> hits ──────────────────┘
//
//   Take() in none or running answers nullopt and changes nothing.
//
//   * Generations are drawn by the owner (LookupResults) from one counter for all requests,
//     so no two lookups ever share one: a completion from before the request's result was
//     dropped (END_SESSION, expiry, eviction) can never pass for a later lookup's.
//   * Begin: a lookup whose prefix still loads from the tiers (its answer comes later, from
//     the prefetch's completion, as Finish with the same generation).
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
  // Lookup `generation` answered now with `hit_chunks`.
  void Set(uint64_t generation, int64_t hit_chunks) {
    hits_ = hit_chunks;
    generation_ = generation;
    running_ = false;
  }
  // Lookup `generation`, whose answer comes later (Finish with the same generation).
  void Begin(uint64_t generation) {
    hits_.reset();
    running_ = true;
    generation_ = generation;
  }
  // The answer of lookup `generation`; false (nothing recorded) when it is not the running
  // lookup (a later Begin or Set superseded it, or it finished).
  bool Finish(uint64_t generation, int64_t hit_chunks) {
    if (!Current(generation)) return false;
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
