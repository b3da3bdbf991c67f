// CacheBlend's reorder planner (`cb_reorder_plan`, --enable-blend-reorder), as lmcache 0.5.6
// plans it (its modules/blend/reorder.py; same inputs, same plan):
//
//   PlanReorder  rebuilds the longest possible beginning of one cached prompt H out of the
//                incoming prompt P's own tokens (runs of at least kReorderMinRun tokens, joined
//                by at most kReorderMaxGlue-token separators), then serves that copy followed
//                by the rest of P in its order. The copy is an exact-prefix hit for the KV
//                cache. P's last kReorderMinRun tokens are never moved (the question stays
//                last); its first keep_prefix tokens stay in place.
//   PromptStore  the stored prompts' tokens per namespace (model name, world size, cache
//                salt), bounded by their total tokens (oldest recorded first out), and which
//                prompt owns each chunk's chain hash; it names the candidates H for a prompt.
//
// THREADS. PlanReorder is pure (no shared state). PromptStore's methods may be called from
// any thread (one mutex); candidates are handed out as shared, immutable token vectors.
// OWNERSHIP. PromptStore owns copies of the tokens it records.
// INVARIANTS. A plan is a permutation of [0, |P|); none is returned when it would not copy
// more whole chunks than P's own exact prefix already has, or when it is the identity.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvd::blend {

// Shortest run of P copied as one piece; P's last kReorderMinRun tokens are never copied.
inline constexpr size_t kReorderMinRun = 16;
// Longest short run (a separator) copied between two pieces when H has it there.
inline constexpr size_t kReorderMaxGlue = 3;

// When planning must stop (a plan finished before it still counts).
class PlanDeadline {
 public:
  PlanDeadline(const Clock* clock, int64_t at_ns) : clock_(clock), at_ns_(at_ns) {}
  bool Passed() const { return clock_->NowNanos() > at_ns_; }

 private:
  const Clock* clock_;
  int64_t at_ns_;
};

// The order to serve `prompt` in (prompt[perm[i]] is the i-th token served), or nullopt to
// keep it: `candidates` newest first; the best copies the most whole chunks, then the most
// tokens, with the fewest pieces (ties keep the newer). Only candidates that start with the
// prompt's first `keep_prefix` tokens are copied. `baseline_chunks`: the exact prefix (in
// chunks) the prompt already has; a plan must copy more.
std::optional<std::vector<uint32_t>> PlanReorder(std::span<const uint32_t> prompt,
                                                 std::span<const std::span<const uint32_t>> candidates,
                                                 int64_t chunk_size, int64_t baseline_chunks,
                                                 const PlanDeadline& deadline, size_t keep_prefix);

using ChainHash = std::array<uint8_t, 32>;

struct PromptNamespace {
  std::string model_name;
  int64_t world_size = 0;
  std::string cache_salt;
  bool operator==(const PromptNamespace&) const = default;
};

class PromptStore {
 public:
  static constexpr size_t kDefaultMaxTokens = size_t{1} << 24;  // lmcache's bound
  explicit PromptStore(size_t max_tokens = kDefaultMaxTokens) : max_tokens_(max_tokens) {}

  // A store that committed KV: the request's prompt (the first record of a request keeps its
  // tokens; later ones may carry decode tokens and only add hashes) and its chain hashes
  // from chunk 0.
  void Record(const PromptNamespace& ns, std::string_view request_id, std::span<const uint32_t> tokens,
              std::span<const ChainHash> chain) KVD_EXCLUDES(mu_);

  // The one recorded namespace with this salt whose model and world size match (an empty
  // model name or a zero world size matches any); nullopt when none or several do.
  std::optional<PromptNamespace> Resolve(std::string_view model_name, int64_t world_size,
                                         std::string_view cache_salt) const KVD_EXCLUDES(mu_);

  struct Candidates {
    std::vector<std::shared_ptr<const std::vector<uint32_t>>> prompts;  // newest first
    int64_t baseline_chunks = 0;  // the prompt's own exact prefix, in chunks
  };
  // Candidates for a prompt: the `top_k` prompts owning the most of `hits` (the matcher's
  // storage keys for the prompt), the prompt holding its exact prefix (`prompt_chain`: its
  // chain hashes from chunk 0), and the namespace's newest prompt.
  Candidates Find(const PromptNamespace& ns, std::span<const ChainHash> hits,
                  std::span<const ChainHash> prompt_chain, size_t top_k = 4) const KVD_EXCLUDES(mu_);

  size_t prompts() const KVD_EXCLUDES(mu_);
  size_t tokens() const KVD_EXCLUDES(mu_);

 private:
  struct Entry {
    std::string key;  // NamespaceKey + request id
    PromptNamespace ns;
    uint64_t seq = 0;
    std::shared_ptr<const std::vector<uint32_t>> tokens;
    std::unordered_set<std::string> hashes;  // owner keys (NamespaceKey + hash) it recorded
  };
  struct NamespaceUse {
    size_t prompts = 0;
    std::string newest;  // entry key of its newest recorded prompt
  };
  static std::string NamespaceKey(const PromptNamespace& ns);

  const size_t max_tokens_;
  mutable Mutex mu_;
  std::list<Entry> entries_ KVD_GUARDED_BY(mu_);  // least recently recorded first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_ KVD_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::string> owner_ KVD_GUARDED_BY(mu_);  // ns+hash -> entry key
  // cache salt -> (model name, world size) -> use.
  std::map<std::string, std::map<std::pair<std::string, int64_t>, NamespaceUse>> namespaces_
      KVD_GUARDED_BY(mu_);
  size_t tokens_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t seq_ KVD_GUARDED_BY(mu_) = 0;
};

}  // namespace kvd::blend
