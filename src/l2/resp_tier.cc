// RespTier: construction, the worker threads and their queue, Close, the per-item operations
// (StoreOne, LoadOne, ExistsBatch, with the checksum kept beside each object) and the Tier
// interface (Store, Load, Exists, Delete, Scan). Connections, cluster routing (Run) and
// health are in resp_tier_routing.cc.
#include "l2/resp_tier.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "codec/crc32c.h"
#include "l2/resp_tier_internal.h"

namespace kvd::l2 {
namespace {

using detail::StartsWith;

constexpr size_t kPipelineBatch = 512;

std::vector<ItemResult> Closed(size_t n) {
  return std::vector<ItemResult>(n, ItemResult{Status::Unavailable("tier is closed"), 0});
}

// The checksum kvd keeps beside an object it wrote (issue 27, finding 4): the value of the
// object's sum key is "kvdsum1 <size> <crc32c hex>", as the fs tier's .kvdsum files; the
// object's value stays byte for byte lmcache's.
constexpr std::string_view kSumSuffix = ".kvdsum";
constexpr const char* kSumMagic = "kvdsum1";

std::string SumLine(const uint8_t* data, uint64_t size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s %llu %08x", kSumMagic, static_cast<unsigned long long>(size),
                codec::Crc32c(data, size));
  return buf;
}

}  // namespace

// The sum key of an object key, in the object's hash slot so that a cluster keeps it on the
// object's node: "<key>.kvdsum" when the key has a hash tag of its own, else
// "{<key>}.kvdsum". A key holding a '}' without a tag cannot share its slot this way; its sum
// key is "<key>.kvdsum" and may live on another node (read all the same).
std::string SumKey(const std::string& key) {
  std::string plain = key + std::string(kSumSuffix);
  if (KeySlot(plain) == KeySlot(key)) return plain;
  std::string tagged = "{" + key + "}" + std::string(kSumSuffix);
  if (KeySlot(tagged) == KeySlot(key)) return tagged;
  return plain;
}

namespace {

}  // namespace

Result<std::unique_ptr<RespTier>> RespTier::Create(const RespTierOptions& options) {
  if (options.seeds.empty()) return Status::InvalidArgument(options.type + ": no server address");
  auto t = std::unique_ptr<RespTier>(new RespTier(options));
  // Probe once in the background: kvd starts whatever the answer, and says what it found.
  RespTier* self = t.get();
  self->Submit(
      [self](Worker& w) {
        if (self->options_.cluster) {
          self->RefreshMap(w, true);
          ReaderMutexLock lock(&self->map_mu_);
          if (self->have_map_) {
            spdlog::info("{}: cluster of {} master(s), {} of {} slots served", self->Describe(),
                         self->map_.masters.size(), kClusterSlots - self->map_.uncovered(), kClusterSlots);
          } else {
            spdlog::warn("{}: no node answered CLUSTER SLOTS yet; retrying on use", self->Describe());
          }
          return;
        }
        auto c = self->Conn(w, self->options_.seeds[0]);
        if (c.ok()) {
          auto r = (*c)->Command({"PING"});
          if (r.ok()) {
            self->NoteOk();
            spdlog::info("{}: connected", self->Describe());
            return;
          }
        }
        spdlog::warn("{}: unreachable at startup ({}); kvd keeps serving from L1 and retries",
                     self->Describe(), c.ok() ? "PING failed" : c.status().message());
      },
      [] {});
  return t;
}

RespTier::RespTier(const RespTierOptions& options) : options_(options) {
  const int n = std::max(1, options.num_workers);
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this, i] {
      std::string name = ("kvd-" + options_.type + std::to_string(i)).substr(0, 15);
      pthread_setname_np(pthread_self(), name.c_str());
      RunWorker();
    });
  }
}

RespTier::~RespTier() { Close(); }

void RespTier::Close() {
  std::deque<Queued> left;
  int running = 0;
  {
    MutexLock lock(&q_mu_);
    if (closed_ && threads_.empty()) return;
    closed_ = true;
    q_cv_.NotifyAll();
    // The grace: queued and running operations may still finish.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(std::max(0.0, options_.close_grace_s));
    while (!queue_.empty() || running_ > 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      idle_cv_.WaitFor(&q_mu_, deadline - now);
    }
    if (!queue_.empty() || running_ > 0) {
      // Abandoned: what is queued answers now, what runs is interrupted and not retried.
      abandon_.store(true);
      left.swap(queue_);
      running = running_;
      for (Worker* w : workers_) {
        MutexLock wl(&w->mu);
        for (auto& [id, c] : w->conns) c->Interrupt();
      }
    }
  }
  if (abandon_.load()) {
    abandoned_ += left.size() + static_cast<uint64_t>(running);
    spdlog::warn("{}: shutdown abandoned {} queued and {} running operation(s) (store-behind "
                 "writes among them): no answer within {} s",
                 Describe(), left.size(), running, options_.close_grace_s);
  }
  for (auto& q : left) q.on_closed();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

std::string RespTier::Describe() const {
  std::string s = options_.type + (options_.cluster ? " cluster " : " ");
  for (size_t i = 0; i < options_.seeds.size(); ++i) {
    s += i ? "," : "";
    s += options_.seeds[i].ToString();
  }
  if (!options_.key_prefix.empty()) s += " prefix '" + options_.key_prefix + "'";
  return s;
}

void RespTier::Submit(Task task, std::function<void()> on_closed) {
  {
    MutexLock lock(&q_mu_);
    if (!closed_) {
      queue_.push_back({std::move(task), std::move(on_closed)});
      q_cv_.NotifyOne();
      return;
    }
  }
  on_closed();
}

void RespTier::RunWorker() {
  Worker w;
  q_mu_.Lock();
  workers_.push_back(&w);
  while (true) {
    while (!closed_ && queue_.empty()) q_cv_.Wait(&q_mu_);
    if (queue_.empty()) break;
    Task task = std::move(queue_.front().task);
    queue_.pop_front();
    running_++;
    q_mu_.Unlock();
    task(w);
    q_mu_.Lock();
    running_--;
    if (closed_) idle_cv_.NotifyAll();
  }
  workers_.erase(std::find(workers_.begin(), workers_.end(), &w));
  q_mu_.Unlock();
  MutexLock wl(&w.mu);
  w.conns.clear();
}

ItemResult RespTier::StoreOne(Worker& w, const StoreItem& item) {
  if (Status st = ValidateObjectKey(item.key); !st.ok()) return {st, 0};
  const std::string key = RespKey(item.key, options_.key_prefix);
  std::string ttl;
  std::vector<RespArg> args = {"SET", key,
                               std::string_view(reinterpret_cast<const char*>(item.data), item.size), "NX"};
  if (options_.ttl_seconds) {
    ttl = std::to_string(*options_.ttl_seconds);
    args.push_back("EX");
    args.push_back(ttl);
  }
  auto r = Run(w, key, args);
  if (!r.ok()) return {r.status(), 0};
  if (IsError(r->get())) {
    std::string_view e = ReplyString(r->get());
    if (StartsWith(e, "OOM")) return {Status::ResourceExhausted(std::string(e)), 0};
    return {Status::Internal(std::string(e)), 0};
  }
  if (IsNil(r->get())) return {Status::Ok(), 0};  // NX: already there
  // Its checksum, best effort: without it the object is read unverified, as lmcache's are.
  const std::string sum_key = SumKey(key);
  const std::string sum = SumLine(item.data, item.size);
  std::vector<RespArg> sum_args = {"SET", sum_key, sum};
  if (options_.ttl_seconds) {
    sum_args.push_back("EX");
    sum_args.push_back(ttl);
  }
  (void)Run(w, sum_key, sum_args);
  return {Status::Ok(), item.size};
}

ItemResult RespTier::LoadOne(Worker& w, const LoadItem& item) {
  if (Status st = ValidateObjectKey(item.key); !st.ok()) return {st, 0};
  const std::string key = RespKey(item.key, options_.key_prefix);
  // The value is read from the socket straight into the destination when it fits there;
  // a longer value is not read at all (RespConnection's BulkSink).
  // The checksum first (a small value; absent for objects lmcache wrote), then the object.
  const std::string sum_key = SumKey(key);
  uint8_t sum_buf[64];
  BulkSink sum_sink{sum_buf, sizeof(sum_buf)};
  auto sum = Run(w, sum_key, {"GET", sum_key}, &sum_sink);
  if (!sum.ok()) return {sum.status(), 0};
  if (sum_sink.too_long) {
    checksum_mismatches_++;
    return {Status::Internal(sum_key + ": a checksum of " + std::to_string(sum_sink.size) +
                             " bytes (malformed; object not served)"), 0};
  }
  std::optional<std::string> want_sum;
  if (sum_sink.filled) {
    want_sum = std::string(reinterpret_cast<const char*>(sum_buf), sum_sink.size);
  } else if (IsError(sum->get())) {
    return {Status::Internal(std::string(ReplyString(sum->get()))), 0};
  } else if (!IsNil(sum->get())) {
    checksum_mismatches_++;
    return {Status::Internal(sum_key + ": not a string (malformed checksum; object not served)"), 0};
  }
  BulkSink sink{item.dst, item.size};
  auto r = Run(w, key, {"GET", key}, &sink);
  if (!r.ok()) return {r.status(), 0};
  const redisReply* rep = r->get();
  if (sink.too_long) {  // not read (issue 27, finding 6): a counted miss
    return {Status::Internal(key + ": a value of " + std::to_string(sink.size) +
                             " bytes, longer than the " + std::to_string(item.size) +
                             " expected (not read)"), 0};
  }
  if (!sink.filled) {
    if (IsError(rep)) return {Status::Internal(std::string(ReplyString(rep))), 0};
    if (IsNil(rep)) return {Status::NotFound(key), 0};
    if (rep->type != REDIS_REPLY_STRING) return {Status::Internal(key + ": not a string value"), 0};
  }
  const uint64_t n = sink.filled ? sink.size : rep->len;
  if (item.size_is_capacity ? n > item.size : n != item.size) {
    return {Status::Internal(key + ": " + std::to_string(n) + " bytes, expected " +
                             std::to_string(item.size) + " (truncated or not this layout)"), 0};
  }
  if (!sink.filled) std::memcpy(item.dst, rep->str, n);
  if (!want_sum) {
    unverified_++;
    return {Status::Ok(), n};
  }
  if (*want_sum != SumLine(item.dst, n)) {
    checksum_mismatches_++;
    return {Status::Internal(key + ": bytes differ from the checksum kvd wrote beside them (" +
                             sum_key + "; overwritten or corrupted; not served)"), 0};
  }
  verified_++;
  return {Status::Ok(), n};
}

std::vector<ItemResult> RespTier::ExistsBatch(Worker& w, const std::vector<ObjectKey>& keys) {
  std::vector<ItemResult> out(keys.size(), ItemResult{Status::Unavailable("not asked"), 0});
  std::vector<std::string> names(keys.size());
  // Group by node; pipeline EXISTS per node; anything odd is retried one by one via Run.
  std::map<std::string, std::pair<RespEndpoint, std::vector<size_t>>> by_node;
  std::vector<size_t> one_by_one;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (Status st = ValidateObjectKey(keys[i]); !st.ok()) {
      out[i] = {st, 0};
      continue;
    }
    names[i] = RespKey(keys[i], options_.key_prefix);
    auto ep = Route(names[i]);
    if (!ep) {
      one_by_one.push_back(i);
      continue;
    }
    auto& slot = by_node[ep->ToString()];
    slot.first = *ep;
    slot.second.push_back(i);
  }
  for (auto& [id, node] : by_node) {
    auto& [ep, idx] = node;
    for (size_t start = 0; start < idx.size(); start += kPipelineBatch) {
      const size_t end = std::min(idx.size(), start + kPipelineBatch);
      auto c = Conn(w, ep);
      if (!c.ok()) {
        // Unreachable: a key goes another way only if the re-read map moved its slot.
        RefreshMap(w, false);
        for (size_t j = start; j < end; ++j) {
          auto again = Route(names[idx[j]]);
          if (options_.cluster && again && !(*again == ep)) one_by_one.push_back(idx[j]);
          else out[idx[j]] = {c.status(), 0};
        }
        continue;
      }
      bool broke = false;
      for (size_t j = start; j < end && !broke; ++j) broke = !(*c)->Append({"EXISTS", names[idx[j]]}).ok();
      for (size_t j = start; j < end; ++j) {
        if (broke) {
          one_by_one.push_back(idx[j]);
          continue;
        }
        auto r = (*c)->GetReply();
        if (!r.ok()) {
          DropConn(w, ep, r.status());
          broke = true;
          one_by_one.push_back(idx[j]);
          continue;
        }
        if (IsError(r->get())) {
          one_by_one.push_back(idx[j]);
          continue;
        }
        NoteOk();
        out[idx[j]] = ReplyInteger(r->get()) > 0 ? ItemResult{Status::Ok(), 0}
                                                 : ItemResult{Status::NotFound(names[idx[j]]), 0};
      }
    }
  }
  for (size_t i : one_by_one) {
    auto r = Run(w, names[i], {"EXISTS", names[i]});
    if (!r.ok()) {
      out[i] = {r.status(), 0};
    } else if (IsError(r->get())) {
      out[i] = {Status::Internal(std::string(ReplyString(r->get()))), 0};
    } else {
      out[i] = ReplyInteger(r->get()) > 0 ? ItemResult{Status::Ok(), 0}
                                          : ItemResult{Status::NotFound(names[i]), 0};
    }
  }
  return out;
}

namespace {
// Spreads items over workers, one task per item; the last finisher answers.
struct Batch {
  std::vector<ItemResult> results;
  std::atomic<size_t> remaining{0};
  Tier::Done done;
  void Finish(size_t i, ItemResult r) {
    results[i] = std::move(r);
    if (remaining.fetch_sub(1) == 1) done(std::move(results));
  }
};
}  // namespace

void RespTier::Store(std::vector<StoreItem> items, Done done) {
  if (items.empty()) {
    done({});
    return;
  }
  auto shared = std::make_shared<std::vector<StoreItem>>(std::move(items));
  auto b = std::make_shared<Batch>();
  b->results.resize(shared->size());
  b->remaining.store(shared->size());
  b->done = std::move(done);
  for (size_t i = 0; i < shared->size(); ++i) {
    Submit([this, shared, b, i](Worker& w) { b->Finish(i, StoreOne(w, (*shared)[i])); },
           [b, i] { b->Finish(i, {Status::Unavailable("tier is closed"), 0}); });
  }
}

void RespTier::Load(std::vector<LoadItem> items, Done done) {
  if (items.empty()) {
    done({});
    return;
  }
  auto shared = std::make_shared<std::vector<LoadItem>>(std::move(items));
  auto b = std::make_shared<Batch>();
  b->results.resize(shared->size());
  b->remaining.store(shared->size());
  b->done = std::move(done);
  for (size_t i = 0; i < shared->size(); ++i) {
    Submit([this, shared, b, i](Worker& w) { b->Finish(i, LoadOne(w, (*shared)[i])); },
           [b, i] { b->Finish(i, {Status::Unavailable("tier is closed"), 0}); });
  }
}

void RespTier::Exists(std::vector<ObjectKey> keys, Done done) {
  if (keys.empty()) {
    done({});
    return;
  }
  const size_t n = keys.size();
  auto shared = std::make_shared<std::vector<ObjectKey>>(std::move(keys));
  Submit([this, shared, done](Worker& w) { done(ExistsBatch(w, *shared)); },
         [done, n] { done(Closed(n)); });
}

void RespTier::Delete(std::vector<ObjectKey> keys, Done done) {
  if (keys.empty()) {
    done({});
    return;
  }
  const size_t n = keys.size();
  auto shared = std::make_shared<std::vector<ObjectKey>>(std::move(keys));
  Submit(
      [this, shared, done](Worker& w) {
        std::vector<ItemResult> out;
        for (const auto& k : *shared) {
          const std::string key = RespKey(k, options_.key_prefix);
          auto len = Run(w, key, {"STRLEN", key});
          if (!len.ok()) {
            out.push_back({len.status(), 0});
            continue;
          }
          auto del = Run(w, key, {"DEL", key});
          const std::string sum_key = SumKey(key);
          (void)Run(w, sum_key, {"DEL", sum_key});  // its checksum, if any
          if (!del.ok()) {
            out.push_back({del.status(), 0});
          } else if (IsError(del->get())) {
            out.push_back({Status::Internal(std::string(ReplyString(del->get()))), 0});
          } else {
            out.push_back({Status::Ok(), ReplyInteger(del->get()) > 0
                                             ? static_cast<uint64_t>(ReplyInteger(len->get()))
                                             : 0});
          }
        }
        done(std::move(out));
      },
      [done, n] { done(Closed(n)); });
}

void RespTier::Scan(ScanDone done) {
  Submit(
      [this, done](Worker& w) {
        RefreshMap(w, false);
        const std::string pattern = options_.key_prefix.empty() ? "*@*" : options_.key_prefix + "@*";
        std::vector<ScannedObject> out;
        for (const auto& ep : Masters()) {
          auto c = Conn(w, ep);
          if (!c.ok()) {
            done(c.status());
            return;
          }
          std::string cursor = "0";
          do {
            auto r = (*c)->Command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
            if (!r.ok() || IsError(r->get()) || (*r)->type != REDIS_REPLY_ARRAY || (*r)->elements != 2) {
              done(r.ok() ? Status::Internal(ep.ToString() + ": bad SCAN reply") : r.status());
              return;
            }
            cursor = std::string(ReplyString((*r)->element[0]));
            const redisReply* ks = (*r)->element[1];
            std::vector<std::pair<std::string, ObjectKey>> found;
            for (size_t i = 0; i < ks->elements; ++i) {
              std::string name(ReplyString(ks->element[i]));
              if (name.size() >= kSumSuffix.size() &&
                  name.compare(name.size() - kSumSuffix.size(), kSumSuffix.size(), kSumSuffix) == 0) {
                continue;  // a checksum, not an object
              }
              if (auto k = ParseRespKey(name, options_.key_prefix)) found.emplace_back(name, std::move(*k));
            }
            for (const auto& f : found) {
              if (!(*c)->Append({"STRLEN", f.first}).ok()) break;
            }
            for (auto& f : found) {
              auto len = (*c)->GetReply();
              if (!len.ok()) {
                DropConn(w, ep, len.status());
                done(len.status());
                return;
              }
              if (!IsError(len->get()) && ReplyInteger(len->get()) > 0) {
                out.push_back({std::move(f.second), static_cast<uint64_t>(ReplyInteger(len->get())), 0});
              }
            }
          } while (cursor != "0");
        }
        done(std::move(out));
      },
      [done] { done(Status::Unavailable("tier is closed")); });
}

}  // namespace kvd::l2
