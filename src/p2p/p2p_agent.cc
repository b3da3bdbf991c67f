#include "p2p/p2p_agent.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

namespace kvd::p2p {

namespace {

// "host:port" (the host may be a bracketed IPv6 literal).
Result<std::pair<std::string, int>> SplitUrl(const std::string& url) {
  const size_t colon = url.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == url.size()) {
    return Status::InvalidArgument("p2p: peer address '" + url + "' is not host:port");
  }
  std::string host = url.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  const char* first = url.data() + colon + 1;
  const char* last = url.data() + url.size();
  auto [ptr, ec] = std::from_chars(first, last, port);
  if (ec != std::errc() || ptr != last || port <= 0 || port > 65535) {
    return Status::InvalidArgument("p2p: peer address '" + url + "' has no valid port");
  }
  return std::make_pair(host, port);
}

}  // namespace

P2pAgent::P2pAgent(Options options) : options_(std::move(options)), self_(options_.self) {}

Result<std::unique_ptr<P2pAgent>> P2pAgent::Start(Options options) {
  if (options.flush_interval_s <= 0 || options.flush_interval_s > 60 || options.max_queued_updates == 0) {
    return Status::InvalidArgument("p2p: flush interval must be in (0, 60] s and the queue non-empty");
  }
  std::unique_ptr<P2pAgent> agent(new P2pAgent(std::move(options)));
  std::promise<Status> started;
  auto ready = started.get_future();
  agent->ucx_thread_ = std::thread([a = agent.get(), &started] { a->RunUcx(&started); });
  Status st = ready.get();
  if (st.ok()) {
    if (agent->self_.url.empty()) {
      agent->self_.url = agent->options_.ucx.listen_host + ":" + std::to_string(agent->node_->listen_port());
    }
    auto directory = FleetDirectory::Connect(agent->options_.directory, agent->self_);
    if (directory.ok()) {
      agent->directory_ = std::move(*directory);
      st = agent->directory_->Heartbeat();
    } else {
      st = directory.status();
    }
  }
  if (!st.ok()) {
    {
      MutexLock lock(&agent->mu_);
      agent->stop_ = true;
    }
    agent->ucx_thread_.join();
    return st;
  }
  agent->directory_thread_ = std::thread([a = agent.get()] { a->RunDirectory(); });
  return agent;
}

P2pAgent::~P2pAgent() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  ucx_wake_.NotifyAll();
  directory_wake_.NotifyAll();
  if (directory_thread_.joinable()) directory_thread_.join();
  if (ucx_thread_.joinable()) ucx_thread_.join();
}

void P2pAgent::RunUcx(std::promise<Status>* started) {
  {
    auto node = UcxNode::Create(options_.ucx);
    if (!node.ok()) {
      started->set_value(node.status());
      return;
    }
    node_ = std::move(*node);
  }
  started->set_value(Status::Ok());
  for (;;) {
    std::deque<std::pair<uint64_t, std::function<void()>>> jobs;
    {
      MutexLock lock(&mu_);
      if (stop_) break;
      jobs.swap(jobs_);
    }
    for (auto& job : jobs) job.second();
    if (!jobs.empty()) done_.NotifyAll();
    // Serves peers meanwhile; a queued job waits at most about this long.
    node_->ProgressFor(std::chrono::milliseconds(1));
    if (node_->refused_asks() != stats_refused_ || node_->accepted_peers() != stats_accepted_) {
      stats_refused_ = node_->refused_asks();
      stats_accepted_ = node_->accepted_peers();
      MutexLock lock(&mu_);
      stats_.refused_asks = stats_refused_;
      stats_.accepted_peers = stats_accepted_;
    }
  }
  // Jobs still queued are dropped: their callers answer Unavailable (see OnUcxThread).
  peers_.clear();
  regions_.clear();
  node_.reset();
  done_.NotifyAll();
}

Status P2pAgent::OnUcxThread(std::function<void()> job) {
  bool finished = false;
  MutexLock lock(&mu_);
  if (stop_) return Status::Unavailable("p2p: the agent is stopping");
  const uint64_t id = ++next_job_;
  jobs_.emplace_back(id, [&job, &finished, this] {
    job();
    MutexLock done(&mu_);
    finished = true;
  });
  while (!finished) {
    if (stop_) {
      // Still queued: withdrawn, never run. Taken: the UCX thread runs every job it took
      // before it looks at stop_ again, so this one finishes.
      auto it = std::find_if(jobs_.begin(), jobs_.end(), [id](const auto& j) { return j.first == id; });
      if (it != jobs_.end()) {
        jobs_.erase(it);
        return Status::Unavailable("p2p: the agent is stopping");
      }
    }
    done_.WaitFor(&mu_, std::chrono::milliseconds(100));
  }
  return Status::Ok();
}

Status P2pAgent::RegisterMemory(void* base, size_t length) {
  Status result;
  Status st = OnUcxThread([&] {
    auto region = node_->Register(base, length);
    if (!region.ok()) {
      result = region.status();
      return;
    }
    regions_.push_back(std::move(*region));
  });
  return st.ok() ? result : st;
}

Status P2pAgent::Leave() {
  {
    MutexLock lock(&mu_);
    left_ = true;
  }
  directory_wake_.NotifyAll();
  // No heartbeat may follow the Leave (it would bring the node key back for a TTL).
  if (directory_thread_.joinable()) directory_thread_.join();
  return directory_->Leave();
}

Status P2pAgent::Forget(const std::string& key, const FleetDirectory::Owner& owner) {
  return directory_->Forget(key, owner);
}

ReadAnswer P2pAgent::Read(const std::string& url, std::vector<ReadItem> items, Deadline deadline) {
  ReadAnswer answer;
  auto where = SplitUrl(url);
  if (!where.ok()) {
    answer.first_error = where.status();
    return answer;
  }
  uint64_t bytes = 0;
  Status st = OnUcxThread([&] {
    if (std::chrono::steady_clock::now() >= deadline) {
      // Started too late: answered without touching the peer (a read cancelled at its deadline
      // would cost the connection).
      answer.first_error = Status::Unavailable("p2p: the read's deadline passed before it started");
      return;
    }
    std::unique_ptr<UcxPeer>& peer = peers_[url];
    if (peer == nullptr || peer->broken()) {
      peer.reset();
      auto made = node_->Connect(where->first, where->second);
      if (!made.ok()) {
        answer.first_error = made.status();
        peers_.erase(url);
        return;
      }
      peer = std::move(*made);
    }
    answer = peer->Read(items, deadline);
    for (size_t i = 0; i < answer.completed_prefix; ++i) bytes += items[i].length;
  });
  if (!st.ok()) answer = ReadAnswer{.completed_prefix = 0, .first_error = st};
  MutexLock lock(&mu_);
  ++stats_.reads;
  stats_.bytes_read += bytes;
  if (answer.completed_prefix != items.size()) ++stats_.read_failures;
  return answer;
}

Result<std::vector<std::vector<FleetDirectory::Owner>>> P2pAgent::Lookup(const std::vector<std::string>& keys) {
  return directory_->Lookup(keys);
}

void P2pAgent::Publish(std::vector<std::string> keys) { Queue(/*publish=*/true, std::move(keys)); }

void P2pAgent::Withdraw(std::vector<std::string> keys) { Queue(/*publish=*/false, std::move(keys)); }

void P2pAgent::Queue(bool publish, std::vector<std::string> keys) {
  MutexLock lock(&mu_);
  for (auto& k : keys) {
    if (updates_.size() >= options_.max_queued_updates) {
      ++stats_.updates_dropped;
      continue;
    }
    updates_.push_back({publish, std::move(k)});
    ++stats_.updates_queued;
  }
}

Status P2pAgent::Flush() {
  MutexLock lock(&mu_);
  const uint64_t ticket = ++flush_asked_;
  directory_wake_.NotifyAll();
  while (flush_done_ < ticket && !stop_ && !left_) done_.WaitFor(&mu_, std::chrono::milliseconds(100));
  if (flush_done_ < ticket) return Status::Unavailable("p2p: the agent is stopping or left the directory");
  return last_flush_;
}

size_t P2pAgent::SendUpdates(const std::vector<Update>& batch, Status& status) {
  size_t sent = 0;
  const size_t max = options_.directory.max_batch;
  while (sent < batch.size()) {
    // The longest run of one kind from `sent`, at most max_batch keys.
    const bool publish = batch[sent].publish;
    std::vector<std::string> keys;
    size_t end = sent;
    while (end < batch.size() && batch[end].publish == publish && keys.size() < max) {
      keys.push_back(batch[end].key);
      ++end;
    }
    status = publish ? directory_->Publish(keys) : directory_->Withdraw(keys);
    if (!status.ok()) return sent;
    sent = end;
  }
  return sent;
}

void P2pAgent::RunDirectory() {
  using Clock = std::chrono::steady_clock;
  const auto heartbeat_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.directory.node_ttl_s / 3));
  const auto flush_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.flush_interval_s));
  auto next_heartbeat = Clock::now() + heartbeat_every;
  std::vector<Update> batch;  // taken from updates_, sent in order; kept when a send fails
  for (;;) {
    uint64_t ticket = 0;
    {
      MutexLock lock(&mu_);
      if (stop_ || left_) return;
      if (flush_asked_ == flush_done_) directory_wake_.WaitFor(&mu_, flush_every);
      if (stop_ || left_) return;
      ticket = flush_asked_;
      for (auto& u : updates_) batch.push_back(std::move(u));
      updates_.clear();
    }
    Status heartbeat;
    if (Clock::now() >= next_heartbeat) {
      heartbeat = directory_->Heartbeat();
      next_heartbeat = Clock::now() + heartbeat_every;
    }
    Status status;
    size_t sent = batch.empty() ? 0 : SendUpdates(batch, status);
    batch.erase(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(sent));
    if (!status.ok() || !heartbeat.ok()) {
      spdlog::warn("p2p: the fleet directory failed ({}); {} updates wait for the next try",
                   (!status.ok() ? status : heartbeat).ToString(), batch.size());
    }
    {
      MutexLock lock(&mu_);
      stats_.updates_sent += sent;
      if (!status.ok()) ++stats_.directory_failures;
      if (!heartbeat.ok()) ++stats_.directory_failures;
      last_flush_ = !status.ok() ? status : heartbeat;
      flush_done_ = ticket;
    }
    done_.NotifyAll();
    if (!status.ok()) {
      // The directory is down: wait a flush interval before the next try (not a busy loop).
      MutexLock lock(&mu_);
      if (!stop_ && !left_) directory_wake_.WaitFor(&mu_, flush_every);
    }
  }
}

P2pAgent::Stats P2pAgent::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvd::p2p
