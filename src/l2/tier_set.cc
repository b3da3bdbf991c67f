// TierSet: construction, store-behind, the control loop and stats. Prefetch lives in
// tier_prefetch.cc, tier accounting and eviction in tier_eviction.cc.
#include "l2/tier_set.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "l2/tier_set_internal.h"

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
  auto set = std::unique_ptr<TierSet>(new TierSet(options, l1));
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
  if (options.scan_at_start) {
    for (auto& t : set->tiers_) {
      if (t->capacity > 0) set->ScanTier(*t);
    }
  }
  // The once-a-second work first runs a second after the set is made, whenever the thread
  // itself gets to run (under load, a test's stores could otherwise land before or after a
  // first round, and a thread started late would miss a clock step made meanwhile).
  const int64_t start_ns = options.clock->NowNanos();
  set->control_ = std::thread([s = set.get(), start_ns] { s->ControlLoop(start_ns); });
  return set;
}

TierSet::TierSet(const TierSetOptions& options, l1::L1Cache* l1) : options_(options), l1_(l1) {}

TierSet::~TierSet() { Close(); }

bool TierSet::WaitIdle(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (calls_in_flight_.load() > 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void TierSet::Close() {
  {
    MutexLock lock(&jobs_mu_);
    if (closed_) return;
    closed_ = true;
  }
  {
    MutexLock lock(&control_mu_);
    stop_control_ = true;
  }
  control_cv_.NotifyAll();
  if (control_.joinable()) control_.join();
  // Queued prefetches answer now; running ones answer when their tiers do (Close below
  // makes every tier answer what it still holds).
  std::deque<std::shared_ptr<PrefetchJob>> queued;
  {
    MutexLock lock(&jobs_mu_);
    queued.swap(queued_);
  }
  for (auto& j : queued) Answer(j, {});
  for (auto& t : tiers_) t->spec.tier->Close();
  // A closed tier has answered every call (tier.h); one that has not breaks that contract.
  // Its callbacks use this object, so Close keeps waiting for them rather than return.
  for (int waited_s = 30; !WaitIdle(30); waited_s += 30) {
    spdlog::error("l2: {} tier call(s) still unanswered {} s after the tiers were closed; "
                  "waiting for them before shutting down", calls_in_flight_.load(), waited_s);
  }
}

// ---------------------------------------------------------------------------------------------
// Store-behind

void TierSet::StoreBehind(std::vector<CommittedObject> objects, const ObjectFormat& format) {
  const auto storing = static_cast<int>(std::count_if(
      tiers_.begin(), tiers_.end(), [](const auto& t) { return t->spec.tier->stores(); }));
  if (storing == 0 || objects.empty()) return;
  {
    MutexLock lock(&jobs_mu_);
    if (closed_) return;
  }
  auto batch = std::make_shared<StoreBatch>();
  batch->set = this;
  for (auto& o : objects) {
    auto pin = l1_->PinForRead(o.chunk, o.slot);
    if (!pin.ok()) continue;  // already gone from L1: nothing to write
    batch->pins.push_back(std::move(pin).value());
    batch->objects.push_back(std::move(o));
  }
  if (batch->objects.empty()) return;
  batch->remaining.store(storing);
  batch->stored = std::make_unique<std::atomic<bool>[]>(batch->objects.size());
  for (size_t i = 0; i < batch->objects.size(); ++i) batch->stored[i] = false;
  for (auto& tp : tiers_) {
    TierState& t = *tp;
    if (!t.spec.tier->stores()) continue;
    std::vector<StoreItem> items;
    std::vector<size_t> index;
    uint64_t bytes = 0;
    {
      MutexLock lock(&t.mu);
      t.st.store_requests++;
      t.st.store_objects += batch->objects.size();
      for (size_t i = 0; i < batch->objects.size(); ++i) {
        const uint64_t sz = batch->pins[i].size();
        const bool fits = t.inflight_batches < options_.store_max_inflight_batches &&
                          t.st.inflight_store_bytes + bytes + sz <= options_.store_max_inflight_bytes;
        if (!fits) {
          t.st.store_skipped_objects++;
          continue;
        }
        // Admission (issue 27, finding 3): a tier with a declared capacity never takes an
        // object that would put what it holds, plus what is being written, over it; the
        // write is skipped and counted as no space (eviction frees room at its next round).
        if (t.capacity > 0 && t.index.usage() + t.st.inflight_store_bytes + bytes + sz > t.capacity) {
          t.st.store_full_objects++;
          continue;
        }
        bytes += sz;
        items.push_back({batch->objects[i].key, batch->pins[i].data(), sz});
        index.push_back(i);
      }
      if (!items.empty()) {
        t.inflight_batches++;
        t.st.inflight_store_objects += items.size();
        t.st.inflight_store_bytes += bytes;
      }
    }
    if (items.empty()) {
      batch->TierDone();
      continue;
    }
    // Counted in flight above (objects and raw bytes); released as a whole by the callback.
    const size_t n_items = items.size();
    if (!t.spec.serde->identity()) {
      // Encoded forms are owned by the tier's part of the batch. An object that fails to
      // encode is not written (an empty object would read back as a failed decode, and
      // skip_l1 would count it as held by the tier).
      auto enc = std::make_shared<std::vector<std::vector<uint8_t>>>();
      enc->reserve(items.size());
      std::vector<StoreItem> encoded_items;
      std::vector<size_t> encoded_index;
      uint64_t failed = 0;
      for (size_t j = 0; j < items.size(); ++j) {
        auto& it = items[j];
        std::vector<uint8_t> buf(t.spec.serde->MaxStoredBytes(format.layout));
        auto n = t.spec.serde->Encode({it.data, it.size}, format.layout, buf);
        if (!n.ok()) {
          ++failed;
          spdlog::warn("{}: {} encode failed: {}", t.name, t.spec.serde->name(), n.status().message());
          continue;
        }
        buf.resize(*n);
        enc->push_back(std::move(buf));
        encoded_items.push_back({it.key, enc->back().data(), enc->back().size()});
        encoded_index.push_back(index[j]);
      }
      items = std::move(encoded_items);
      index = std::move(encoded_index);
      batch->encoded.push_back(enc);
      if (failed > 0) {
        MutexLock lock(&t.mu);
        t.st.store_failed_objects += failed;
        if (items.empty()) {
          t.inflight_batches--;
          t.st.inflight_store_objects -= n_items;
          t.st.inflight_store_bytes -= bytes;
        }
      }
      if (items.empty()) {
        batch->TierDone();
        continue;
      }
    }
    const int64_t t0 = options_.clock->NowNanos();
    calls_in_flight_++;
    t.spec.tier->Store(std::move(items), [this, &t, batch, index, bytes, t0, n_items](
                                             std::vector<ItemResult> results) {
      const double secs = static_cast<double>(options_.clock->NowNanos() - t0) * 1e-9;
      {
        MutexLock lock(&t.mu);
        t.inflight_batches--;
        t.st.inflight_store_objects -= n_items;
        t.st.inflight_store_bytes -= bytes;
        t.st.store_completed_requests++;
        t.st.store_seconds += secs;
        for (size_t j = 0; j < results.size() && j < index.size(); ++j) {
          const auto& r = results[j];
          const auto& obj = batch->objects[index[j]];
          if (r.status.ok()) {
            t.NoteSuccess();
            batch->stored[index[j]] = true;
            if (r.bytes > 0) {
              t.st.stored_objects++;
              t.st.stored_bytes += r.bytes;
            } else {
              t.st.store_existing_objects++;
            }
            t.AccountLocked(obj.key, r.bytes > 0 ? r.bytes : batch->pins[index[j]].size());
          } else if (r.status.code() == StatusCode::kResourceExhausted) {
            t.st.store_full_objects++;
            t.NoteError(r.status.message());
          } else {
            t.st.store_failed_objects++;
            t.NoteError(r.status.message());
          }
        }
      }
      batch->TierDone();
      calls_in_flight_--;
    });
  }
}

void TierSet::StoreBatch::TierDone() {
  if (remaining.fetch_sub(1) != 1) return;
  // The last tier answered: the pins go, then (skip_l1) the L1 copies a tier now holds.
  pins.clear();
  encoded.clear();
  if (set->options_.store_policy == "skip_l1") set->SkipL1Stored(objects, stored.get());
}

void TierSet::SkipL1Stored(const std::vector<CommittedObject>& objects,
                           const std::atomic<bool>* stored) {
  std::vector<l1::ChunkKey> complete;
  {
    MutexLock lock(&skip_mu_);
    for (size_t i = 0; i < objects.size(); ++i) {
      const CommittedObject& o = objects[i];
      if (!stored[i] || o.num_slots == 0 || o.slot >= o.num_slots) continue;
      SkipL1Chunk& c = skip_l1_[o.chunk];
      if (c.slots.size() != o.num_slots) c = SkipL1Chunk{std::vector<bool>(o.num_slots, false), 0};
      if (c.slots[o.slot]) continue;
      c.slots[o.slot] = true;
      if (++c.held == o.num_slots) complete.push_back(o.chunk);
    }
  }
  if (complete.empty()) return;
  // Removed now when idle; a busy one (read-locked, pinned) stays recorded for the sweep.
  std::vector<l1::ChunkKey> gone;
  for (const auto& k : complete) {
    if (l1_->RemoveIfIdle({&k, 1}) > 0) {
      skip_l1_removed_++;
      gone.push_back(k);
    }
  }
  MutexLock lock(&skip_mu_);
  for (const auto& k : gone) skip_l1_.erase(k);
}

void TierSet::SweepSkipL1() {
  std::vector<std::pair<l1::ChunkKey, SkipL1Chunk>> records;
  {
    MutexLock lock(&skip_mu_);
    if (skip_l1_.empty()) return;
    records.assign(skip_l1_.begin(), skip_l1_.end());
  }
  // A complete chunk is removed once idle; a record is dropped once none of its held slots
  // is in L1 any more (evicted, cleared, removed by someone else).
  std::vector<std::pair<l1::ChunkKey, uint32_t>> drop;  // key, held count seen
  for (const auto& [k, c] : records) {
    if (c.held == c.slots.size() && l1_->RemoveIfIdle({&k, 1}) > 0) {
      skip_l1_removed_++;
      drop.emplace_back(k, c.held);
      continue;
    }
    bool any = false;
    for (uint32_t s = 0; s < c.slots.size() && !any; ++s) any = c.slots[s] && l1_->IsResident(k, s);
    if (!any) drop.emplace_back(k, c.held);
  }
  MutexLock lock(&skip_mu_);
  for (const auto& [k, held] : drop) {
    auto it = skip_l1_.find(k);
    if (it != skip_l1_.end() && it->second.held == held) skip_l1_.erase(it);
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
    CheckTimeouts();
    const int64_t now = options_.clock->NowNanos();
    if (now - last_second >= 1'000'000'000LL) {
      last_second = now;
      SweepTemporary();
      SweepSkipL1();
      for (auto& t : tiers_) EvictTier(*t);
    }
    control_mu_.Lock();
  }
  control_mu_.Unlock();
}

void TierSet::SweepTemporary() {
  std::vector<l1::ChunkKey> keys;
  {
    // A chunk just committed is not taken yet: its lookup read-locks it right after (the
    // retrieve then lets it go); the sweep is for chunks no retrieve came for.
    const int64_t cutoff = options_.clock->NowNanos() - kTemporaryGraceNs;
    MutexLock lock(&temp_mu_);
    if (temporary_.empty()) return;
    for (const auto& [k, added_ns] : temporary_) {
      if (added_ns <= cutoff) keys.push_back(k);
    }
  }
  if (keys.empty()) return;
  l1_->RemoveIfIdle(keys);
  MutexLock lock(&temp_mu_);
  for (const auto& k : keys) {
    if (!l1_->IsResident(k, 0)) temporary_.erase(k);
  }
}

void TierSet::AfterRetrieve(std::span<const l1::ChunkKey> chunks) {
  std::vector<l1::ChunkKey> mine;
  {
    MutexLock lock(&temp_mu_);
    if (temporary_.empty()) return;
    for (const auto& k : chunks) {
      if (temporary_.count(k)) mine.push_back(k);
    }
  }
  if (mine.empty()) return;
  l1_->RemoveIfIdle(mine);
  MutexLock lock(&temp_mu_);
  for (const auto& k : mine) {
    if (!l1_->IsResident(k, 0)) temporary_.erase(k);
  }
}

// ---------------------------------------------------------------------------------------------
// Stats

void TierSet::TierState::NoteError(const std::string& what, bool operational) {
  last_error = what;
  last_error_count++;
  if (operational) failures_in_a_row++;
}

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
  s.prefetch_requests = prefetch_requests_.load();
  s.prefetch_hit_chunks = prefetch_hit_chunks_.load();
  s.prefetch_failed_chunks = prefetch_failed_chunks_.load();
  s.prefetch_timeouts = prefetch_timeouts_.load();
  s.skip_l1_removed_chunks = skip_l1_removed_.load();
  {
    MutexLock lock(&skip_mu_);
    s.skip_l1_waiting_chunks = skip_l1_.size();
  }
  {
    MutexLock lock(&jobs_mu_);
    s.active_prefetch_jobs = static_cast<uint64_t>(active_jobs_);
    s.queued_prefetch_jobs = queued_.size();
  }
  {
    MutexLock lock(&temp_mu_);
    s.temporary_chunks = temporary_.size();
  }
  return s;
}

}  // namespace kvd::l2
