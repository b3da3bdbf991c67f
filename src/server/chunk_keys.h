// Chunk keys of a request: the L1 identity (model, world size, salt, chained hash) of each
// full chunk a CacheKey names, with the hashes taken from (and cached in) the request's
// session. Shared by every operation that names chunks: lookups, both transfer modes.
// Thread-safe (SessionTable is).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "keys/chunk_hasher.h"
#include "l1/chunk_key.h"
#include "server/sessions.h"
#include "wire/messages.h"

namespace kvd::server {

// `key_namespace` keeps apart objects of one model whose bytes differ for a reason the model
// name does not say: engine-driven objects written in a block-size-dependent layout
// (docs/layouts.md, "Engine-driven objects"). Empty for canonical objects. A non-empty
// namespace is appended to the model name after '@', which registered model names never
// contain, so the two kinds of keys cannot collide.
l1::ChunkKey MakeChunkKey(const std::string& model, const std::string& key_namespace,
                          int64_t world_size, const std::string& salt, const keys::Hash32& hash);

// Keys of chunks [start/C, end/C) of `key` (C = chunk_size) in `key_namespace`.
// InvalidArgument when the range is not chunk-aligned or the token list is too short or has
// tokens out of range.
Result<std::vector<l1::ChunkKey>> RequestChunkKeys(SessionTable& sessions, int64_t chunk_size,
                                                   const wire::CacheKey& key,
                                                   const std::string& key_namespace = "");

}  // namespace kvd::server
