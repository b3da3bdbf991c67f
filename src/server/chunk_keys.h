// Chunk keys of a request: the L1 identity (interned namespace of model, world size and
// salt; chained hash) of each full chunk a CacheKey names, with the hashes taken from (and
// cached in) the request's session. Shared by every operation that names chunks: lookups,
// both transfer modes. Thread-safe (SessionTable and l1::Namespaces are).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "keys/chunk_hasher.h"
#include "l1/chunk_key.h"
#include "l1/namespaces.h"
#include "server/kv_events.h"
#include "server/sessions.h"
#include "wire/messages.h"

namespace kvd::server {

// The model name a chunk key is interned under. `key_namespace` keeps apart objects of one
// model whose bytes differ for a reason the model name does not say: engine-driven objects
// written in a block-size-dependent layout (docs/layouts.md, "Engine-driven objects"). Empty
// for canonical objects. A non-empty namespace is appended to the model name after '@',
// which registered model names never contain, so the two kinds of keys cannot collide.
std::string KeyModelName(const std::string& model, const std::string& key_namespace);
// The same into *out (reusing its buffer).
void KeyModelNameInto(std::string* out, const std::string& model, const std::string& key_namespace);

struct RequestChunks {
  uint64_t first_chunk = 0;        // chunk index of keys[0] within the request (start / C)
  std::vector<l1::ChunkKey> keys;  // chunks [start/C, end/C)
  bool namespace_known = true;     // false: nothing of this namespace is cached (keys empty)
  // Hash of chunk first_chunk - 1 (the chain's parent of keys[0]); none when first_chunk is 0.
  std::optional<keys::Hash32> parent_hash;
};

// Keys of chunks [start/C, end/C) of `key` (C = chunk_size) in `key_namespace`. With
// `create_namespace` the key's (model, world size, salt) is interned (writes); without, an
// unknown one leaves `keys` empty (reads: nothing can hit). InvalidArgument when the range is
// not chunk-aligned or the token list is too short or has tokens out of range;
// ResourceExhausted when no more namespaces can be interned. `use`: whether the request's
// session may be created (LOOKUP) or only used when it exists (transfers; sessions.h).
Result<RequestChunks> RequestChunkKeys(SessionTable& sessions, l1::Namespaces& namespaces,
                                       int64_t chunk_size, const wire::CacheKey& key,
                                       bool create_namespace,
                                       const std::string& key_namespace = "",
                                       SessionUse use = SessionUse::kCreate);

// Whether L1 holds a chunk (a hint: LookupAndLock decides what hits).
using ChunkInCache = std::function<bool(const l1::ChunkKey&)>;
// For a LOOKUP that can hit only in L1 (no tiers): as RequestChunkKeys (kCreate, the
// namespace looked up, not interned), but hashing stops after the first chunk `in_cache`
// says is absent (SessionTable::ChunkHashesWhilePresent), so `keys` may end before end/C:
// a new prompt costs one chunk's hash, not the whole prompt's. Nothing is hashed when the
// namespace is unknown (namespace_known false). The same errors as RequestChunkKeys, for the
// whole range [0, end).
Result<RequestChunks> LookupChunkKeys(SessionTable& sessions, l1::Namespaces& namespaces,
                                      int64_t chunk_size, const wire::CacheKey& key,
                                      const std::string& key_namespace,
                                      const ChunkInCache& in_cache);

// Binds the tokens of the chunks a store is about to write (`chunks`, from RequestChunkKeys
// for `key`) in the KV-event log, for the "stored" records their commits produce. Call before
// the chunks can commit. Nothing when `events` is null. Reuses the hashes in `chunks`: the
// tokens are not hashed again.
void BindStoredChunks(KvEventLog* events, const wire::CacheKey& key, const RequestChunks& chunks,
                      int64_t chunk_size);

}  // namespace kvd::server
