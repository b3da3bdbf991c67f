#include "server/chunk_keys.h"

#include <optional>

#include "server/request_phases.h"

namespace kvd::server {

std::string KeyModelName(const std::string& model, const std::string& key_namespace) {
  std::string out;
  KeyModelNameInto(&out, model, key_namespace);
  return out;
}

void KeyModelNameInto(std::string* out, const std::string& model, const std::string& key_namespace) {
  out->assign(model);
  if (!key_namespace.empty()) {
    out->push_back('@');
    out->append(key_namespace);
  }
}

namespace {

Status CheckAligned(const wire::CacheKey& key, int64_t c) {
  if (key.start % c != 0 || key.end % c != 0) {
    return Status::InvalidArgument("token range [" + std::to_string(key.start) + ", " +
                                   std::to_string(key.end) + ") is not aligned to chunk size " +
                                   std::to_string(c));
  }
  return Status::Ok();
}

// Keys of chunks [start/C, hashes.size()) in `ns` (none when hashing stopped before start/C);
// without a namespace, none (namespace_known false).
RequestChunks KeysOf(const wire::CacheKey& key, int64_t c, const std::vector<keys::Hash32>& hashes,
                     std::optional<l1::NamespaceId> ns) {
  RequestChunks out;
  out.first_chunk = static_cast<uint64_t>(key.start / c);
  if (out.first_chunk > 0 && out.first_chunk <= hashes.size()) {
    out.parent_hash = hashes[out.first_chunk - 1];
  }
  out.namespace_known = ns.has_value();
  if (!ns) return out;
  if (hashes.size() > out.first_chunk) out.keys.reserve(hashes.size() - out.first_chunk);
  for (size_t i = out.first_chunk; i < hashes.size(); ++i) out.keys.push_back({*ns, hashes[i]});
  return out;
}

SessionIdentity IdentityOf(const wire::CacheKey& key, const std::string& key_namespace) {
  return SessionIdentity{key.model_name, key.world_size, key.cache_salt, key_namespace};
}

}  // namespace

Result<RequestChunks> RequestChunkKeys(SessionTable& sessions, l1::Namespaces& namespaces,
                                       int64_t chunk_size, const wire::CacheKey& key,
                                       bool create_namespace, const std::string& key_namespace,
                                       SessionUse use) {
  const int64_t c = chunk_size;
  if (Status st = CheckAligned(key, c); !st.ok()) return st;
  std::optional<ScopedPhase> hash_phase(std::in_place, Phase::kHash);
  auto hashes = sessions.ChunkHashes(
      key.request_id, key.token_ids, static_cast<size_t>(key.end / c), IdentityOf(key, key_namespace),
      use);
  hash_phase.reset();
  if (!hashes.ok()) return hashes.status();
  const std::string model = KeyModelName(key.model_name, key_namespace);
  const int32_t ws = static_cast<int32_t>(key.world_size);
  std::optional<l1::NamespaceId> ns;
  if (create_namespace) {
    auto interned = namespaces.Intern(model, ws, key.cache_salt);
    if (!interned.ok()) return interned.status();
    ns = *interned;
  } else {
    ns = namespaces.Find(model, ws, key.cache_salt);
  }
  return KeysOf(key, c, *hashes, ns);
}

Result<RequestChunks> LookupChunkKeys(SessionTable& sessions, l1::Namespaces& namespaces,
                                      int64_t chunk_size, const wire::CacheKey& key,
                                      const std::string& key_namespace,
                                      const ChunkInCache& in_cache) {
  const int64_t c = chunk_size;
  if (Status st = CheckAligned(key, c); !st.ok()) return st;
  const size_t num_chunks = static_cast<size_t>(key.end / c);
  const auto ns = namespaces.Find(KeyModelName(key.model_name, key_namespace),
                                  static_cast<int32_t>(key.world_size), key.cache_salt);
  if (!ns) {
    // Nothing of this namespace is cached: nothing to hash, but the same errors.
    if (Status st = SessionTable::CheckTokens(key.token_ids, num_chunks,
                                              static_cast<uint32_t>(c));
        !st.ok()) {
      return st;
    }
    return KeysOf(key, c, {}, std::nullopt);
  }
  // The probe captures one pointer, so it fits in std::function's inline storage: no heap
  // allocation per lookup.
  const struct {
    const ChunkInCache& in_cache;
    l1::NamespaceId ns;
    size_t first;  // chunks before the lookup's range are not its to ask about
  } probe{in_cache, *ns, static_cast<size_t>(key.start / c)};
  std::optional<ScopedPhase> hash_phase(std::in_place, Phase::kHash);
  auto hashes = sessions.ChunkHashesWhilePresent(
      key.request_id, key.token_ids, num_chunks, IdentityOf(key, key_namespace),
      [&probe](size_t chunk, const keys::Hash32& hash) {
        return chunk < probe.first || probe.in_cache(l1::ChunkKey{probe.ns, hash});
      });
  hash_phase.reset();
  if (!hashes.ok()) return hashes.status();
  return KeysOf(key, c, *hashes, ns);
}

void BindStoredChunks(KvEventLog* events, const wire::CacheKey& key, const RequestChunks& chunks,
                      int64_t chunk_size) {
  if (!events || chunks.keys.empty()) return;
  const size_t c = static_cast<size_t>(chunk_size);
  std::vector<KvEventLog::Binding> bindings;
  bindings.reserve(chunks.keys.size());
  for (size_t j = 0; j < chunks.keys.size(); ++j) {
    KvEventLog::Binding b;
    b.hash = chunks.keys[j].chunk_hash;
    if (j > 0) {
      b.parent = chunks.keys[j - 1].chunk_hash;
    } else {
      b.parent = chunks.parent_hash;
    }
    b.tokens = key.token_ids.span().subspan((chunks.first_chunk + j) * c, c);
    bindings.push_back(b);
  }
  events->Bind(key.model_name, bindings);
}

}  // namespace kvd::server
