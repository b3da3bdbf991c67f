// RespTier: connections and cluster routing. Each worker's connections by node (Conn,
// DropConn: a node that cannot be reached is backed off), the slot map (RefreshMap, Route,
// Masters; under map_mu_), Run (one command on the node that owns a key, following MOVED,
// ASK and TRYAGAIN, reconnecting and re-reading the map) and the tier's health (NoteError,
// NoteOk, Health). Called on the worker threads (Health: any thread). Construction, the
// workers, the per-item operations and the Tier interface are in resp_tier.cc.
#include "l2/resp_tier.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "l2/resp_tier_internal.h"

namespace kvd::l2 {
namespace {

using detail::StartsWith;

constexpr int kMaxAttempts = 6;
constexpr int64_t kBackoffMinNs = 200'000'000;
constexpr int64_t kBackoffMaxNs = 5'000'000'000;
constexpr int64_t kMapRefreshMinNs = 100'000'000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void RespTier::NoteError(const std::string& what) {
  last_ok_.store(false);
  MutexLock lock(&health_mu_);
  last_error_ = what;
  last_error_ns_ = NowNs();
}

void RespTier::NoteOk() {
  if (last_ok_.exchange(true)) return;
  MutexLock lock(&health_mu_);
  ever_ok_ = true;
}

TierHealth RespTier::Health() const {
  TierHealth h;
  MutexLock lock(&health_mu_);
  h.healthy = last_ok_.load();
  if (options_.cluster) {
    ReaderMutexLock mlock(&map_mu_);
    if (have_map_) {
      h.detail = std::to_string(map_.masters.size()) + " master(s), " +
                 std::to_string(kClusterSlots - map_.uncovered()) + " slots served";
    } else {
      h.detail = "no slot map yet";
      h.healthy = false;
    }
  } else {
    h.detail = h.healthy ? "connected" : (ever_ok_ ? "disconnected" : "not connected yet");
  }
  if (!last_error_.empty() && NowNs() - last_error_ns_ < 60'000'000'000LL) {
    h.detail += "; last error: " + last_error_;
  }
  return h;
}

Result<RespConnection*> RespTier::Conn(Worker& w, const RespEndpoint& ep) {
  const std::string id = ep.ToString();
  auto it = w.conns.find(id);
  if (it != w.conns.end() && !it->second->broken() && !abandon_.load()) return it->second.get();
  if (it != w.conns.end()) {
    MutexLock wl(&w.mu);
    w.conns.erase(it);
  }
  if (abandon_.load()) return Status::Unavailable(id + ": shutting down (abandoned)");
  const int64_t now = NowNs();
  {
    MutexLock lock(&backoff_mu_);
    auto b = backoff_.find(id);
    if (b != backoff_.end() && now < b->second.until_ns) {
      const Status& why = b->second.last;
      return Status(why.ok() ? Status::Unavailable(id + ": unreachable (retrying)")
                             : why.code() == StatusCode::kFailedPrecondition
                                   ? Status::FailedPrecondition(why.message() + " (retrying)")
                                   : Status::Unavailable(why.message() + " (retrying)"));
    }
  }
  auto c = RespConnection::Connect(ep, options_.connect);
  if (!c.ok()) {
    MutexLock lock(&backoff_mu_);
    Backoff& b = backoff_[id];
    b.step_ns = b.step_ns == 0 ? kBackoffMinNs : std::min(b.step_ns * 2, kBackoffMaxNs);
    b.until_ns = now + b.step_ns;
    b.last = c.status();
    NoteError(c.status().message());
    return c.status();
  }
  {
    MutexLock lock(&backoff_mu_);
    auto b = backoff_.find(id);
    if (b != backoff_.end()) {
      backoff_.erase(b);
      reconnects_++;
      spdlog::info("{}: reconnected to {}", Describe(), id);
    }
  }
  RespConnection* raw = c->get();
  MutexLock wl(&w.mu);
  // Close() sets abandon_ before it takes w.mu to interrupt connections: one made after that
  // is not kept (it would not be interrupted).
  if (abandon_.load()) return Status::Unavailable(id + ": shutting down (abandoned)");
  w.conns[id] = std::move(c).value();
  return raw;
}

void RespTier::DropConn(Worker& w, const RespEndpoint& ep, const Status& why) {
  {
    MutexLock wl(&w.mu);
    w.conns.erase(ep.ToString());
  }
  if (abandon_.load()) return;  // interrupted by Close(): not the server's fault
  NoteError(why.message());
  MutexLock lock(&backoff_mu_);
  Backoff& b = backoff_[ep.ToString()];
  if (b.step_ns == 0) b.until_ns = 0;  // first failure: the next use reconnects at once
}

std::vector<RespEndpoint> RespTier::Masters() {
  if (!options_.cluster) return {options_.seeds[0]};
  ReaderMutexLock lock(&map_mu_);
  return map_.masters;
}

std::optional<RespEndpoint> RespTier::Route(std::string_view key) {
  if (!options_.cluster) return options_.seeds[0];
  ReaderMutexLock lock(&map_mu_);
  if (!have_map_) return std::nullopt;
  const RespEndpoint* m = map_.MasterOf(KeySlot(key));
  if (!m) return std::nullopt;
  return *m;
}

void RespTier::RefreshMap(Worker& w, bool force) {
  if (!options_.cluster) return;
  const int64_t now = NowNs();
  std::vector<RespEndpoint> candidates;
  {
    ReaderMutexLock lock(&map_mu_);
    if (!force && now - map_read_ns_ < kMapRefreshMinNs) return;
    candidates = map_.masters;
  }
  for (const auto& s : options_.seeds) {
    if (std::find(candidates.begin(), candidates.end(), s) == candidates.end()) candidates.push_back(s);
  }
  for (const auto& ep : candidates) {
    auto c = Conn(w, ep);
    if (!c.ok()) continue;
    auto r = (*c)->Command({"CLUSTER", "SLOTS"});
    if (!r.ok()) {
      DropConn(w, ep, r.status());
      continue;
    }
    Result<SlotMap> map = Status::Internal("no reply");
    if (IsError(r->get())) {
      // Servers that dropped CLUSTER SLOTS answer CLUSTER SHARDS.
      auto s = (*c)->Command({"CLUSTER", "SHARDS"});
      if (!s.ok()) {
        DropConn(w, ep, s.status());
        continue;
      }
      if (IsError(s->get())) {
        NoteError(ep.ToString() + ": " + std::string(ReplyString(s->get())));
        continue;
      }
      map = ParseClusterShards(s->get(), ep);
    } else {
      map = ParseClusterSlots(r->get(), ep);
    }
    if (!map.ok() || map->masters.empty()) {
      NoteError(ep.ToString() + ": " + (map.ok() ? "no masters in slot map" : map.status().message()));
      continue;
    }
    map_refreshes_++;
    WriterMutexLock lock(&map_mu_);
    const bool changed = !have_map_ || map_.masters != map->masters || map_.owner != map->owner;
    if (changed && have_map_) {
      spdlog::info("{}: slot map changed: {} master(s), {} slots unserved", Describe(),
                   map->masters.size(), map->uncovered());
    }
    map_ = std::move(map).value();
    have_map_ = true;
    map_read_ns_ = NowNs();
    return;
  }
  WriterMutexLock lock(&map_mu_);
  map_read_ns_ = NowNs();
}

Result<ReplyPtr> RespTier::Run(Worker& w, std::string_view key, const std::vector<RespArg>& args,
                               BulkSink* sink) {
  std::optional<RespEndpoint> target;
  bool asking = false;
  Status last = Status::Unavailable(Describe() + ": no node serves this key");
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    if (abandon_.load()) return Status::Unavailable(Describe() + ": shutting down (abandoned)");
    if (!asking) target = Route(key);
    if (!target) {
      RefreshMap(w, attempt == 0);
      target = Route(key);
      if (!target) {
        if (attempt + 1 < kMaxAttempts) std::this_thread::sleep_for(std::chrono::milliseconds(20 * (attempt + 1)));
        continue;
      }
    }
    auto c = Conn(w, *target);
    if (!c.ok()) {
      last = c.status();
      if (!options_.cluster) return last;  // backed off: answer at once
      // Only worth another try when the slot map now names another master.
      RefreshMap(w, false);
      auto again = Route(key);
      if (asking || !again || *again == *target) return last;
      continue;
    }
    if (asking) {
      auto a = (*c)->Command({"ASKING"});
      if (!a.ok()) {
        DropConn(w, *target, a.status());
        last = a.status();
        asking = false;
        continue;
      }
    }
    auto r = (*c)->Command(args, sink);
    if (!r.ok()) {
      // The connection broke (server restarted, failed over): one fresh try, then re-route.
      DropConn(w, *target, r.status());
      last = r.status();
      asking = false;
      if (options_.cluster) RefreshMap(w, false);
      continue;
    }
    if (IsError(r->get())) {
      std::string_view err = ReplyString(r->get());
      if (auto red = ParseRedirect(err, *target)) {
        redirects_++;
        if (red->ask) {
          target = red->to;
          asking = true;
        } else {
          {
            WriterMutexLock lock(&map_mu_);
            map_.Assign(red->slot, red->to);
          }
          asking = false;
          RefreshMap(w, false);
        }
        continue;
      }
      if (StartsWith(err, "TRYAGAIN") || StartsWith(err, "CLUSTERDOWN") || StartsWith(err, "LOADING")) {
        last = Status::Unavailable(target->ToString() + ": " + std::string(err));
        asking = false;
        std::this_thread::sleep_for(std::chrono::milliseconds(50 * (attempt + 1)));
        RefreshMap(w, false);
        continue;
      }
    }
    NoteOk();
    return r;
  }
  NoteError(last.message());
  return last;
}

}  // namespace kvd::l2
