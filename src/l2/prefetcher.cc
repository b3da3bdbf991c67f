// Prefetcher: ask every tier, plan each object from the lowest-index tier that has it,
// reserve L1 slots, load straight into them, commit the chunks that arrived whole.
#include "l2/prefetcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvd::l2 {

// One prefetch: the request, what each tier answered, the plan, the reservations and loads.
struct Prefetcher::Job {
  PrefetchRequest req;
  std::function<void(PrefetchAnswer)> done;
  std::atomic<bool> answered{false};
  int64_t deadline_ns = 0;
  size_t chunks = 0;
  uint32_t ranks = 0;
  std::vector<ObjectKey> keys;                 // chunk c, rank r at c * ranks + r
  std::vector<std::vector<uint8_t>> found;     // per tier, per object: kPresent, kAbsent, kUnknown
  std::vector<uint64_t> found_bytes;           // per object: size a tier reported (0: unknown)
  std::atomic<int> pending{0};                 // tier calls not answered
  std::vector<int> source;                     // per object: tier, kInL1, or kNone
  std::vector<l1::WriteReservation> res;       // per object (empty when not loaded)
  std::vector<std::vector<uint8_t>> staging;   // per object, for serdes that transform
  std::vector<Status> load_status;             // per object
  std::vector<uint64_t> load_bytes;            // per object: stored size the tier read
  size_t planned = 0;                          // chunks planned for loading
  // The chunk the plan stopped at because one of its objects is neither in L1 nor in any
  // tier (every tier answered kAbsent); SIZE_MAX when the plan stopped for another reason.
  size_t in_no_tier = SIZE_MAX;
  // Guards the writes of found / load_status by concurrent tier callbacks; they are read
  // without it once `pending` reached 0, so not KVD_GUARDED_BY.
  Mutex mu;
  // Its own loads done and committed (OnLoaded): per planned chunk, whether its own objects
  // arrived (objects it waits for from other jobs are checked in Finish).
  std::vector<uint8_t> chunk_loaded;
  // Chunks another job was loading when this one planned (source kFollow): this job answers
  // only once those jobs' loads are committed. following = jobs followed and not done + 1
  // (this job's own loads); Finish runs when it drops to 0.
  std::atomic<int> following{1};
  std::vector<const Job*> followed;            // planning thread only
  // Guarded by Prefetcher::loading_mu_ (a comment, not KVD_GUARDED_BY: the lock is the
  // Prefetcher's and a job has no pointer to it the analysis could name):
  std::vector<l1::ChunkKey> loading;           // chunks registered in Prefetcher::loading_
  std::vector<std::shared_ptr<Job>> followers;  // jobs waiting for this one's loads
  bool loads_done = false;                     // set with the followers taken
  // found[tier][object]: the tier's answer to the existence check.
  static constexpr uint8_t kAbsent = 0;        // "not found"
  static constexpr uint8_t kPresent = 1;
  static constexpr uint8_t kUnknown = 2;       // an error, or no answer for the object
  static constexpr int kInL1 = -2;
  static constexpr int kNone = -1;
  static constexpr int kFollow = -3;           // being loaded into L1 by another job
};

void Prefetcher::Prefetch(PrefetchRequest request, std::function<void(PrefetchAnswer)> done) {
  if (tiers_.empty() || request.chunks.empty() || request.world_size == 0 ||
      request.hashes.size() != request.chunks.size() || request.format.object_bytes == 0) {
    done({});
    return;
  }
  auto job = std::make_shared<Job>();
  job->chunks = request.chunks.size();
  job->ranks = request.world_size;
  job->deadline_ns = options_.clock->NowNanos() + static_cast<int64_t>(options_.timeout_s * 1e9);
  job->keys.reserve(job->chunks * job->ranks);
  for (size_t c = 0; c < job->chunks; ++c) {
    for (uint32_t r = 0; r < job->ranks; ++r) {
      ObjectKey k;
      k.model_name = request.model_name;
      k.kv_rank = KvRank(request.world_size, r);
      k.object_group = 0;
      k.chunk_hash = request.hashes[c];
      k.cache_salt = request.cache_salt;
      k.layout_tag = request.format.layout_tag;
      job->keys.push_back(std::move(k));
    }
  }
  job->req = std::move(request);
  job->done = std::move(done);
  requests_++;
  StartOrQueue(std::move(job));
}

void Prefetcher::StartOrQueue(std::shared_ptr<Job> job) {
  {
    MutexLock lock(&jobs_mu_);
    if (closed_) {
      job->answered = true;
      job->done({});
      return;
    }
    if (active_jobs_ >= options_.max_in_flight) {
      queued_.push_back(std::move(job));
      return;
    }
    active_jobs_++;
    running_.push_back(job);
  }
  RunJob(job);
}

void Prefetcher::JobFinished() {
  std::shared_ptr<Job> next;
  {
    MutexLock lock(&jobs_mu_);
    active_jobs_--;
    std::erase_if(running_, [](const std::weak_ptr<Job>& w) { return w.expired(); });
    while (!queued_.empty() && !next) {
      next = std::move(queued_.front());
      queued_.pop_front();
      if (next->answered.load()) next.reset();  // timed out while waiting
    }
    if (next) {
      active_jobs_++;
      running_.push_back(next);
    }
  }
  if (next) RunJob(next);
}

void Prefetcher::Answer(const std::shared_ptr<Job>& job, PrefetchAnswer answer) {
  if (job->answered.exchange(true)) return;
  job->done(answer);
}

void Prefetcher::CheckTimeouts() {
  const int64_t now = options_.clock->NowNanos();
  std::vector<std::shared_ptr<Job>> late;
  {
    MutexLock lock(&jobs_mu_);
    for (auto& w : running_) {
      auto j = w.lock();
      if (j && !j->answered.load() && now > j->deadline_ns) late.push_back(j);
    }
    for (auto& j : queued_) {
      if (!j->answered.load() && now > j->deadline_ns) late.push_back(j);
    }
  }
  for (auto& j : late) {
    if (!j->answered.load()) {
      timeouts_++;
      spdlog::warn("l2: a prefetch of {} chunk(s) did not finish in {:.1f} s; answering from L1",
                   j->chunks, options_.timeout_s);
    }
    Answer(j, {});
  }
  if (late.empty()) return;
  // Answered jobs still waiting for a turn leave the queue now (a hung tier may never give
  // them one); JobFinished would skip them anyway.
  MutexLock lock(&jobs_mu_);
  std::erase_if(queued_, [](const std::shared_ptr<Job>& j) { return j->answered.load(); });
}

void Prefetcher::RunJob(const std::shared_ptr<Job>& job) {
  const size_t n = job->keys.size();
  job->found.assign(tiers_.size(), std::vector<uint8_t>(n, Job::kUnknown));
  job->found_bytes.assign(n, 0);
  job->pending.store(static_cast<int>(tiers_.size()));
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    TierState& t = *tiers_[ti];
    {
      MutexLock lock(&t.mu);
      t.st.prefetch_lookup_objects += n;
    }
    calls_->Begin();
    t.spec.tier->Exists(job->keys, [this, job, ti, &t](std::vector<ItemResult> results) {
      uint64_t found = 0, errors = 0;
      {
        MutexLock jl(&job->mu);
        for (size_t i = 0; i < results.size() && i < job->keys.size(); ++i) {
          if (results[i].status.ok()) {
            job->found[ti][i] = Job::kPresent;
            if (results[i].bytes) job->found_bytes[i] = results[i].bytes;
            found++;
          } else if (results[i].status.code() == StatusCode::kNotFound) {
            job->found[ti][i] = Job::kAbsent;
          } else {
            errors++;
          }
        }
      }
      {
        MutexLock lock(&t.mu);
        t.st.prefetch_found_objects += found;
        if (errors < results.size()) t.NoteSuccess();  // the back-end answered
        if (errors) {
          t.st.lookup_errors += errors;
          for (const auto& r : results) {
            if (!r.status.ok() && r.status.code() != StatusCode::kNotFound) {
              t.NoteError(r.status.message());
              break;
            }
          }
        }
        for (size_t i = 0; i < results.size() && i < job->keys.size(); ++i) {
          if (results[i].status.ok()) {
            const ChunkSlot slot{job->req.chunks[i / job->ranks], static_cast<uint32_t>(i % job->ranks)};
            t.AccountLocked(job->keys[i], results[i].bytes ? results[i].bytes : job->req.format.object_bytes,
                            &slot);
          }
        }
      }
      if (job->pending.fetch_sub(1) == 1) OnExists(job);
      calls_->End();
    });
  }
}

void Prefetcher::OnExists(const std::shared_ptr<Job>& job) {
  const uint32_t W = job->ranks;
  const uint64_t size = job->req.format.object_bytes;
  const size_t n = job->keys.size();
  job->source.assign(n, Job::kNone);
  job->res.resize(n);
  job->load_status.assign(n, Status::Ok());
  job->load_bytes.assign(n, 0);
  job->staging.resize(n);
  // Plan: the prefix of chunks whose every object is in L1 or some tier.
  size_t planned = 0;
  for (size_t c = 0; c < job->chunks && !job->answered.load(); ++c) {
    bool whole = true;
    for (uint32_t r = 0; r < W && whole; ++r) {
      const size_t i = c * W + r;
      if (l1_->IsResident(job->req.chunks[c], r)) {
        job->source[i] = Job::kInL1;
        continue;
      }
      for (size_t ti = 0; ti < tiers_.size(); ++ti) {
        if (job->found[ti][i] == Job::kPresent) {
          job->source[i] = static_cast<int>(ti);
          break;
        }
      }
      whole = job->source[i] != Job::kNone;
      if (!whole && std::all_of(job->found.begin(), job->found.end(), [i](const auto& per_tier) {
            return per_tier[i] == Job::kAbsent;
          })) {
        job->in_no_tier = c;
      }
    }
    if (!whole) break;
    planned = c + 1;
  }
  // Reserve L1 slots; a chunk that cannot get room ends the prefix.
  for (size_t c = 0; c < planned; ++c) {
    bool ok;
    {
      MutexLock lock(&loading_mu_);
      ok = ReserveChunk(job, c);
    }
    if (!ok) {
      for (size_t i = c * W; i < n; ++i) job->res[i].Abort();
      planned = c;
      break;
    }
  }
  // Timed out while planning: the lookup was answered from L1, so no load is issued.
  if (job->answered.load() && planned > 0) {
    for (auto& r : job->res) r.Abort();
    planned = 0;
  }
  job->planned = planned;
  // One load batch per tier.
  std::vector<std::vector<LoadItem>> items(tiers_.size());
  std::vector<std::vector<size_t>> index(tiers_.size());
  for (size_t i = 0; i < planned * W; ++i) {
    const int ti = job->source[i];
    if (ti < 0) continue;
    TierState& t = *tiers_[ti];
    LoadItem it;
    it.key = job->keys[i];
    if (t.spec.serde->identity()) {
      it.dst = job->res[i].data();
      it.size = size;
    } else {
      job->staging[i].resize(t.spec.serde->MaxStoredBytes(job->req.format.layout));
      it.dst = job->staging[i].data();
      it.size = job->staging[i].size();
      it.size_is_capacity = true;
    }
    items[ti].push_back(std::move(it));
    index[ti].push_back(i);
  }
  int calls = 0;
  for (const auto& v : items) calls += !v.empty();
  if (calls == 0) {
    OnLoaded(job);
    return;
  }
  job->pending.store(calls);
  const int64_t now = options_.clock->NowNanos();
  for (size_t ti = 0; ti < tiers_.size(); ++ti) {
    if (items[ti].empty()) continue;
    TierState& t = *tiers_[ti];
    const size_t count = items[ti].size();
    {
      MutexLock lock(&t.mu);
      t.st.load_requests++;
      t.st.load_objects += count;
      t.st.inflight_load_objects += count;
      for (size_t i : index[ti]) t.BusyLocked(job->keys[i], +1);
    }
    calls_->Begin();
    auto idx = std::make_shared<std::vector<size_t>>(std::move(index[ti]));
    t.spec.tier->Load(std::move(items[ti]), [this, job, idx, &t, now, count](std::vector<ItemResult> results) {
      const int64_t end = options_.clock->NowNanos();
      {
        MutexLock jl(&job->mu);
        for (size_t j = 0; j < idx->size(); ++j) {
          job->load_status[(*idx)[j]] = j < results.size() ? results[j].status : Status::Internal("no answer");
          job->load_bytes[(*idx)[j]] = j < results.size() ? results[j].bytes : 0;
        }
      }
      {
        MutexLock lock(&t.mu);
        t.st.inflight_load_objects -= count;
        t.st.load_completed_requests++;
        t.st.load_seconds += static_cast<double>(end - now) * 1e-9;
        for (size_t j = 0; j < idx->size(); ++j) {
          const size_t i = (*idx)[j];
          t.BusyLocked(job->keys[i], -1);
          const Status& s = j < results.size() ? results[j].status : Status::Internal("no answer");
          if (s.ok()) {
            t.st.loaded_objects++;
            t.st.loaded_bytes += results[j].bytes;
            t.NoteSuccess();
          } else if (s.code() == StatusCode::kNotFound) {
            t.st.load_missing_objects++;
          } else if (s.code() == StatusCode::kInternal) {
            t.st.load_corrupt_objects++;
            t.NoteError(s.message(), /*operational=*/false);
          } else {
            t.st.load_failed_objects++;
            t.NoteError(s.message());
          }
        }
      }
      if (job->pending.fetch_sub(1) == 1) OnLoaded(job);
      calls_->End();
    });
  }
}

bool Prefetcher::ReserveChunk(const std::shared_ptr<Job>& job, size_t c) {
  const uint32_t W = job->ranks;
  const l1::ChunkKey& chunk = job->req.chunks[c];
  bool reserved = false;
  for (uint32_t r = 0; r < W; ++r) {
    const size_t i = c * W + r;
    if (job->source[i] < 0) continue;  // resident when planned
    auto res = l1_->ReserveWrite(chunk, W, r, job->req.format.object_bytes);
    if (res.ok()) {
      job->res[i] = std::move(res).value();
      reserved = true;
      continue;
    }
    if (res.status().code() != StatusCode::kAlreadyExists) return false;  // no room
    if (l1_->IsResident(chunk, r)) {
      job->source[i] = Job::kInL1;
      continue;
    }
    // Another writer has the slot. A prefetch still loading it: wait for its loads. Anyone
    // else (a STORE in progress): the prefix ends here, as it would for its LOOKUP.
    auto it = loading_.find(chunk);
    if (it == loading_.end() || it->second == job.get() || it->second->loads_done) return false;
    Job* owner = it->second;
    job->source[i] = Job::kFollow;
    if (std::find(job->followed.begin(), job->followed.end(), owner) == job->followed.end()) {
      job->followed.push_back(owner);
      owner->followers.push_back(job);
      job->following.fetch_add(1);
    }
  }
  if (reserved && loading_.try_emplace(chunk, job.get()).second) job->loading.push_back(chunk);
  return true;
}

void Prefetcher::OnLoaded(const std::shared_ptr<Job>& job) {
  const uint32_t W = job->ranks;
  bool broken = false;
  std::vector<l1::ChunkKey> committed;
  job->chunk_loaded.assign(job->planned, 0);
  for (size_t c = 0; c < job->planned; ++c) {
    bool ok = !broken;
    for (uint32_t r = 0; r < W && ok; ++r) {
      const size_t i = c * W + r;
      if (job->source[i] < 0) continue;
      ok = job->load_status[i].ok();
      if (ok && !job->staging[i].empty()) {
        const Serde& serde = *tiers_[job->source[i]]->spec.serde;
        const std::span<const uint8_t> stored(job->staging[i].data(),
                                              std::min<uint64_t>(job->load_bytes[i], job->staging[i].size()));
        ok = serde.Decode(stored, job->req.format.layout, {job->res[i].data(), job->res[i].size()}).ok();
      }
    }
    if (!ok) {
      broken = true;
      for (uint32_t r = 0; r < W; ++r) job->res[c * W + r].Abort();
      continue;
    }
    bool any = false;
    for (uint32_t r = 0; r < W; ++r) {
      auto& res = job->res[c * W + r];
      if (res.valid()) {
        any = true;
        if (!res.Commit()) broken = true;
      }
    }
    if (broken) continue;
    if (any) committed.push_back(job->req.chunks[c]);
    job->chunk_loaded[c] = 1;
  }
  job->res.clear();
  job->staging.clear();
  hit_chunks_ += committed.size();
  if (prefetched_ != nullptr) prefetched_->Add(committed);
  // Its chunks are in L1 (or not coming): release the jobs that waited for them.
  std::vector<std::shared_ptr<Job>> followers;
  {
    MutexLock lock(&loading_mu_);
    for (const auto& k : job->loading) {
      auto it = loading_.find(k);
      if (it != loading_.end() && it->second == job.get()) loading_.erase(it);
    }
    job->loading.clear();
    job->loads_done = true;
    followers.swap(job->followers);
  }
  for (auto& f : followers) {
    if (f->following.fetch_sub(1) == 1) Finish(f);
  }
  if (job->following.fetch_sub(1) == 1) Finish(job);
}

void Prefetcher::Finish(const std::shared_ptr<Job>& job) {
  const uint32_t W = job->ranks;
  size_t arrived = 0;
  for (size_t c = 0; c < job->planned; ++c) {
    bool ok = job->chunk_loaded[c] != 0;
    for (uint32_t r = 0; r < W && ok; ++r) {
      if (job->source[c * W + r] == Job::kFollow) ok = l1_->IsResident(job->req.chunks[c], r);
    }
    if (!ok) break;
    arrived = c + 1;
  }
  if (arrived < job->planned) failed_chunks_ += job->planned - arrived;
  Answer(job, {arrived, arrived == job->planned && job->in_no_tier == job->planned});
  JobFinished();
}

void Prefetcher::Close() {
  std::deque<std::shared_ptr<Job>> queued;
  {
    MutexLock lock(&jobs_mu_);
    closed_ = true;
    queued.swap(queued_);
  }
  for (auto& j : queued) Answer(j, {});
}

Prefetcher::Stats Prefetcher::stats() const {
  Stats s;
  s.requests = requests_.load();
  s.hit_chunks = hit_chunks_.load();
  s.failed_chunks = failed_chunks_.load();
  s.timeouts = timeouts_.load();
  MutexLock lock(&jobs_mu_);
  s.active = static_cast<uint64_t>(active_jobs_);
  s.queued = queued_.size();
  return s;
}

}  // namespace kvd::l2
