// TraceSim: replays a prefix-cache request trace through the real eviction policies
// (src/eviction), Belady's OPT and an infinite cache, and reports hit ratios.
//
// TRACE. One request per line, Mooncake's JSON format: {"timestamp", "input_length",
// "hash_ids": [...]}: hash_ids are chained prefix hashes of fixed-size token blocks (512
// tokens in the Mooncake FAST'25 traces), so two requests share block i only if they share
// every block before it. A block is one cache object of unit size. The last hash of a request
// whose length is not a multiple of the block size names a partial block: kvd never sees it
// (the lmcache client looks up and stores complete chunks only), so it is dropped unless
// TraceOptions::partial_blocks asks for the older model in which it is stored like the others.
//
// MODEL (what kvd does per request):
//   1. lookup: the request hits the longest prefix of its blocks that is cached;
//   2. the hit blocks are used (policy Access, last block first: lmcache's order), each with
//      the request's UseInfo (its position, the request's blocks, the hit length), as the
//      L1's lookup reports them;
//   3. the missed blocks are stored: each is inserted (with no UseInfo, as the L1's
//      ReserveWrite has none) and held while the others are
//      reserved (a STORE reserves every chunk before committing), evicting policy victims
//      while the cache is over capacity, then all are released last first (commit order).
//      A block that finds nothing evictable is not stored (and neither are the rest).
// Hit ratios: tokens (of all input tokens, partial tails included) and blocks. With
// partial_blocks, a partial last block is stored and counts its partial tokens when hit.
//
// OPT evicts the cached block whose next use is farthest (Belady), and declines to store a
// block whose next use is farther than every cached block's (bypass). A block's parent is
// used whenever it is, so farthest-next-use victims are the tails of prefixes, and OPT is
// the offline reference the online policies are measured against (tests check that it is
// never below any of them and equals the infinite cache once everything fits).
//
// SHARDS. With shards > 1 the cache is split like the L1's index (blocks hashed to one of
// `shards` policy instances sharing one clock, the victim the best candidate over all), to
// show what sharding costs a policy.
//
// Not thread-safe; one TraceSim per thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvd::evsim {

struct Request {
  int64_t timestamp_ms = 0;
  int64_t input_tokens = 0;
  std::vector<uint64_t> blocks;  // chained prefix hashes, first block first
};

struct Trace {
  std::vector<Request> requests;
  int64_t block_tokens = 512;
  uint64_t unique_blocks = 0;    // the footprint, in blocks
  uint64_t total_tokens = 0;     // input tokens, partial tails included
  uint64_t total_blocks = 0;
};

struct TraceOptions {
  int64_t block_tokens = 512;
  size_t skip_requests = 0;   // drop the first N requests (replay a held-out tail)
  size_t max_requests = 0;    // then keep at most N (0: all)
  bool partial_blocks = false;  // keep a request's partial last block (see above)
};

// Parses Mooncake-format JSON lines. InvalidArgument with the line number on bad input. The
// footprint counts the kept requests' blocks only.
Result<Trace> LoadTrace(const std::string& path, const TraceOptions& options = {});
Result<Trace> ParseTrace(const std::string& jsonl, const TraceOptions& options = {});

// A synthetic conversation trace in the same format (the simulator's tests replay these):
// each request either opens a conversation on one of three shared system-prompt blocks (one in
// four, and always the first) or extends a conversation chosen uniformly among all opened so
// far by 1 to 4 blocks; lengths are block-aligned minus 0 to 3 tokens of 4-token blocks. Hashes
// are distinct per block. Deterministic for a seed.
std::string SyntheticConversations(uint32_t seed, int requests);
inline constexpr int64_t kSyntheticBlockTokens = 4;

struct SimResult {
  std::string policy;        // a policy name, "OPT" or "infinite"
  uint64_t capacity_blocks = 0;
  uint32_t shards = 1;
  uint64_t hit_tokens = 0;
  uint64_t hit_blocks = 0;
  uint64_t evictions = 0;
  uint64_t not_stored = 0;   // blocks that found no room
  double token_hit_ratio = 0;
  double block_hit_ratio = 0;
  double seconds = 0;        // wall time of the replay
};

// Replays `trace` with a policy from eviction::MakePolicy (case-insensitive name).
// InvalidArgument for an unknown policy or a zero capacity.
Result<SimResult> SimulatePolicy(const Trace& trace, const std::string& policy,
                                 uint64_t capacity_blocks, uint32_t shards = 1);
SimResult SimulateOpt(const Trace& trace, uint64_t capacity_blocks);
SimResult SimulateInfinite(const Trace& trace);

}  // namespace kvd::evsim
