#include "server/tiers.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "l2/fs_tier.h"
#include "l2/resp_tier.h"

namespace kvd::server {
namespace {

Result<std::shared_ptr<l2::Tier>> MakeTier(const l2::AdapterConfig& c) {
  if (c.type == "fs" || c.type == "fs_native") {
    l2::FsTierOptions o;
    o.type = c.type;
    o.base_path = c.base_path;
    o.relative_tmp_dir = c.relative_tmp_dir;
    o.use_odirect = c.use_odirect;
    o.read_ahead_size = c.read_ahead_size;
    o.num_workers = c.num_workers;
    auto t = l2::FsTier::Create(o);
    if (!t.ok()) return t.status();
    return std::shared_ptr<l2::Tier>(std::move(t).value());
  }
  l2::RespTierOptions o;
  o.type = c.type;
  for (const auto& [h, p] : c.nodes) o.seeds.push_back({h, p});
  o.cluster = c.cluster_mode;
  o.key_prefix = c.key_prefix;
  o.ttl_seconds = c.ttl_seconds;
  o.connect.username = c.username;
  o.connect.password = c.password;
  o.connect.database_id = c.database_id.value_or(-1);
  o.connect.connect_timeout_s = c.connection_timeout_s;
  o.connect.request_timeout_s = c.request_timeout_s;
  o.num_workers = c.num_workers;
  auto t = l2::RespTier::Create(o);
  if (!t.ok()) return t.status();
  return std::shared_ptr<l2::Tier>(std::move(t).value());
}

std::string Fnv32Hex(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", h);
  return buf;
}

}  // namespace

Result<std::unique_ptr<l2::TierSet>> MakeTierSet(
    const ServerConfig& config, l1::L1Cache* l1, const Clock* clock,
    std::shared_ptr<l2::Tier> peer_tier,
    std::function<void(std::span<const l2::ChunkSlot>)> on_chunk_slots_gone) {
  if (config.l2_adapters.empty() && !peer_tier) return std::unique_ptr<l2::TierSet>();
  std::vector<l2::TierSpec> specs;
  for (size_t i = 0; i < config.l2_adapters.size(); ++i) {
    auto c = l2::ParseAdapterConfig(config.l2_adapters[i], static_cast<int>(i));
    if (!c.ok()) return c.status();
    std::unique_ptr<nlohmann::json> serde_spec;
    if (!c->serde_json.empty()) serde_spec = std::make_unique<nlohmann::json>(nlohmann::json::parse(c->serde_json));
    auto serde = l2::MakeSerde(serde_spec.get());
    if (!serde.ok()) {
      return Status::InvalidArgument("--l2-adapter #" + std::to_string(i + 1) + " ('" + c->type +
                                     "'): " + serde.status().message());
    }
    auto tier = MakeTier(*c);
    if (!tier.ok()) {
      return Status::InvalidArgument("--l2-adapter #" + std::to_string(i + 1) + ": " +
                                     tier.status().message());
    }
    spdlog::info("tier {}: {}{}{}", i, (*tier)->Describe(),
                 c->capacity_bytes() ? ", capacity " + std::to_string(c->max_capacity_gb) + " GB" : "",
                 c->eviction ? ", eviction " + c->eviction->policy : "");
    specs.push_back({std::move(c).value(), std::move(tier).value(), std::move(serde).value()});
  }
  if (peer_tier) {
    l2::AdapterConfig c;
    c.index = static_cast<int>(specs.size());
    c.type = std::string(peer_tier->type());
    auto serde = l2::MakeSerde(nullptr);
    if (!serde.ok()) return serde.status();
    spdlog::info("tier {}: {}", specs.size(), peer_tier->Describe());
    specs.push_back({std::move(c), std::move(peer_tier), std::move(serde).value()});
  }
  l2::TierSetOptions o;
  o.store_policy = config.l2_store_policy;
  o.prefetch_policy = config.l2_prefetch_policy;
  o.prefetch_max_in_flight = config.l2_prefetch_max_in_flight;
  o.prefetch_timeout_s = config.l2_prefetch_timeout_seconds;
  // Store-behind budget per tier: an eighth of L1, at most 4 GiB, at least 64 MiB.
  o.store_max_inflight_bytes =
      std::clamp<uint64_t>(config.l1_size_bytes() / 8, 64ull << 20, 4ull << 30);
  o.clock = clock;
  o.on_chunk_slots_gone = std::move(on_chunk_slots_gone);
  return l2::TierSet::Create(o, std::move(specs), l1);
}

l2::ObjectFormat TierFormatOf(const layout::KvLayout& layout, const std::string& key_namespace) {
  l2::ObjectFormat f;
  f.object_bytes = layout.object_bytes;
  bool lmcache_bytes = !layout.groups.empty();
  std::string desc;
  for (const auto& g : layout.groups) {
    l2::ObjectLayout::Group og;
    og.dtype = g.dtype;
    og.itemsize = g.itemsize;
    og.kv_size = g.kv_size;
    og.layers = static_cast<int64_t>(g.layers.size());
    og.tokens = layout.chunk_tokens;
    og.hidden = g.hidden_elems;
    f.layout.groups.push_back(og);
    if (!(g.kv_size == 2 && g.form == "kv-first NHD")) lmcache_bytes = false;
    desc += g.dtype + "/" + g.form + "/" + std::to_string(g.kv_size) + "/" +
            std::to_string(g.layers.size()) + "/" + std::to_string(g.hidden_elems) + "/" +
            std::to_string(g.engine_group) + ";";
  }
  if (layout.groups.size() != 1 || !key_namespace.empty()) lmcache_bytes = false;
  f.layout.bytes = layout.object_bytes;
  if (!lmcache_bytes) {
    f.layout_tag = Fnv32Hex(std::to_string(layout.chunk_tokens) + ";" + desc + key_namespace);
  }
  return f;
}

l2::ObjectFormat TierFormatOfEngineDriven(uint64_t object_bytes, const std::vector<int64_t>& shape,
                                          const std::string& dtype,
                                          const std::string& key_namespace) {
  l2::ObjectFormat f;
  f.object_bytes = object_bytes;
  f.layout.bytes = object_bytes;
  if (shape.size() >= 3) {
    l2::ObjectLayout::Group g;
    g.dtype = dtype;
    g.itemsize = layout::DtypeSize(dtype);
    g.kv_size = shape.size() == 4 ? shape[0] : 1;
    g.layers = shape[shape.size() - 3];
    g.tokens = shape[shape.size() - 2];
    g.hidden = shape.back();
    f.layout.groups.push_back(g);
  }
  if (!key_namespace.empty()) f.layout_tag = Fnv32Hex("engine-driven;" + dtype + ";" + key_namespace);
  return f;
}

std::vector<l2::CommittedObject> CommittedObjects(std::span<const l1::ChunkKey> chunks,
                                                  const std::string& model_name,
                                                  int64_t world_size, const std::string& cache_salt,
                                                  uint32_t slot, const l2::ObjectFormat& format) {
  std::vector<l2::CommittedObject> out;
  out.reserve(chunks.size());
  for (const auto& c : chunks) {
    l2::CommittedObject o;
    o.chunk = c;
    o.num_slots = static_cast<uint32_t>(world_size);
    o.slot = slot;
    o.key.model_name = model_name;
    o.key.kv_rank = l2::KvRank(static_cast<uint32_t>(world_size), slot);
    o.key.chunk_hash = c.chunk_hash;
    o.key.cache_salt = cache_salt;
    o.key.layout_tag = format.layout_tag;
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace kvd::server
