// Tiers in the server: building the TierSet from --l2-adapter flags, and what the server
// tells it about objects — their tier names and format, derived from a registered layout.
//
// LMCache compatibility of a layout. kvd names an object with lmcache's spelling only when
// its bytes are proven to be the bytes an lmcache server stores for the same chunk: the
// lmcache-driven layouts whose every kernel group is kv-first NHD with two planes (vLLM's
// FlashAttention layout; tests/integration/test_tiers_interop.py stores through one server
// and loads through the other, both ways), and engine-driven objects (the client itself
// writes them). Every other layout is kvd-private (a layout tag in the name, see
// l2/object_key.h): shared between kvd servers with the same layout, never with lmcache.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "l1/l1_cache.h"
#include "l2/tier_set.h"
#include "layout/layout.h"
#include "server/config.h"

namespace kvd::server {

struct Instance;

// Null (and OK) when no --l2-adapter was given and there is no `peer_tier` (P2P's, placed
// last: peers are asked only for what no tier of this node holds). Invalid JSON or
// configuration is an error; an unreachable back-end is not (its tier retries).
// `on_chunk_slots_gone`: l2::TierSetOptions's (the blend matcher's removal; may be empty).
Result<std::unique_ptr<l2::TierSet>> MakeTierSet(
    const ServerConfig& config, l1::L1Cache* l1, const Clock* clock,
    std::shared_ptr<l2::Tier> peer_tier = nullptr,
    std::function<void(std::span<const l2::ChunkSlot>)> on_chunk_slots_gone = {});

// The tier format of objects of an lmcache-driven layout / an engine-driven registration.
// A non-empty key namespace (objects kept apart in L1, server/chunk_keys.h) makes them
// kvd-private too, tagged apart per namespace.
l2::ObjectFormat TierFormatOf(const layout::KvLayout& layout, const std::string& key_namespace);
l2::ObjectFormat TierFormatOfEngineDriven(uint64_t object_bytes, const std::vector<int64_t>& shape,
                                          const std::string& dtype,
                                          const std::string& key_namespace);

// The committed objects of `chunks` (one slot each) under the tier names of `format`.
std::vector<l2::CommittedObject> CommittedObjects(std::span<const l1::ChunkKey> chunks,
                                                  const std::string& model_name,
                                                  int64_t world_size, const std::string& cache_salt,
                                                  uint32_t slot, const l2::ObjectFormat& format);

}  // namespace kvd::server
