#include "server/chunk_keys.h"

#include <optional>

#include "server/request_phases.h"

namespace kvd::server {

l1::ChunkKey MakeChunkKey(const std::string& model, const std::string& key_namespace,
                          int64_t world_size, const std::string& salt, const keys::Hash32& hash) {
  l1::ChunkKey k;
  k.model_name = key_namespace.empty() ? model : model + "@" + key_namespace;
  k.world_size = static_cast<int32_t>(world_size);
  k.cache_salt = salt;
  k.chunk_hash = hash;
  return k;
}

Result<std::vector<l1::ChunkKey>> RequestChunkKeys(SessionTable& sessions, int64_t chunk_size,
                                                   const wire::CacheKey& key,
                                                   const std::string& key_namespace) {
  const int64_t c = chunk_size;
  if (key.start % c != 0 || key.end % c != 0) {
    return Status::InvalidArgument("token range [" + std::to_string(key.start) + ", " +
                                   std::to_string(key.end) + ") is not aligned to chunk size " +
                                   std::to_string(c));
  }
  std::optional<ScopedPhase> hash_phase(std::in_place, Phase::kHash);
  auto hashes = sessions.ChunkHashes(
      key.request_id, key.token_ids, static_cast<size_t>(key.end / c),
      SessionIdentity{key.model_name, key.world_size, key.cache_salt, key_namespace});
  hash_phase.reset();
  if (!hashes.ok()) return hashes.status();
  std::vector<l1::ChunkKey> out;
  out.reserve(static_cast<size_t>((key.end - key.start) / c));
  for (int64_t i = key.start / c; i < key.end / c; ++i) {
    out.push_back(
        MakeChunkKey(key.model_name, key_namespace, key.world_size, key.cache_salt, (*hashes)[i]));
  }
  return out;
}

}  // namespace kvd::server
