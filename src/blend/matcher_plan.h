// The matcher's helpers on either side of a request (matcher.h):
//  - PlanRegistration: which windows of a STORE to register, and under which key and old_st;
//  - SelectNonOverlapping: which of a probe's candidates a lookup can use together;
//  - MatcherPartition: a partition key for (model name, world size, cache salt).
//
// Thread safety: stateless functions, safe from any thread. Ownership: the windows that
// PlanRegistration returns point into the request's token buffer, which the caller keeps
// alive (and unchanged) until it has passed them to Matcher::Register.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "blend/matcher.h"
#include "common/status.h"

namespace kvd::blend {

// One STORE as the server committed it.
struct StoredRange {
  std::span<const uint32_t> tokens;     // the request's tokens from position 0
  int64_t start = 0;                    // stored range [start, end); start chunk-aligned
  int64_t end = 0;
  // Per full chunk of [start, min(end, tokens.size())): whether it was committed (nonzero)
  // and its storage key. Only committed chunks are registered: a fingerprint of a chunk that
  // was not persisted would advertise KV that does not exist.
  std::span<const uint8_t> committed;
  std::span<const StorageKey> keys;
  // First token position whose KV came from a blended prefill (reused segments, and every
  // token after the first of them); chunks that reach it register as Origin::kBlended.
  int64_t blended_from = std::numeric_limits<int64_t>::max();
};

// The windows of `stored` to register, in chunk order: every committed full chunk i (tokens
// [start + i*C, start + (i+1)*C), old_st = start + i*C, key keys[i]), except chunk 0 when
// `lmcache_parity` and start == 0 (lmcache leaves that chunk to the prefix lookup; kvd's
// default registers it, so a document stored at position 0 can be found elsewhere).
// Fails with InvalidArgument if chunk_size == 0, start < 0 or not a multiple of chunk_size,
// end < start, start > tokens.size(), or committed / keys do not have one entry per full chunk.
Result<std::vector<WindowToRegister>> PlanRegistration(const StoredRange& stored, uint32_t chunk_size,
                                                       bool lmcache_parity);

// The candidates a lookup can scatter together: drops those with cur_st < prefix_tokens
// (already served by the prefix), then keeps a non-overlapping subset, earliest cur_st
// first: a candidate is kept iff its cur_st >= the cur_ed of the last one kept (windows that
// touch do not overlap); equal cur_st keep their input order. Returned in cur_st order.
// (lmcache filters before selecting, so a prefix-covered match cannot shadow a usable one.)
std::vector<MatchCandidate> SelectNonOverlapping(std::span<const MatchCandidate> candidates,
                                                 int64_t prefix_tokens);

// A partition key for (model name, world size, cache salt): the first 8 bytes of BLAKE3 of
// the three fields, each length-prefixed, so that no two distinct triples share an encoding.
Partition MatcherPartition(std::string_view model_name, int64_t world_size, std::string_view cache_salt);

}  // namespace kvd::blend
