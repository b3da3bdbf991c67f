// LookupResults: every request's LOOKUP result as QUERY_PREFETCH_STATUS and
// WAIT_PREFETCH_STATUS see it, in one place: its state (the edges drawn in lookup_result.h:
// none, running(generation), ready(hits)), the counter of changes a parked
// WAIT_PREFETCH_STATUS watches, the wakeup of the request loop when a prefetch ends, and the
// per-request mutexes that order a request's lookup and its prefetch completion.
//
// Where the state is kept: in the request's session entry (SessionTable, under that entry's
// lock), so a result lives and dies with its session: --max-sessions and the session memory
// bound, END_SESSION and the session TTL apply to it as they do to the request's hashes.
//
//   LOOKUP, nothing to load:     Set(hits)                        -> a change
//   LOOKUP, prefetching:         Begin() -> g ... Finish(g, hits) -> PrefetchEnded: a change
//                                                                    and the wakeup
//   END_SESSION:                 SessionEnded()                   -> a change
//   QUERY/WAIT_PREFETCH_STATUS:  Running(), then Take()
//
// Threads: every method is thread-safe. RequestMutex(id) is held by a LOOKUP while it locks
// and records, and by a prefetch completion while it checks, locks and records; never across
// a tier call. The mutexes guard no field, only the order of one request's steps, so nothing
// is KVD_GUARDED_BY them (the analysis checks that each is released on every path). The
// wakeup runs under wakeup_mu_, on the thread that ended the prefetch.
// Ownership: borrows the session table, which must outlive this object.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "common/mutex.h"
#include "server/sessions.h"

namespace kvd::server {

class LookupResults {
 public:
  explicit LookupResults(SessionTable* sessions) : sessions_(sessions) {}

  // A lookup answered now with `hits`; supersedes a running one. Counts a change.
  void Set(std::string_view request_id, int64_t hits) {
    sessions_->SetLookupResult(request_id, hits);
    CountChange();
  }
  // A lookup whose answer comes later (from the tiers): the generation Finish must name.
  uint64_t Begin(std::string_view request_id) { return sessions_->BeginLookup(request_id); }
  // The answer of lookup `generation`; false (nothing recorded) when a later lookup of the
  // request superseded it or its session ended. The caller calls PrefetchEnded after.
  bool Finish(std::string_view request_id, uint64_t generation, int64_t hits) {
    return sessions_->FinishLookup(request_id, generation, hits);
  }
  // True while `generation` is the request's latest lookup and has not finished.
  bool Current(std::string_view request_id, uint64_t generation) {
    return sessions_->LookupCurrent(request_id, generation);
  }
  // True while the request's lookup still loads its prefix from the tiers.
  bool Running(std::string_view request_id) { return sessions_->LookupRunning(request_id); }
  // QUERY_PREFETCH_STATUS: nullopt while running; else the ready result, taken once (0 when
  // there is none).
  std::optional<int64_t> Take(std::string_view request_id) {
    if (Running(request_id)) return std::nullopt;
    return sessions_->TakeLookupResult(request_id).value_or(0);
  }

  // A prefetch's completion is done with the request (however it ended): counts a change and
  // wakes the request loop.
  void PrefetchEnded() KVD_EXCLUDES(wakeup_mu_) {
    CountChange();
    MutexLock lock(&wakeup_mu_);
    if (wakeup_) wakeup_();
  }
  // The request's session ended: its waiter answers now (0).
  void SessionEnded() { CountChange(); }
  // Counts the events after which a running prefetch may have ended: results set, prefetches
  // ended, sessions ended. A parked waiter re-checks when it moved.
  uint64_t changes() const { return changes_.load(std::memory_order_acquire); }
  // Called (on the thread that ended it) each time a prefetch ends; null: none. Replaces the
  // last.
  void SetWakeup(std::function<void()> wakeup) KVD_EXCLUDES(wakeup_mu_) {
    MutexLock lock(&wakeup_mu_);
    wakeup_ = std::move(wakeup);
  }

  // The mutex that orders request `request_id`'s lookup and prefetch completion (one of 64).
  Mutex& RequestMutex(std::string_view request_id) {
    return request_mu_[std::hash<std::string_view>{}(request_id) % request_mu_.size()];
  }

 private:
  void CountChange() { changes_.fetch_add(1, std::memory_order_acq_rel); }

  SessionTable* const sessions_;
  std::atomic<uint64_t> changes_{0};
  Mutex wakeup_mu_;
  std::function<void()> wakeup_ KVD_GUARDED_BY(wakeup_mu_);
  std::array<Mutex, 64> request_mu_;
};

}  // namespace kvd::server
