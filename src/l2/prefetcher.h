// Prefetcher: brings the chunks after a LOOKUP's L1 prefix in from the tiers. Every tier is
// asked which objects it has; each object is planned from the lowest-index tier that has it;
// the prefix continues while every object (all ranks) of a chunk is somewhere. L1 slots are
// reserved (l1::WriteReservation) and the tiers load straight into them; a chunk is committed
// when all its objects arrived intact, and the prefix ends at the first chunk that did not.
// `done` then reports the leading chunks now resident in L1, and whether the chunk after them
// is in no tier at all.
//
// At most max_in_flight prefetches run at once (the others wait their turn, in order); a
// prefetch that takes longer than timeout_s answers with the L1 prefix alone (CheckTimeouts,
// from the TierSet's control loop); loads already issued are still committed (or dropped)
// when the tier answers, and one that has not issued its loads yet issues none. Two
// prefetches that want the same chunk do not load it twice: the second follows the first's
// loads (see loading_).
//
// Threads: Prefetch, CheckTimeouts, Close and stats are thread-safe; the tiers' callbacks
// run on tier threads. `done` runs exactly once, on a tier thread, the control thread or
// inline. Ownership: borrows everything it is built with; the TierSet that owns it keeps them
// alive until every tier call has answered (TierCalls).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "l1/l1_cache.h"
#include "l2/prefetched_chunks.h"
#include "l2/tier_types.h"
#include "l2/tier_state.h"

namespace kvd::l2 {

class Prefetcher {
 public:
  struct Options {
    int max_in_flight = 8;
    double timeout_s = 10;
    const Clock* clock = nullptr;
  };
  struct Stats {
    uint64_t requests = 0;       // prefetches that went to the tiers
    uint64_t hit_chunks = 0;     // chunks they brought into L1
    uint64_t failed_chunks = 0;  // planned chunks that did not arrive
    uint64_t timeouts = 0;
    uint64_t active = 0, queued = 0;
  };
  // `prefetched`: where committed chunks are recorded (lmcache's default prefetch policy);
  // null: they stay (retain).
  Prefetcher(Options options, l1::L1Cache* l1, std::span<const std::unique_ptr<TierState>> tiers,
             TierCalls* calls, PrefetchedChunks* prefetched)
      : options_(options), l1_(l1), tiers_(tiers), calls_(calls), prefetched_(prefetched) {}

  void Prefetch(PrefetchRequest request, std::function<void(PrefetchAnswer)> done) KVD_EXCLUDES(jobs_mu_);
  // Answers the prefetches past their deadline from L1 (the control loop, every 50 ms).
  void CheckTimeouts() KVD_EXCLUDES(jobs_mu_);
  // Queued prefetches answer now (from L1), later ones at once; running ones answer when their
  // tiers do.
  void Close() KVD_EXCLUDES(jobs_mu_);
  Stats stats() const KVD_EXCLUDES(jobs_mu_);

 private:
  struct Job;  // prefetcher.cc

  void StartOrQueue(std::shared_ptr<Job> job) KVD_EXCLUDES(jobs_mu_);
  void RunJob(const std::shared_ptr<Job>& job);
  void OnExists(const std::shared_ptr<Job>& job);
  void OnLoaded(const std::shared_ptr<Job>& job);
  // Reserves the L1 slots of chunk c of the plan; false: the prefix ends.
  bool ReserveChunk(const std::shared_ptr<Job>& job, size_t c) KVD_REQUIRES(loading_mu_);
  void Finish(const std::shared_ptr<Job>& job);
  void Answer(const std::shared_ptr<Job>& job, PrefetchAnswer answer);
  void JobFinished() KVD_EXCLUDES(jobs_mu_);

  const Options options_;
  l1::L1Cache* const l1_;
  const std::span<const std::unique_ptr<TierState>> tiers_;
  TierCalls* const calls_;
  PrefetchedChunks* const prefetched_;

  mutable Mutex jobs_mu_;
  std::deque<std::shared_ptr<Job>> queued_ KVD_GUARDED_BY(jobs_mu_);
  std::vector<std::weak_ptr<Job>> running_ KVD_GUARDED_BY(jobs_mu_);  // for timeouts
  int active_jobs_ KVD_GUARDED_BY(jobs_mu_) = 0;
  bool closed_ KVD_GUARDED_BY(jobs_mu_) = false;

  // Chunks whose L1 slots a job has reserved and is loading -> that job. A job that finds a
  // chunk's slots reserved by another job waits for that job's loads (follows it) instead of
  // counting them as resident. A job's entries leave, and its followers are released, once
  // its own loads are committed or aborted; a job never waits for its followers, so following
  // cannot deadlock. Reservations of a chunk, its entry and a follower's lookup of it happen
  // under loading_mu_ together.
  Mutex loading_mu_;
  std::unordered_map<l1::ChunkKey, Job*, l1::ChunkKeyHash> loading_ KVD_GUARDED_BY(loading_mu_);

  std::atomic<uint64_t> requests_{0}, hit_chunks_{0}, failed_chunks_{0}, timeouts_{0};
};

}  // namespace kvd::l2
