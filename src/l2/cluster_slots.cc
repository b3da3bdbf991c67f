#include "l2/cluster_slots.h"

#include <hiredis/hiredis.h>

#include <cstdlib>

namespace kvd::l2 {
namespace {

std::string Str(const redisReply* r) {
  if (!r) return {};
  if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
  if (r->str) return std::string(r->str, r->len);
  return {};
}

long long Int(const redisReply* r) {
  if (!r) return -1;
  if (r->type == REDIS_REPLY_INTEGER) return r->integer;
  if (r->type == REDIS_REPLY_STRING && r->str) return std::atoll(r->str);
  return -1;
}

int MasterIndex(SlotMap& map, const RespEndpoint& ep) {
  for (size_t i = 0; i < map.masters.size(); ++i) {
    if (map.masters[i] == ep) return static_cast<int>(i);
  }
  map.masters.push_back(ep);
  return static_cast<int>(map.masters.size() - 1);
}

std::string HostOr(std::string host, const RespEndpoint& asked) {
  return host.empty() || host == "?" ? asked.host : host;
}

// A flat RESP2 map [k1, v1, k2, v2, ...]: the value of key `k`, or nullptr.
const redisReply* Field(const redisReply* m, std::string_view k) {
  if (!m || m->type != REDIS_REPLY_ARRAY) return nullptr;
  for (size_t i = 0; i + 1 < m->elements; i += 2) {
    if (Str(m->element[i]) == k) return m->element[i + 1];
  }
  return nullptr;
}

}  // namespace

uint16_t Crc16(std::string_view data) {
  uint16_t crc = 0;
  for (unsigned char c : data) {
    crc ^= static_cast<uint16_t>(c) << 8;
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

uint16_t KeySlot(std::string_view key) {
  size_t open = key.find('{');
  if (open != std::string_view::npos) {
    size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kClusterSlots - 1);
}

int SlotMap::uncovered() const {
  int n = 0;
  for (int16_t o : owner) n += o < 0;
  return n;
}

void SlotMap::Assign(uint16_t slot, const RespEndpoint& to) {
  owner[slot] = static_cast<int16_t>(MasterIndex(*this, to));
}

Result<SlotMap> ParseClusterSlots(const redisReply* reply, const RespEndpoint& asked) {
  if (!reply || reply->type != REDIS_REPLY_ARRAY) {
    return Status::Internal("CLUSTER SLOTS: unexpected reply " + Str(reply));
  }
  SlotMap map;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 3) {
      return Status::Internal("CLUSTER SLOTS: malformed slot range");
    }
    long long lo = Int(e->element[0]), hi = Int(e->element[1]);
    const redisReply* node = e->element[2];
    if (lo < 0 || hi >= kClusterSlots || lo > hi || !node || node->type != REDIS_REPLY_ARRAY ||
        node->elements < 2) {
      return Status::Internal("CLUSTER SLOTS: malformed slot range");
    }
    RespEndpoint ep{HostOr(Str(node->element[0]), asked), static_cast<int>(Int(node->element[1]))};
    if (ep.port <= 0 || ep.port > 65535) return Status::Internal("CLUSTER SLOTS: bad port");
    const int idx = MasterIndex(map, ep);
    for (long long s = lo; s <= hi; ++s) map.owner[static_cast<size_t>(s)] = static_cast<int16_t>(idx);
  }
  return map;
}

Result<SlotMap> ParseClusterShards(const redisReply* reply, const RespEndpoint& asked) {
  if (!reply || reply->type != REDIS_REPLY_ARRAY) {
    return Status::Internal("CLUSTER SHARDS: unexpected reply " + Str(reply));
  }
  SlotMap map;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* shard = reply->element[i];
    const redisReply* slots = Field(shard, "slots");
    const redisReply* nodes = Field(shard, "nodes");
    if (!slots || !nodes || slots->type != REDIS_REPLY_ARRAY || nodes->type != REDIS_REPLY_ARRAY) {
      return Status::Internal("CLUSTER SHARDS: malformed shard");
    }
    std::optional<RespEndpoint> master;
    for (size_t n = 0; n < nodes->elements; ++n) {
      const redisReply* node = nodes->element[n];
      if (Str(Field(node, "role")) != "master" || Str(Field(node, "health")) == "fail") continue;
      std::string host = Str(Field(node, "ip"));
      if (host.empty()) host = Str(Field(node, "endpoint"));
      long long port = Int(Field(node, "port"));
      if (port <= 0) port = Int(Field(node, "tls-port"));
      if (port <= 0 || port > 65535) continue;
      master = RespEndpoint{HostOr(host, asked), static_cast<int>(port)};
      break;
    }
    if (!master || slots->elements == 0) continue;  // a shard without slots or a live master
    if (slots->elements % 2 != 0) return Status::Internal("CLUSTER SHARDS: odd slot list");
    const int idx = MasterIndex(map, *master);
    for (size_t s = 0; s + 1 < slots->elements; s += 2) {
      long long lo = Int(slots->element[s]), hi = Int(slots->element[s + 1]);
      if (lo < 0 || hi >= kClusterSlots || lo > hi) return Status::Internal("CLUSTER SHARDS: bad range");
      for (long long x = lo; x <= hi; ++x) map.owner[static_cast<size_t>(x)] = static_cast<int16_t>(idx);
    }
  }
  return map;
}

std::optional<Redirect> ParseRedirect(std::string_view error, const RespEndpoint& asked) {
  Redirect r;
  if (error.rfind("MOVED ", 0) == 0) {
    error.remove_prefix(6);
  } else if (error.rfind("ASK ", 0) == 0) {
    r.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  size_t sp = error.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  std::string slot_s(error.substr(0, sp));
  std::string_view addr = error.substr(sp + 1);
  size_t colon = addr.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  char* end = nullptr;
  long slot = std::strtol(slot_s.c_str(), &end, 10);
  if (*end != '\0' || slot < 0 || slot >= kClusterSlots) return std::nullopt;
  std::string port_s(addr.substr(colon + 1));
  long port = std::strtol(port_s.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) return std::nullopt;
  r.slot = static_cast<uint16_t>(slot);
  r.to = {HostOr(std::string(addr.substr(0, colon)), asked), static_cast<int>(port)};
  return r;
}

}  // namespace kvd::l2
