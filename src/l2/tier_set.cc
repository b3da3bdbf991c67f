// TierSet: construction of the parts, the control loop, Close and stats. The parts: store-
// behind (store_behind.cc), prefetch (prefetcher.cc), tier accounting and eviction
// (tier_eviction.cc), the operator calls (tier_admin.cc).
#include "l2/tier_set.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>


namespace kvd::l2 {

Result<std::unique_ptr<TierSet>> TierSet::Create(const TierSetOptions& options,
                                                 std::vector<TierSpec> tiers, l1::L1Cache* l1) {
  if (!options.clock) return Status::InvalidArgument("TierSet needs a clock");
  if (!l1) return Status::InvalidArgument("TierSet needs the L1 cache");
  if (options.store_policy != "default" && options.store_policy != "skip_l1") {
    return Status::InvalidArgument("--l2-store-policy must be default or skip_l1, got '" +
                                   options.store_policy + "'");
  }
  if (options.prefetch_policy != "default" && options.prefetch_policy != "retain") {
    return Status::InvalidArgument("--l2-prefetch-policy must be default or retain, got '" +
                                   options.prefetch_policy + "'");
  }
  if (options.prefetch_max_in_flight < 1) {
    return Status::InvalidArgument("--l2-prefetch-max-in-flight must be at least 1");
  }
  auto set = std::unique_ptr<TierSet>(new TierSet(options));
  std::map<std::string, int> per_type;
  for (const auto& t : tiers) per_type[t.config.type]++;
  for (auto& spec : tiers) {
    if (!spec.tier || !spec.serde) return Status::InvalidArgument("TierSpec without tier or serde");
    const auto& ev = spec.config.eviction;
    auto st = std::make_unique<TierState>(ev && ev->policy != "noop" ? ev->policy : "LRU");
    st->name = per_type[spec.config.type] > 1
                   ? spec.config.type + "#" + std::to_string(spec.config.index)
                   : spec.config.type;
    st->capacity = spec.config.capacity_bytes();
    st->eviction = spec.config.eviction;
    st->spec = std::move(spec);
    set->tiers_.push_back(std::move(st));
  }
  TierSet& ts = *set;
  ts.every_tier_indexed_ = !ts.tiers_.empty() &&
                           std::all_of(ts.tiers_.begin(), ts.tiers_.end(), [](const auto& t) {
                             return t->spec.tier->stores() && t->capacity > 0;
                           });
  const std::span<const std::unique_ptr<TierState>> states(ts.tiers_);
  if (options.prefetch_policy == "default") ts.prefetched_ = std::make_unique<PrefetchedChunks>(l1, options.clock);
  if (options.store_policy == "skip_l1") ts.skip_l1_ = std::make_unique<SkipL1Chunks>(l1);
  ts.store_ = std::make_unique<l2::StoreBehind>(
      l2::StoreBehind::Budget{options.store_max_inflight_bytes, options.store_max_inflight_batches}, options.clock, l1,
      states, &ts.calls_, ts.skip_l1_.get());
  ts.prefetcher_ = std::make_unique<Prefetcher>(
      Prefetcher::Options{options.prefetch_max_in_flight, options.prefetch_timeout_s, options.clock}, l1, states,
      &ts.calls_, ts.prefetched_.get());
  if (options.scan_at_start) {
    for (auto& t : ts.tiers_) {
      if (t->capacity > 0) t->ScanEarlierRuns(ts.calls_);
    }
  }
  // The once-a-second work first runs a second after the set is made, whenever the thread
  // itself gets to run (under load, a test's stores could otherwise land before or after a
  // first round, and a thread started late would miss a clock step made meanwhile).
  const int64_t start_ns = options.clock->NowNanos();
  set->control_ = std::thread([s = set.get(), start_ns] { s->ControlLoop(start_ns); });
  return set;
}

TierSet::TierSet(const TierSetOptions& options) : options_(options) {}

TierSet::~TierSet() { Close(); }

bool TierSet::WaitIdle(double timeout_s) { return calls_.WaitIdle(timeout_s); }

void TierSet::StoreBehind(std::vector<CommittedObject> objects, const ObjectFormat& format) {
  store_->Submit(std::move(objects), format);
}

void TierSet::Prefetch(PrefetchRequest request, std::function<void(size_t)> done) {
  prefetcher_->Prefetch(std::move(request), [done = std::move(done)](PrefetchAnswer a) { done(a.chunks); });
}

void TierSet::PrefetchWithAnswer(PrefetchRequest request, std::function<void(PrefetchAnswer)> done) {
  prefetcher_->Prefetch(std::move(request), std::move(done));
}

void TierSet::AfterRetrieve(std::span<const l1::ChunkKey> chunks) {
  if (prefetched_) prefetched_->AfterRetrieve(chunks);
}

void TierSet::Close() {
  {
    MutexLock lock(&control_mu_);
    if (stop_control_) return;
    stop_control_ = true;
  }
  // No new writes or prefetches; queued prefetches answer now, running ones when their tiers
  // do (closing the tiers below makes every tier answer what it still holds).
  if (store_) store_->Close();          // null when Create failed before building the parts
  if (prefetcher_) prefetcher_->Close();
  control_cv_.NotifyAll();
  if (control_.joinable()) control_.join();
  for (auto& t : tiers_) t->spec.tier->Close();
  // A closed tier has answered every call (tier.h); one that has not breaks that contract.
  // Its callbacks use this object, so Close keeps waiting for them rather than return.
  for (int waited_s = 30; !WaitIdle(30); waited_s += 30) {
    spdlog::error("l2: {} tier call(s) still unanswered {} s after the tiers were closed; "
                  "waiting for them before shutting down", calls_.count(), waited_s);
  }
}

// ---------------------------------------------------------------------------------------------
// Control loop: prefetch timeouts (every 50 ms), prefetched-chunk removal and tier eviction
// (every second).

void TierSet::ControlLoop(int64_t start_ns) {
  int64_t last_second = start_ns;
  control_mu_.Lock();
  while (!stop_control_) {
    control_cv_.WaitFor(&control_mu_, std::chrono::milliseconds(50));
    if (stop_control_) break;
    control_mu_.Unlock();
    prefetcher_->CheckTimeouts();
    const int64_t now = options_.clock->NowNanos();
    if (now - last_second >= 1'000'000'000LL) {
      last_second = now;
      if (prefetched_) prefetched_->Sweep();
      if (skip_l1_) skip_l1_->Sweep();
      for (auto& t : tiers_) t->Evict(calls_, [this](std::vector<ChunkSlot> s) { SlotsLeftATier(std::move(s)); });
    }
    control_mu_.Lock();
  }
  control_mu_.Unlock();
}

// ---------------------------------------------------------------------------------------------
// Chunk slots in no tier

bool TierSet::SlotHeld(const ChunkSlot& slot) const {
  return std::any_of(tiers_.begin(), tiers_.end(), [&slot](const auto& t) {
    MutexLock lock(&t->mu);
    return t->index.holds(slot);
  });
}

bool TierSet::ChunkInNoTier(const l1::ChunkKey& chunk, uint32_t slots) const {
  if (!every_tier_indexed_) return false;
  for (uint32_t s = 0; s < slots; ++s) {
    if (!SlotHeld({chunk, s})) return true;
  }
  return false;
}

void TierSet::SlotsLeftATier(std::vector<ChunkSlot> slots) const {
  if (!every_tier_indexed_ || !options_.on_chunk_slots_gone || slots.empty()) return;
  std::erase_if(slots, [this](const ChunkSlot& slot) { return SlotHeld(slot); });
  if (!slots.empty()) options_.on_chunk_slots_gone(slots);
}

// ---------------------------------------------------------------------------------------------
// Stats

TierSetStats TierSet::stats() const {
  TierSetStats s;
  s.store_policy = options_.store_policy;
  s.prefetch_policy = options_.prefetch_policy;
  for (const auto& tp : tiers_) {
    TierStats ts;
    {
      MutexLock lock(&tp->mu);
      ts = tp->st;
      ts.usage_bytes = tp->index.usage();
      ts.objects = tp->index.size();
      ts.scanned = tp->scanned;
    }
    ts.name = tp->name;
    ts.type = tp->spec.config.type;
    ts.describe = tp->spec.tier->Describe();
    ts.capacity_bytes = tp->capacity;
    ts.health = tp->spec.tier->Health();
    {
      MutexLock lock(&tp->mu);
      if (ts.health.healthy && tp->failures_in_a_row >= kUnhealthyAfterFailures) {
        ts.health.healthy = false;
        ts.health.detail = "the last " + std::to_string(tp->failures_in_a_row) +
                           " operations failed: " + tp->last_error;
      }
    }
    s.tiers.push_back(std::move(ts));
  }
  const Prefetcher::Stats p = prefetcher_->stats();
  s.prefetch_requests = p.requests;
  s.prefetch_hit_chunks = p.hit_chunks;
  s.prefetch_failed_chunks = p.failed_chunks;
  s.prefetch_timeouts = p.timeouts;
  s.active_prefetch_jobs = p.active;
  s.queued_prefetch_jobs = p.queued;
  if (skip_l1_) {
    s.skip_l1_removed_chunks = skip_l1_->removed();
    s.skip_l1_waiting_chunks = skip_l1_->waiting();
  }
  if (prefetched_) s.temporary_chunks = prefetched_->size();
  return s;
}

}  // namespace kvd::l2
