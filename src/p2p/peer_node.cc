#include "p2p/peer_node.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_map>
#include <vector>

#include "l2/worker_pool.h"

namespace kvd::p2p {
namespace {

using Clock = std::chrono::steady_clock;

Deadline After(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// A read's error as a tier answers it: NotFound stays a miss; the rest are the peer's failure.
Status AsTierError(const Status& s) {
  if (s.code() == StatusCode::kNotFound) return s;
  return Status::Unavailable(s.message());
}

}  // namespace

std::string ChunkDirectoryKey(const std::string& l1_model, int32_t world_size,
                              const std::string& cache_salt, const std::array<uint8_t, 32>& hash) {
  // Salts hold no '@'; the model goes last because a key namespace may add one.
  std::string key = l2::HashHex(hash);
  key += '@';
  key += std::to_string(world_size);
  key += '@';
  key += cache_salt;
  key += '@';
  key += l1_model;
  return key;
}

// The tier half (see LOAD in the header). Calls run on its workers; once closed, every call
// answers Unavailable inline without touching the node.
class PeerNode::PeerTier : public l2::Tier {
 public:
  PeerTier(PeerNode* node, int threads) : node_(node), pool_(threads, "kvd-p2p-tier") {}
  ~PeerTier() override { Close(); }

  std::string_view type() const override { return "p2p"; }
  std::string Describe() const override {
    return "p2p peers of node " + node_->self().url + " (directory " +
           node_->options_.agent.directory.endpoint.host + ":" +
           std::to_string(node_->options_.agent.directory.endpoint.port) + ")";
  }
  bool stores() const override { return false; }

  void Store(std::vector<l2::StoreItem> items, Done done) override {
    Answer(items.size(), Status::FailedPrecondition("the p2p tier does not store"), std::move(done));
  }
  void Delete(std::vector<l2::ObjectKey> keys, Done done) override {
    Answer(keys.size(), Status::Ok(), std::move(done));  // nothing of this node's is in it
  }
  void Exists(std::vector<l2::ObjectKey> keys, Done done) override {
    auto shared = std::make_shared<std::vector<l2::ObjectKey>>(std::move(keys));
    Run([this, shared, done] { done(node_->ExistsNow(*shared)); },
        [shared, done] { done(Unavailable(shared->size())); });
  }
  void Load(std::vector<l2::LoadItem> items, Done done) override {
    auto shared = std::make_shared<std::vector<l2::LoadItem>>(std::move(items));
    Run([this, shared, done] { done(node_->LoadNow(*shared)); },
        [shared, done] { done(Unavailable(shared->size())); });
  }
  void Scan(ScanDone done) override {
    Run([done] { done(std::vector<l2::ScannedObject>{}); },
        [done] { done(Status::Unavailable("the p2p tier is closed")); });
  }
  l2::TierHealth Health() const override {
    const auto s = node_->stats().agent;
    l2::TierHealth h;
    h.detail = "node " + node_->self().url + ", " + std::to_string(s.directory_failures) +
               " directory failures, " + std::to_string(s.reads) + " reads";
    return h;
  }
  void Close() override { pool_.Close(); }

 private:
  static std::vector<l2::ItemResult> Unavailable(size_t n) {
    return std::vector<l2::ItemResult>(n, l2::ItemResult{Status::Unavailable("the p2p tier is closed"), 0});
  }
  void Answer(size_t n, Status status, Done done) {
    Run([n, status, done] { done(std::vector<l2::ItemResult>(n, l2::ItemResult{status, 0})); },
        [n, done] { done(Unavailable(n)); });
  }
  // Runs `job` on a worker, or `closed` inline when the pool no longer takes work.
  template <typename Job, typename Closed>
  void Run(Job job, Closed closed) {
    if (!pool_.Submit(std::move(job))) closed();
  }

  PeerNode* const node_;
  l2::WorkerPool pool_;
};

Result<std::unique_ptr<PeerNode>> PeerNode::Start(Options options) {
  if (!(options.lookup_timeout_s > 0) || !(options.load_timeout_s > 0)) {
    return Status::InvalidArgument("p2p: lookup and load timeouts must be > 0");
  }
  if (options.tier_threads < 1 || options.tier_threads > 64) {
    return Status::InvalidArgument("p2p: tier_threads must be 1..64");
  }
  std::unique_ptr<PeerNode> node(new PeerNode(std::move(options)));
  P2pAgent::Options agent_options = node->options_.agent;
  PeerNode* raw = node.get();
  agent_options.ucx.serve = [raw](uint64_t, const ServeAsk& ask) { return raw->Serve(ask); };
  auto agent = P2pAgent::Start(std::move(agent_options));
  if (!agent.ok()) return agent.status();
  node->agent_ = std::move(agent).value();
  node->self_ = node->agent_->self();
  node->tier_ = std::make_shared<PeerTier>(raw, node->options_.tier_threads);
  return node;
}

PeerNode::~PeerNode() { Detach(); }

std::shared_ptr<l2::Tier> PeerNode::tier() const { return tier_; }

Status PeerNode::Attach(l1::L1Cache* l1) {
  if (l1 == nullptr) return Status::InvalidArgument("p2p: no L1 cache");
  if (!agent_ || l1_.load() != nullptr) return Status::FailedPrecondition("p2p: already attached");
  KVD_RETURN_IF_ERROR(agent_->RegisterMemory(l1->base(), l1->capacity_bytes()));
  l1_.store(l1);
  MutexLock lock(&listen_mu_);
  publishing_ = true;
  return Status::Ok();
}

void PeerNode::Detach() {
  {
    MutexLock lock(&listen_mu_);
    publishing_ = false;
  }
  if (tier_) tier_->Close();  // runs the calls still queued, then answers Unavailable inline
  std::unique_ptr<P2pAgent> agent;
  {
    MutexLock lock(&listen_mu_);
    if (!agent_) return;
    // This node's entries die now, rather than when its heartbeat expires (one round trip
    // after the directory thread stopped; a directory that is down costs at most its
    // timeouts, and the entries then expire).
    if (Status st = agent_->Leave(); !st.ok()) spdlog::warn("p2p: leaving the directory: {}", st.message());
    last_agent_stats_ = agent_->stats();
    agent = std::move(agent_);
  }
  // Joins its threads outside listen_mu_ (Serve takes L1 mutexes, under which listener calls
  // wait for listen_mu_): Serve runs no more and every pin it held is gone.
  agent.reset();
  l1_.store(nullptr);
}

Status PeerNode::Flush() {
  if (!agent_) return Status::Unavailable("p2p: detached");
  return agent_->Flush();
}

void PeerNode::AddFormat(const std::string& model, const std::string& layout_tag,
                         std::string l1_model, uint64_t object_bytes) {
  MutexLock lock(&mu_);
  auto [it, added] = formats_.try_emplace({model, layout_tag}, Format{std::move(l1_model), object_bytes});
  if (added) {
    spdlog::info("p2p: serving and loading {} objects of {} bytes{}", model, object_bytes,
                 layout_tag.empty() ? "" : " (layout " + layout_tag + ")");
  }
}

std::optional<PeerNode::Format> PeerNode::FindFormat(const std::string& model,
                                                     const std::string& tag) const {
  MutexLock lock(&mu_);
  auto it = formats_.find({model, tag});
  if (it == formats_.end()) return std::nullopt;
  return it->second;
}

namespace {
// World size and rank of a kv_rank written by l2::KvRank; nullopt for anything else.
std::optional<std::pair<uint32_t, uint32_t>> WorldAndRank(uint32_t kv_rank) {
  const uint32_t world = kv_rank >> 24;
  const uint32_t rank = (kv_rank >> 16) & 0xff;
  if (world == 0 || rank >= world || l2::KvRank(world, rank) != kv_rank) return std::nullopt;
  return std::make_pair(world, rank);
}
}  // namespace

std::optional<std::string> PeerNode::DirectoryKeyOf(const l2::ObjectKey& key) const {
  const auto format = FindFormat(key.model_name, key.layout_tag);
  const auto wr = WorldAndRank(key.kv_rank);
  if (!format || !wr) return std::nullopt;
  return ChunkDirectoryKey(format->l1_model, static_cast<int32_t>(wr->first), key.cache_salt,
                           key.chunk_hash);
}

std::string PeerNode::DirectoryKeyOf(const l1::ChunkKey& key) const {
  const auto& info = l1_.load()->namespaces().Get(key.ns);
  return ChunkDirectoryKey(info.model_name, info.world_size, info.cache_salt, key.chunk_hash);
}

void PeerNode::OnEntryComplete(const l1::ChunkKey& key) {
  MutexLock lock(&listen_mu_);
  if (!publishing_) return;
  agent_->Publish({DirectoryKeyOf(key)});
  published_.fetch_add(1, std::memory_order_relaxed);
}

void PeerNode::OnEntriesRemoved(std::span<const l1::ChunkKey> keys, l1::RemovalCause) {
  if (keys.empty()) return;
  MutexLock lock(&listen_mu_);
  if (!publishing_) return;
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(DirectoryKeyOf(k));
  agent_->Withdraw(std::move(out));
  withdrawn_.fetch_add(keys.size(), std::memory_order_relaxed);
}

Result<ServedBytes> PeerNode::Serve(const ServeAsk& ask) {
  auto refuse = [this](Status s) -> Result<ServedBytes> {
    MutexLock lock(&mu_);
    stats_.serve_refusals++;
    return s;
  };
  const auto key = l2::ParseRespKey(ask.name);
  if (!key || !l2::ValidateObjectKey(*key).ok()) {
    return refuse(Status::InvalidArgument("p2p: not an object name"));
  }
  const auto format = FindFormat(key->model_name, key->layout_tag);
  const auto wr = WorldAndRank(key->kv_rank);
  // NotFound means "not in this node's L1" only: a reader then tells the directory (Forget).
  if (!format || !wr) return refuse(Status::InvalidArgument("p2p: no such format here"));
  if (ask.offset != 0 || ask.length != format->object_bytes) {
    return refuse(Status::InvalidArgument("p2p: only whole objects are served"));
  }
  l1::L1Cache* l1 = l1_.load();
  if (l1 == nullptr) return refuse(Status::Unavailable("p2p: not serving"));
  const auto ns = l1->namespaces().Find(format->l1_model, static_cast<int32_t>(wr->first),
                                        key->cache_salt);
  if (!ns) return refuse(Status::NotFound("p2p: not in L1"));
  auto pin = l1->PinForRead(l1::ChunkKey{*ns, key->chunk_hash}, wr->second);
  if (!pin.ok()) return refuse(Status::NotFound("p2p: not in L1"));
  if (pin->size() != ask.length) return refuse(Status::InvalidArgument("p2p: object of another size"));
  auto hold = std::make_shared<l1::ReadPin>(std::move(pin).value());
  ServedBytes out{hold->data(), hold->size(), hold};
  MutexLock lock(&mu_);
  stats_.served_objects++;
  stats_.served_bytes += out.length;
  return out;
}

Result<std::vector<std::vector<FleetDirectory::Owner>>> PeerNode::LookupOwners(
    const std::vector<std::string>& keys) {
  auto owners = agent_->Lookup(keys);
  MutexLock lock(&mu_);
  stats_.lookups++;
  stats_.lookup_keys += keys.size();
  if (!owners.ok()) stats_.lookup_failures++;
  return owners;
}

std::vector<l2::ItemResult> PeerNode::ExistsNow(const std::vector<l2::ObjectKey>& keys) {
  std::vector<l2::ItemResult> out(keys.size(), l2::ItemResult{Status::NotFound("not in a peer"), 0});
  std::vector<std::string> unique;
  std::unordered_map<std::string, size_t> position;
  std::vector<std::optional<size_t>> key_at(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto dk = DirectoryKeyOf(keys[i]);
    if (!dk) continue;  // a format this node does not know: never loaded from a peer
    auto [it, added] = position.try_emplace(*dk, unique.size());
    if (added) unique.push_back(std::move(*dk));
    key_at[i] = it->second;
  }
  if (unique.empty()) return out;
  auto owners = LookupOwners(unique);
  if (!owners.ok()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (key_at[i]) out[i].status = Status::Unavailable("p2p directory: " + owners.status().message());
    }
    return out;
  }
  uint64_t hits = 0;
  {
    const auto now = Clock::now();
    MutexLock lock(&owners_mu_);
    if (owners_.size() + unique.size() > kMaxCachedOwners) owners_.clear();
    for (size_t u = 0; u < unique.size(); ++u) {
      if ((*owners)[u].empty()) continue;
      ++hits;
      owners_[unique[u]] = SeenOwners{(*owners)[u], now};
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (key_at[i] && !(*owners)[*key_at[i]].empty()) out[i] = l2::ItemResult{Status::Ok(), 0};
  }
  MutexLock lock(&mu_);
  stats_.lookup_hits += hits;
  return out;
}

std::vector<l2::ItemResult> PeerNode::LoadNow(const std::vector<l2::LoadItem>& items) {
  std::vector<l2::ItemResult> out(items.size(), l2::ItemResult{Status::NotFound("not in a peer"), 0});
  // Each item's chunk and the owner to read it from: owners the last Exists saw, else one
  // directory round trip for the rest.
  std::vector<std::optional<std::string>> dkey(items.size());
  std::unordered_map<std::string, FleetDirectory::Owner> owner_of;  // directory key -> owner
  std::vector<std::string> missing;
  {
    const auto now = Clock::now();
    MutexLock lock(&owners_mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      dkey[i] = DirectoryKeyOf(items[i].key);
      if (!dkey[i] || owner_of.count(*dkey[i])) continue;
      auto it = owners_.find(*dkey[i]);
      if (it != owners_.end() && !it->second.owners.empty() && now - it->second.seen < kOwnersFresh) {
        owner_of[*dkey[i]] = it->second.owners.front();
      } else if (std::find(missing.begin(), missing.end(), *dkey[i]) == missing.end()) {
        missing.push_back(*dkey[i]);
      }
    }
  }
  if (!missing.empty()) {
    auto owners = LookupOwners(missing);
    for (size_t u = 0; owners.ok() && u < missing.size(); ++u) {
      if (!(*owners)[u].empty()) owner_of[missing[u]] = (*owners)[u].front();
    }
  }
  // One read per owner, in item order.
  std::map<std::string, std::vector<size_t>> by_url;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!dkey[i]) continue;
    auto it = owner_of.find(*dkey[i]);
    if (it != owner_of.end()) by_url[it->second.url].push_back(i);
  }
  uint64_t forgotten = 0;
  uint64_t loaded = 0, bytes = 0;
  const auto t0 = Clock::now();
  for (const auto& [url, index] : by_url) {
    std::vector<ReadItem> reads;
    reads.reserve(index.size());
    for (size_t i : index) {
      ReadItem r;
      r.name = l2::RespKey(items[i].key);
      r.length = items[i].size;
      r.dst = items[i].dst;
      reads.push_back(std::move(r));
    }
    const ReadAnswer answer = agent_->Read(url, std::move(reads), After(options_.load_timeout_s));
    for (size_t j = 0; j < index.size(); ++j) {
      auto& r = out[index[j]];
      if (j < answer.completed_prefix) {
        r = l2::ItemResult{Status::Ok(), items[index[j]].size};
        ++loaded;
        bytes += items[index[j]].size;
      } else if (j == answer.completed_prefix) {
        r.status = AsTierError(answer.first_error);
      } else {
        r.status = Status::Unavailable("p2p: an earlier object of the read failed");
      }
    }
    if (answer.completed_prefix < index.size()) {
      // The owner did not have it (or failed): forget it, so the next lookup asks again.
      {
        MutexLock lock(&owners_mu_);
        for (size_t j = answer.completed_prefix; j < index.size(); ++j) owners_.erase(*dkey[index[j]]);
      }
      // It answered that the chunk is not in its L1: its entry is stale (a lost withdrawal).
      // One failed probe, and the fleet's other readers do not meet it again.
      if (answer.first_error.code() == StatusCode::kNotFound) {
        const std::string& stale = *dkey[index[answer.completed_prefix]];
        if (agent_->Forget(stale, owner_of[stale]).ok()) ++forgotten;
      }
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (options_.on_loaded && loaded > 0) options_.on_loaded(WholeChunks(items, out));
  MutexLock lock(&mu_);
  stats_.load_objects += items.size();
  stats_.loaded_objects += loaded;
  stats_.loaded_bytes += bytes;
  stats_.load_misses += items.size() - loaded;
  stats_.stale_entries_forgotten += forgotten;
  if (!by_url.empty()) stats_.load_seconds += secs;
  return out;
}

void PeerNode::RegisterMetrics(metrics::Registry& registry) {
  using metrics::Kind;
  static constexpr metrics::StatsFamily<Stats> kFamilies[] = {
      {"kvd_p2p_published_chunks_total", Kind::kCounter,
       "Chunks completed in L1 and queued for the fleet directory.",
       [](const Stats& s) { return static_cast<double>(s.published); }},
      {"kvd_p2p_withdrawn_chunks_total", Kind::kCounter,
       "Chunks that left L1, queued for withdrawal from the fleet directory.",
       [](const Stats& s) { return static_cast<double>(s.withdrawn); }},
      {"kvd_p2p_directory_updates_dropped_total", Kind::kCounter,
       "Directory updates dropped because the queue was full (the directory was down).",
       [](const Stats& s) { return static_cast<double>(s.agent.updates_dropped); }},
      {"kvd_p2p_directory_failures_total", Kind::kCounter,
       "Heartbeats and update batches the fleet directory did not take.",
       [](const Stats& s) { return static_cast<double>(s.agent.directory_failures); }},
      {"kvd_p2p_lookups_total", Kind::kCounter, "Directory lookups for chunks beyond L1 and the tiers.",
       [](const Stats& s) { return static_cast<double>(s.lookups); }},
      {"kvd_p2p_lookup_failures_total", Kind::kCounter,
       "Directory lookups that failed (the directory down or late): no peer was asked.",
       [](const Stats& s) { return static_cast<double>(s.lookup_failures); }},
      {"kvd_p2p_lookup_chunks_total", Kind::kCounter, "Chunks asked of the directory.",
       [](const Stats& s) { return static_cast<double>(s.lookup_keys); }},
      {"kvd_p2p_lookup_hit_chunks_total", Kind::kCounter, "Chunks the directory said a live peer holds.",
       [](const Stats& s) { return static_cast<double>(s.lookup_hits); }},
      {"kvd_p2p_loaded_objects_total", Kind::kCounter, "Objects read whole from peers into L1.",
       [](const Stats& s) { return static_cast<double>(s.loaded_objects); }},
      {"kvd_p2p_loaded_bytes_total", Kind::kCounter, "Bytes read from peers into L1.",
       [](const Stats& s) { return static_cast<double>(s.loaded_bytes); }},
      {"kvd_p2p_load_misses_total", Kind::kCounter,
       "Objects asked of peers that did not arrive (gone, refused, failed or late): misses.",
       [](const Stats& s) { return static_cast<double>(s.load_misses); }},
      {"kvd_p2p_load_seconds_total", Kind::kCounter, "Summed duration of reads from peers.",
       [](const Stats& s) { return s.load_seconds; }},
      {"kvd_p2p_stale_entries_forgotten_total", Kind::kCounter,
       "Directory entries removed because their owner answered the chunk was not in its L1.",
       [](const Stats& s) { return static_cast<double>(s.stale_entries_forgotten); }},
      {"kvd_p2p_served_objects_total", Kind::kCounter, "Objects this node sent to peers.",
       [](const Stats& s) { return static_cast<double>(s.served_objects); }},
      {"kvd_p2p_served_bytes_total", Kind::kCounter, "Bytes this node sent to peers.",
       [](const Stats& s) { return static_cast<double>(s.served_bytes); }},
      {"kvd_p2p_serve_refusals_total", Kind::kCounter,
       "Peers' asks refused: not an object of a format registered here, not whole, or not in L1.",
       [](const Stats& s) { return static_cast<double>(s.serve_refusals); }},
      {"kvd_p2p_unauthenticated_asks_total", Kind::kCounter,
       "Peers' asks without the fleet's shared secret (answered refused, nothing read).",
       [](const Stats& s) { return static_cast<double>(s.agent.refused_asks); }},
      {"kvd_p2p_connected_peers", Kind::kGauge, "Connections peers hold to this node's P2P listener.",
       [](const Stats& s) { return static_cast<double>(s.agent.accepted_peers); }},
  };
  metric_handles_ = metrics::AddStatsFamilies(registry, kFamilies, [this] { return stats(); });
}

std::vector<l1::ChunkKey> PeerNode::WholeChunks(const std::vector<l2::LoadItem>& items,
                                                const std::vector<l2::ItemResult>& results) const {
  l1::L1Cache* l1 = l1_.load();
  std::vector<l1::ChunkKey> out;
  if (l1 == nullptr) return out;
  // Objects that arrived, per chunk; a chunk is whole when every rank's did.
  std::map<std::pair<l1::NamespaceId, std::array<uint8_t, 32>>, std::pair<uint32_t, uint32_t>> got;
  std::vector<std::pair<l1::NamespaceId, std::array<uint8_t, 32>>> order;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!results[i].status.ok()) continue;
    const auto& key = items[i].key;
    const auto format = FindFormat(key.model_name, key.layout_tag);
    const auto wr = WorldAndRank(key.kv_rank);
    if (!format || !wr) continue;
    const auto ns = l1->namespaces().Find(format->l1_model, static_cast<int32_t>(wr->first), key.cache_salt);
    if (!ns) continue;
    auto [it, added] = got.try_emplace({*ns, key.chunk_hash}, 0, wr->first);
    if (added) order.push_back(it->first);
    it->second.first++;
  }
  for (const auto& k : order) {
    const auto& [n, world] = got[k];
    if (n == world) out.push_back(l1::ChunkKey{k.first, k.second});
  }
  return out;
}

PeerNode::Stats PeerNode::stats() const {
  Stats s;
  {
    MutexLock lock(&mu_);
    s = stats_;
  }
  MutexLock lock(&listen_mu_);
  s.agent = agent_ ? agent_->stats() : last_agent_stats_;
  s.published = published_.load(std::memory_order_relaxed);
  s.withdrawn = withdrawn_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kvd::p2p
