// LookupResults: every request's LOOKUP result as QUERY_PREFETCH_STATUS and
// WAIT_PREFETCH_STATUS see it, in one place: its state (the edges drawn in lookup_result.h:
// none, running(generation), ready(hits)), the counter of changes a parked
// WAIT_PREFETCH_STATUS watches, the wakeup of the request loop when a prefetch ends, and the
// per-request mutexes that order a request's lookup and its prefetch completion.
//
// A request has an entry from its LOOKUP (Set or Begin) until the QUERY_PREFETCH_STATUS that
// takes the ready result, its END_SESSION, its expiry or its eviction:
//
//   LOOKUP, nothing to load:     Set(hits)                        -> ready; a change
//   LOOKUP, prefetching:         Begin() -> g ... Finish(g, hits) -> ready; PrefetchEnded:
//                                                                    a change and the wakeup
//   QUERY/WAIT_PREFETCH_STATUS:  Running(), then Take()           -> entry gone
//   END_SESSION:                 SessionEnded(id)                 -> entry gone; a change
//   Maintain (each second):      Expire()                         -> idle entries gone
//   a new request at a bound:    (inside Set/Begin)               -> oldest entries gone
//
// A running entry that goes (ended, expired, evicted) makes its prefetch's completion record
// nothing (Current and Finish answer false); the request's L1 read locks then stay until its
// RETRIEVEs, FREE_LOOKUP_LOCKS, its next LOOKUP or the read TTL, as after END_SESSION. Every
// drop counts a change, so a parked waiter answers (0) at once.
//
// Bounds (Limits): at most max_results entries holding at most max_bytes (request id and
// bookkeeping); beyond either the least recently used other entries are dropped (evicted()).
// An entry untouched for ttl_seconds expires; every call that names a request touches its
// entry (a client polling a running prefetch keeps it). The session table's hashes are kept apart
// (sessions.h), with bounds of their own: evicting a session keeps its result, and the reverse.
//
// Generations come from one counter for every request: a prefetch that outlives its entry can
// never finish a later lookup of a reused request id.
//
// Threads: every method is thread-safe. mu_ guards the entries and their bookkeeping; it is
// held only for a map operation, never across a call out. RequestMutex(id) is held by a LOOKUP
// while it locks and records, and by a prefetch completion while it checks, locks and records;
// never across a tier call. Those mutexes guard no field, only the order of one request's
// steps, so nothing is KVD_GUARDED_BY them. Lock order: a request mutex, then mu_. The wakeup
// runs under wakeup_mu_, on the thread that ended the prefetch, with mu_ not held.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/clock.h"
#include "common/mutex.h"
#include "server/lookup_result.h"

namespace kvd::server {

class LookupResults {
 public:
  struct Limits {
    uint64_t max_results = 65536;         // --max-sessions
    uint64_t max_bytes = uint64_t{1} << 30;  // --max-session-memory-mb
    double ttl_seconds = 600;             // --session-ttl-seconds
  };
  // Borrows `clock`, which must outlive this object.
  LookupResults(const Clock* clock, Limits limits);

  // A lookup answered now with `hits`; supersedes a running one. Counts a change.
  void Set(std::string_view request_id, int64_t hits) KVD_EXCLUDES(mu_);
  // A lookup whose answer comes later (from the tiers): the generation Finish must name.
  uint64_t Begin(std::string_view request_id) KVD_EXCLUDES(mu_);
  // The answer of lookup `generation`; false (nothing recorded) when a later lookup of the
  // request superseded it or its entry is gone. The caller calls PrefetchEnded after.
  bool Finish(std::string_view request_id, uint64_t generation, int64_t hits) KVD_EXCLUDES(mu_);
  // True while `generation` is the request's latest lookup and has not finished.
  bool Current(std::string_view request_id, uint64_t generation) KVD_EXCLUDES(mu_);
  // True while the request's lookup still loads its prefix from the tiers.
  bool Running(std::string_view request_id) KVD_EXCLUDES(mu_);
  // QUERY_PREFETCH_STATUS: nullopt while running; else the ready result, taken once (0 when
  // there is none). The entry goes with it.
  std::optional<int64_t> Take(std::string_view request_id) KVD_EXCLUDES(mu_);
  // END_SESSION: the request's entry goes; its waiter answers now (0). Counts a change.
  void SessionEnded(std::string_view request_id) KVD_EXCLUDES(mu_);
  // Drops the entries untouched for longer than the TTL; returns how many.
  size_t Expire() KVD_EXCLUDES(mu_);

  // A prefetch's completion is done with the request (however it ended): counts a change and
  // wakes the request loop.
  void PrefetchEnded() KVD_EXCLUDES(wakeup_mu_);
  // Counts the events after which a running prefetch may have ended: results set, prefetches
  // ended, entries dropped. A parked waiter re-checks when it moved.
  uint64_t changes() const { return changes_.load(std::memory_order_acquire); }
  // Called (on the thread that ended it) each time a prefetch ends; null: none. Replaces the
  // last.
  void SetWakeup(std::function<void()> wakeup) KVD_EXCLUDES(wakeup_mu_);

  // The mutex that orders request `request_id`'s lookup and prefetch completion (one of 64).
  Mutex& RequestMutex(std::string_view request_id) {
    return request_mu_[std::hash<std::string_view>{}(request_id) % request_mu_.size()];
  }

  size_t size() const KVD_EXCLUDES(mu_);
  uint64_t bytes() const KVD_EXCLUDES(mu_);
  // Entries dropped to stay within the bounds (not counting takes, ends or expiry).
  uint64_t evicted() const KVD_EXCLUDES(mu_);
  const Limits& limits() const { return limits_; }

 private:
  struct Entry {
    LookupResult result;
    int64_t last_used_ns = 0;
    uint64_t bytes = 0;
    std::list<std::string_view>::iterator lru_pos;  // views the map's key
  };
  struct IdHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  using Map = std::unordered_map<std::string, Entry, IdHash, std::equal_to<>>;

  // The request's entry, made most recently used; created (evicting the oldest others while a
  // bound would be exceeded) when absent.
  Entry& TouchOrCreateLocked(std::string_view request_id) KVD_REQUIRES(mu_);
  // The request's entry made most recently used; null when absent.
  Entry* TouchLocked(std::string_view request_id) KVD_REQUIRES(mu_);
  // Makes `it`'s entry the most recently used.
  void TouchLocked(Map::iterator it) KVD_REQUIRES(mu_);
  void RemoveLocked(Map::iterator it) KVD_REQUIRES(mu_);
  void CountChange() { changes_.fetch_add(1, std::memory_order_acq_rel); }

  const Clock* const clock_;
  const Limits limits_;
  const int64_t ttl_ns_;
  mutable Mutex mu_;
  Map entries_ KVD_GUARDED_BY(mu_);
  std::list<std::string_view> lru_ KVD_GUARDED_BY(mu_);  // most recently used first
  uint64_t bytes_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t evicted_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t last_generation_ KVD_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> changes_{0};
  Mutex wakeup_mu_;
  std::function<void()> wakeup_ KVD_GUARDED_BY(wakeup_mu_);
  std::array<Mutex, 64> request_mu_;
};

}  // namespace kvd::server
