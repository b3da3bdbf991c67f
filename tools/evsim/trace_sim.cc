#include "tools/evsim/trace_sim.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <queue>
#include <random>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "eviction/eviction_policy.h"

namespace kvd::evsim {
namespace {

using eviction::EntryId;
using eviction::EvictionPolicy;
using eviction::Hook;

uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Tokens of block i of a request (the last block may be partial).
uint64_t BlockTokens(const Request& r, size_t i, int64_t block_tokens) {
  const int64_t left = r.input_tokens - static_cast<int64_t>(i) * block_tokens;
  return static_cast<uint64_t>(std::clamp<int64_t>(left, 0, block_tokens));
}

// Hooks of every block of the trace; ids are the dense block numbers of the trace.
class Blocks final : public eviction::HookArena {
 public:
  explicit Blocks(size_t n) : hooks_(n) {}
  Hook& hook(EntryId id) override { return hooks_[id]; }
  uint64_t key(EntryId id) override { return Mix64(id + 1); }

 private:
  std::vector<Hook> hooks_;
};

void Finish(SimResult& r, const Trace& t, double seconds) {
  r.token_hit_ratio = t.total_tokens ? static_cast<double>(r.hit_tokens) / t.total_tokens : 0;
  r.block_hit_ratio = t.total_blocks ? static_cast<double>(r.hit_blocks) / t.total_blocks : 0;
  r.seconds = seconds;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<Trace> ParseTrace(const std::string& jsonl, const TraceOptions& options) {
  const int64_t block_tokens = options.block_tokens;
  if (block_tokens <= 0) return Status::InvalidArgument("block size must be positive");
  Trace t;
  t.block_tokens = block_tokens;
  std::unordered_map<uint64_t, uint64_t> dense;
  std::istringstream in(jsonl);
  std::string line;
  size_t skipped = 0;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (options.max_requests && t.requests.size() >= options.max_requests) break;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("hash_ids") || !j["hash_ids"].is_array() ||
        !j.contains("input_length") || !j["input_length"].is_number_integer()) {
      return Status::InvalidArgument("trace line " + std::to_string(n) +
                                     ": expected {\"input_length\": int, \"hash_ids\": [...]}");
    }
    Request r;
    r.timestamp_ms = j.value("timestamp", int64_t{0});
    r.input_tokens = j["input_length"].get<int64_t>();
    if (r.input_tokens < 0) {
      return Status::InvalidArgument("trace line " + std::to_string(n) + ": negative length");
    }
    for (const auto& h : j["hash_ids"]) {
      if (!h.is_number_integer()) {
        return Status::InvalidArgument("trace line " + std::to_string(n) + ": bad hash id");
      }
    }
    if (skipped < options.skip_requests) {
      ++skipped;
      continue;
    }
    // Complete blocks only, unless partial ones are asked for (see trace_sim.h).
    size_t keep = j["hash_ids"].size();
    if (!options.partial_blocks) {
      keep = std::min<size_t>(keep, static_cast<size_t>(r.input_tokens / block_tokens));
    }
    for (size_t i = 0; i < keep; ++i) {
      auto [it, fresh] = dense.try_emplace(j["hash_ids"][i].get<uint64_t>(), dense.size());
      r.blocks.push_back(it->second);
    }
    t.total_tokens += static_cast<uint64_t>(r.input_tokens);
    t.total_blocks += r.blocks.size();
    t.requests.push_back(std::move(r));
  }
  t.unique_blocks = dense.size();
  return t;
}

Result<Trace> LoadTrace(const std::string& path, const TraceOptions& options) {
  std::ifstream f(path);
  if (!f) return Status::NotFound("cannot open trace " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseTrace(ss.str(), options);
}

std::string SyntheticConversations(uint32_t seed, int requests) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint64_t>> convs;
  uint64_t next_hash = 1000;
  std::string jsonl;
  for (int i = 0; i < requests; ++i) {
    std::vector<uint64_t>* c;
    if (convs.empty() || rng() % 4 == 0) {
      convs.push_back({rng() % 3});  // one of three system prompts
      c = &convs.back();
    } else {
      c = &convs[rng() % convs.size()];
    }
    for (uint32_t n = 1 + rng() % 4; n > 0; --n) c->push_back(next_hash++);
    const int64_t tokens = static_cast<int64_t>(c->size()) * kSyntheticBlockTokens -
                           static_cast<int64_t>(rng() % 4);
    jsonl += "{\"timestamp\": 0, \"input_length\": " + std::to_string(tokens) +
             ", \"output_length\": 1, \"hash_ids\": [";
    for (size_t k = 0; k < c->size(); ++k) jsonl += (k ? ", " : "") + std::to_string((*c)[k]);
    jsonl += "]}\n";
  }
  return jsonl;
}

Result<SimResult> SimulatePolicy(const Trace& trace, const std::string& policy,
                                 uint64_t capacity_blocks, uint32_t shards) {
  if (capacity_blocks == 0) return Status::InvalidArgument("capacity must be positive");
  if (shards == 0) shards = 1;
  auto name = eviction::CanonicalPolicyName(policy);
  if (!name) return Status::InvalidArgument("unknown policy '" + policy + "'");
  const auto t0 = std::chrono::steady_clock::now();
  Blocks blocks(trace.unique_blocks);
  std::atomic<uint32_t> clock{0};
  eviction::QuotaBook quotas;
  const auto shared = eviction::MakeSharedState(*name);  // outlives `parts`
  std::vector<std::unique_ptr<EvictionPolicy>> parts;
  for (uint32_t s = 0; s < shards; ++s) {
    parts.push_back(eviction::MakePolicy(*name, {&blocks, &clock, &quotas, shared.get()}));
  }
  auto part = [&](uint64_t id) -> EvictionPolicy& {
    return *parts[shards == 1 ? 0 : Mix64(id) % shards];
  };
  std::vector<uint8_t> cached(trace.unique_blocks, 0);
  uint64_t size = 0;
  SimResult r;
  r.policy = *name;
  r.capacity_blocks = capacity_blocks;
  r.shards = shards;
  std::vector<EntryId> stored;
  for (const Request& req : trace.requests) {
    size_t h = 0;
    while (h < req.blocks.size() && cached[req.blocks[h]]) ++h;
    r.hit_blocks += h;
    for (size_t i = 0; i < h; ++i) r.hit_tokens += BlockTokens(req, i, trace.block_tokens);
    const uint32_t n = static_cast<uint32_t>(req.blocks.size());
    auto use = [&](size_t i) {
      return eviction::UseInfo{static_cast<uint32_t>(i), n, static_cast<uint32_t>(h)};
    };
    for (size_t i = h; i-- > 0;) {
      part(req.blocks[i]).Access(static_cast<EntryId>(req.blocks[i]), use(i));
    }
    stored.clear();
    for (size_t i = h; i < req.blocks.size(); ++i) {
      const EntryId id = static_cast<EntryId>(req.blocks[i]);
      if (cached[id]) continue;  // resident already (its prefix was evicted): not stored again
      bool room = true;
      while (size >= capacity_blocks) {
        std::optional<EvictionPolicy::Candidate> best;
        EvictionPolicy* from = nullptr;
        for (auto& p : parts) {
          auto c = p->Victim();
          if (c && (!best || eviction::GoesBefore(*c, *best))) {
            best = c;
            from = p.get();
          }
        }
        if (!best) {
          room = false;
          break;
        }
        from->Evicted(best->id);
        cached[best->id] = 0;
        --size;
        ++r.evictions;
      }
      if (!room) {
        r.not_stored += req.blocks.size() - i;
        break;
      }
      blocks.hook(id) = Hook{};
      part(id).Insert(id, eviction::UseInfo{});
      part(id).Hold(id);  // reserved while the rest of the STORE is
      cached[id] = 1;
      ++size;
      stored.push_back(id);
    }
    for (size_t i = stored.size(); i-- > 0;) part(stored[i]).Release(stored[i]);
  }
  Finish(r, trace, Since(t0));
  return r;
}

SimResult SimulateOpt(const Trace& trace, uint64_t capacity_blocks) {
  const auto t0 = std::chrono::steady_clock::now();
  constexpr uint64_t kNever = ~0ULL;
  // next[r][i]: the next request after r that contains block i of request r.
  std::vector<std::vector<uint64_t>> next(trace.requests.size());
  {
    std::vector<uint64_t> seen(trace.unique_blocks, kNever);
    for (size_t r = trace.requests.size(); r-- > 0;) {
      const auto& b = trace.requests[r].blocks;
      next[r].resize(b.size());
      for (size_t i = 0; i < b.size(); ++i) next[r][i] = seen[b[i]];
      for (uint64_t id : b) seen[id] = r;
    }
  }
  std::vector<uint64_t> use(trace.unique_blocks, 0);  // a cached block's next use
  std::vector<uint8_t> cached(trace.unique_blocks, 0);
  std::priority_queue<std::pair<uint64_t, uint64_t>> far;  // (next use, block), lazily updated
  uint64_t size = 0;
  SimResult r;
  r.policy = "OPT";
  r.capacity_blocks = capacity_blocks;
  for (size_t q = 0; q < trace.requests.size(); ++q) {
    const Request& req = trace.requests[q];
    size_t h = 0;
    while (h < req.blocks.size() && cached[req.blocks[h]]) ++h;
    r.hit_blocks += h;
    for (size_t i = 0; i < h; ++i) r.hit_tokens += BlockTokens(req, i, trace.block_tokens);
    for (size_t i = 0; i < req.blocks.size(); ++i) {
      const uint64_t id = req.blocks[i];
      const uint64_t nu = next[q][i];
      if (cached[id]) {
        use[id] = nu;
        far.emplace(nu, id);
        continue;
      }
      if (size >= capacity_blocks) {
        while (!far.empty() && (!cached[far.top().second] || use[far.top().second] != far.top().first)) {
          far.pop();
        }
        if (far.empty() || far.top().first <= nu) {  // everything cached is needed sooner
          ++r.not_stored;
          continue;
        }
        cached[far.top().second] = 0;
        far.pop();
        --size;
        ++r.evictions;
      }
      cached[id] = 1;
      use[id] = nu;
      far.emplace(nu, id);
      ++size;
    }
  }
  Finish(r, trace, Since(t0));
  return r;
}

SimResult SimulateInfinite(const Trace& trace) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<uint8_t> cached(trace.unique_blocks, 0);
  SimResult r;
  r.policy = "infinite";
  r.capacity_blocks = trace.unique_blocks;
  for (const Request& req : trace.requests) {
    size_t h = 0;
    while (h < req.blocks.size() && cached[req.blocks[h]]) ++h;
    r.hit_blocks += h;
    for (size_t i = 0; i < h; ++i) r.hit_tokens += BlockTokens(req, i, trace.block_tokens);
    for (uint64_t id : req.blocks) cached[id] = 1;
  }
  Finish(r, trace, Since(t0));
  return r;
}

}  // namespace kvd::evsim
