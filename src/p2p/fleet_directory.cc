// FleetDirectory (fleet_directory.h): validation, the lookup script, and one pipelined round
// trip per call over l2::RespConnection. Every reply is checked before it is used.
#include "p2p/fleet_directory.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
#include <utility>

#include "l2/cluster_slots.h"

namespace kvd::p2p {

// A connection and the SHA1 of the lookup script as its server loaded it.
struct FleetDirectory::Link {
  std::unique_ptr<l2::RespConnection> conn;
  std::string sha;
};

namespace {

// KEYS: chunk entries. ARGV: the node key prefix, this node's name, owners per key at most.
// Answers {removed, {owners of KEYS[1] as node, incarnation, url, ...}, ...}. An entry is
// live when its node name and incarnation are well formed and its node key holds "<the same
// incarnation> <a well-formed url>"; any other entry is deleted and counted in `removed`.
constexpr std::string_view kLookupScript = R"lua(
local node_prefix, self, cap = ARGV[1], ARGV[2], tonumber(ARGV[3])
local function valid_incarnation(s)
  if not string.match(s, '^[1-9]%d*$') then return false end
  return #s < 20 or (#s == 20 and s <= '18446744073709551615')
end
local removed, answer = 0, {}
for i, key in ipairs(KEYS) do
  local owners = {}
  local fields = redis.pcall('HGETALL', key)
  if type(fields) ~= 'table' or fields.err then fields = {} end
  for j = 1, #fields - 1, 2 do
    local node, inc, url = fields[j], fields[j + 1], nil
    local live = false
    if #node <= 128 and string.match(node, '^[%w%._:%-]+$') and valid_incarnation(inc) then
      local v = redis.pcall('GET', node_prefix .. node)
      if type(v) == 'string' then
        local sp = string.find(v, ' ', 1, true)
        if sp and string.sub(v, 1, sp - 1) == inc then
          url = string.sub(v, sp + 1)
          live = #url > 0 and #url <= 256 and not string.find(url, '[%c%s]')
        end
      end
    end
    if not live then
      redis.call('HDEL', key, node)
      removed = removed + 1
    elseif node ~= self and #owners < 3 * cap then
      owners[#owners + 1] = node
      owners[#owners + 1] = inc
      owners[#owners + 1] = url
    end
  end
  answer[i] = owners
end
return {removed, answer}
)lua";

// KEYS[1]: this node's key; ARGV[1]: its value. Deletes it only while it holds that value.
constexpr std::string_view kLeaveScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
    "return 0";

// KEYS[1]: a chunk key; ARGV[1]: a node; ARGV[2]: an incarnation. Deletes that node's field
// only while it holds that incarnation (a publish of a later life is left alone).
constexpr std::string_view kForgetScript =
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then "
    "return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0";

constexpr size_t kMaxNodeBytes = 128;
constexpr size_t kMaxUrlBytes = 256;
constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxPrefixBytes = 256;
constexpr double kMaxTtlS = 365.0 * 86400;

bool ValidNode(std::string_view s) {
  if (s.empty() || s.size() > kMaxNodeBytes) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '-';
  });
}

bool ValidUrl(std::string_view s) {
  if (s.empty() || s.size() > kMaxUrlBytes) return false;
  return std::none_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u <= 0x20 || u == 0x7f;
  });
}

// A non-zero decimal uint64 without sign or leading zeros (as the script and Heartbeat write).
std::optional<uint64_t> ParseIncarnation(std::string_view s) {
  if (s.empty() || s[0] == '0') return std::nullopt;
  uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// Redis's hash tag: the first '{' and the first '}' after it, with something between.
bool HasHashTag(std::string_view prefix) {
  const size_t open = prefix.find('{');
  if (open == std::string_view::npos) return false;
  const size_t close = prefix.find('}', open + 1);
  return close != std::string_view::npos && close > open + 1;
}

bool ValidTtl(double s) { return std::isfinite(s) && s >= 0.001 && s <= kMaxTtlS; }
std::string Millis(double s) { return std::to_string(static_cast<int64_t>(std::llround(s * 1000))); }

// The server's words, bounded: it is not trusted to keep them short.
std::string ServerText(const redisReply* r) {
  std::string_view t = l2::ReplyString(r);
  return std::string(t.substr(0, 200)) + (t.size() > 200 ? "..." : "");
}

// What a Cluster's redirect answers carry (WithLink drops the connection on it).
constexpr std::string_view kClusterAnswer = "the server answered as a Redis Cluster";

Status ServerError(std::string_view what, const redisReply* r) {
  const std::string_view e = l2::ReplyString(r);
  if (e.starts_with("MOVED ") || e.starts_with("ASK ") || e.starts_with("CLUSTERDOWN") ||
      e.starts_with("CROSSSLOT")) {
    return Status::FailedPrecondition(std::string(what) + ": " + std::string(kClusterAnswer) + " (" +
                                      ServerText(r) +
                                      "); a Cluster directory is given as a seed with cluster set "
                                      "(redis-cluster://host:port)");
  }
  return Status::Unavailable(std::string(what) + ": server error: " + ServerText(r));
}

bool IsClusterAnswer(const Status& st) {
  return st.code() == StatusCode::kFailedPrecondition &&
         st.message().find(kClusterAnswer) != std::string::npos;
}

// A connection to the server that holds the fleet's keys: the endpoint itself, or with
// o.cluster the master of the prefix's slot, found through the slot map of `hint` (the master
// last used) or else of the seed.
Result<std::unique_ptr<l2::RespConnection>> ConnectToKeys(const FleetDirectory::Options& o,
                                                          const l2::RespEndpoint* hint) {
  if (!o.cluster) return l2::RespConnection::Connect(o.endpoint, o.connect);
  std::vector<l2::RespEndpoint> candidates;
  if (hint != nullptr) candidates.push_back(*hint);
  if (hint == nullptr || !(*hint == o.endpoint)) candidates.push_back(o.endpoint);
  const uint16_t slot = l2::KeySlot(o.key_prefix);
  Status last = Status::Unavailable("no Cluster node to ask");
  for (const auto& ep : candidates) {
    auto conn = l2::RespConnection::Connect(ep, o.connect);
    if (!conn.ok()) {
      last = conn.status();
      continue;
    }
    auto r = (*conn)->Command({"CLUSTER", "SLOTS"});
    if (!r.ok()) {
      last = r.status();
      continue;
    }
    Result<l2::SlotMap> map = Status::Internal("no slot map");
    if (l2::IsError(r->get())) {
      const std::string why = ServerText(r->get());
      auto shards = (*conn)->Command({"CLUSTER", "SHARDS"});  // servers that dropped SLOTS
      if (!shards.ok()) {
        last = shards.status();
        continue;
      }
      if (l2::IsError(shards->get())) {
        return Status::FailedPrecondition("directory " + ep.ToString() + " is not a Redis Cluster (" +
                                          why + "): give it as redis://host:port");
      }
      map = l2::ParseClusterShards(shards->get(), ep);
    } else {
      map = l2::ParseClusterSlots(r->get(), ep);
    }
    if (!map.ok()) {
      last = Status::Internal("directory " + ep.ToString() + ": " + map.status().message());
      continue;
    }
    const l2::RespEndpoint* master = map->MasterOf(slot);
    if (master == nullptr) {
      last = Status::Unavailable("directory: no master serves slot " + std::to_string(slot));
      continue;
    }
    if (*master == ep) return conn;
    auto owner = l2::RespConnection::Connect(*master, o.connect);
    if (owner.ok()) return owner;
    last = owner.status();
  }
  return last;
}

Status Malformed(std::string_view what, std::string_view why) {
  return Status::Internal(std::string(what) + ": malformed reply: " + std::string(why));
}

// Reads `n` pipelined replies that should be integers; the first bad one is answered, after
// all were read (so that the connection stays in step).
Status DrainIntegers(l2::RespConnection& conn, size_t n, std::string_view what) {
  Status first;
  for (size_t i = 0; i < n; ++i) {
    auto r = conn.GetReply();
    if (!r.ok()) return r.status();
    Status st;
    if (l2::IsError(r->get())) {
      st = ServerError(what, r->get());
    } else if ((*r)->type != REDIS_REPLY_INTEGER) {
      st = Malformed(what, "not an integer");
    }
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  return first;
}

// Why `o` and `s` cannot be used; empty when they can.
std::string ConfigError(const FleetDirectory::Options& o, const FleetDirectory::Self& s) {
  if (!HasHashTag(o.key_prefix) || o.key_prefix.size() > kMaxPrefixBytes) {
    return "key_prefix \"" + o.key_prefix + "\" must hold a non-empty {hash tag} and be at most 256 bytes";
  }
  if (!ValidTtl(o.node_ttl_s) || !ValidTtl(o.entry_ttl_s)) {
    return "node_ttl_s and entry_ttl_s must be within [0.001 s, 1 year]";
  }
  if (o.max_batch < 1 || o.max_batch > 65536) return "max_batch must be within [1, 65536]";
  if (o.max_owners_per_key < 1 || o.max_owners_per_key > 1024) {
    return "max_owners_per_key must be within [1, 1024]";
  }
  if (o.endpoint.host.empty() || o.endpoint.port <= 0 || o.endpoint.port > 65535) {
    return "endpoint \"" + o.endpoint.ToString() + "\" is not host:port";
  }
  if (!ValidNode(s.node)) {
    return "node name \"" + s.node.substr(0, 200) + "\" must be 1..128 bytes of [A-Za-z0-9._:-]";
  }
  if (s.incarnation == 0) return "incarnation must not be 0";
  if (!ValidUrl(s.url)) return "url must be 1..256 bytes without whitespace or control bytes";
  return "";
}

}  // namespace

FleetDirectory::FleetDirectory(Options options, Self self, std::unique_ptr<Link> link)
    : options_(std::move(options)),
      self_(std::move(self)),
      node_key_(options_.key_prefix + "node:" + self_.node),
      node_value_(std::to_string(self_.incarnation) + " " + self_.url),
      // Worst case per owner: three bulk strings ("$NNN\r\n...\r\n") at their longest.
      keys_per_script_(std::clamp<size_t>(
          (l2::RespConnection::kMaxReplyBytes - (64 << 10)) /
              (options_.max_owners_per_key * (kMaxNodeBytes + 20 + kMaxUrlBytes + 3 * 8) + 16),
          1, l2::RespConnection::kMaxReplyElements)),
      link_(std::move(link)) {}

FleetDirectory::~FleetDirectory() = default;

Result<std::unique_ptr<FleetDirectory>> FleetDirectory::Connect(Options options, Self self) {
  if (std::string why = ConfigError(options, self); !why.empty()) return Status::InvalidArgument(why);
  auto link = Dial(options, nullptr);
  if (!link.ok()) return link.status();
  return std::unique_ptr<FleetDirectory>(
      new FleetDirectory(std::move(options), std::move(self), std::move(*link)));
}

Result<std::unique_ptr<FleetDirectory::Link>> FleetDirectory::Dial(const Options& options,
                                                                   const l2::RespEndpoint* hint) {
  auto conn = ConnectToKeys(options, hint);
  if (!conn.ok()) return conn.status();
  auto r = (*conn)->Command({"SCRIPT", "LOAD", kLookupScript});
  if (!r.ok()) return r.status();
  if (l2::IsError(r->get())) return ServerError("SCRIPT LOAD", r->get());
  const std::string_view sha = l2::ReplyString(r->get());
  if ((*r)->type != REDIS_REPLY_STRING || sha.size() != 40 ||
      !std::all_of(sha.begin(), sha.end(),
                   [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; })) {
    return Malformed("SCRIPT LOAD", "not a SHA1");
  }
  return std::make_unique<Link>(Link{std::move(*conn), std::string(sha)});
}

template <typename Fn>
Status FleetDirectory::WithLink(Fn&& fn) {
  for (int attempt = 0;; ++attempt) {
    bool fresh = false;
    if (link_ == nullptr || link_->conn->broken()) {
      link_.reset();
      auto link = Dial(options_, last_master_ ? &*last_master_ : nullptr);
      if (!link.ok()) return link.status();
      link_ = std::move(*link);
      if (options_.cluster) last_master_ = link_->conn->endpoint();
      fresh = true;
      ++stats_.reconnects;
    }
    Status st = fn(*link_);
    if (options_.cluster && IsClusterAnswer(st)) {
      // The slot moved (a failover, a resharding): dial again through the slot map.
      link_.reset();
      last_master_.reset();
      if (attempt > 0) return Status::Unavailable(st.message());
      continue;
    }
    if (!link_->conn->broken()) return st;
    link_.reset();  // dropped: the next use dials again
    if (st.ok() || fresh || attempt > 0) return st;
  }
}

Status FleetDirectory::ValidateKeys(const std::vector<std::string>& keys) const {
  if (keys.size() > options_.max_batch) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys, more than max_batch " +
                                   std::to_string(options_.max_batch));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty() || keys[i].size() > kMaxKeyBytes) {
      return Status::InvalidArgument("key " + std::to_string(i) + " is " +
                                     std::to_string(keys[i].size()) + " bytes, not 1..1024");
    }
  }
  return Status::Ok();
}

Status FleetDirectory::Heartbeat() {
  const std::string ttl = Millis(options_.node_ttl_s);
  MutexLock lock(&mu_);
  ++stats_.heartbeats;
  Status st = WithLink([&](Link& link) -> Status {
    auto r = link.conn->Command({"SET", node_key_, node_value_, "PX", ttl});
    if (!r.ok()) return r.status();
    if (l2::IsError(r->get())) return ServerError("heartbeat", r->get());
    if ((*r)->type != REDIS_REPLY_STATUS || l2::ReplyString(r->get()) != "OK") {
      return Malformed("heartbeat", "not OK");
    }
    return Status::Ok();
  });
  if (!st.ok()) ++stats_.failures;
  return st;
}

Status FleetDirectory::Publish(const std::vector<std::string>& keys) {
  const std::string incarnation = std::to_string(self_.incarnation);
  const std::string ttl = Millis(options_.entry_ttl_s);
  return PerKey("publish", &Stats::publishes, keys, [&](l2::RespConnection& conn, const std::string& key) {
    KVD_RETURN_IF_ERROR(conn.Append({"HSET", key, self_.node, incarnation}));
    return conn.Append({"PEXPIRE", key, ttl});
  }, /*replies_per_key=*/2);
}

Status FleetDirectory::Withdraw(const std::vector<std::string>& keys) {
  return PerKey("withdraw", &Stats::withdraws, keys, [&](l2::RespConnection& conn, const std::string& key) {
    return conn.Append({"HDEL", key, self_.node});
  }, /*replies_per_key=*/1);
}

template <typename AppendFn>
Status FleetDirectory::PerKey(std::string_view what, uint64_t Stats::*counter,
                              const std::vector<std::string>& keys, AppendFn&& append,
                              size_t replies_per_key) {
  KVD_RETURN_IF_ERROR(ValidateKeys(keys));
  const std::string prefix = options_.key_prefix + "chunk:";
  MutexLock lock(&mu_);
  ++(stats_.*counter);
  if (keys.empty()) return Status::Ok();
  Status st = WithLink([&](Link& link) -> Status {
    std::string key;
    for (const auto& k : keys) {
      key = prefix + k;
      KVD_RETURN_IF_ERROR(append(*link.conn, key));
    }
    return DrainIntegers(*link.conn, replies_per_key * keys.size(), what);
  });
  if (!st.ok()) ++stats_.failures;
  return st;
}

Result<std::vector<std::vector<FleetDirectory::Owner>>> FleetDirectory::Lookup(
    const std::vector<std::string>& keys) {
  KVD_RETURN_IF_ERROR(ValidateKeys(keys));
  std::vector<std::vector<Owner>> out;
  MutexLock lock(&mu_);
  ++stats_.lookups;
  if (keys.empty()) return out;
  uint64_t removed = 0;
  Status st = WithLink([&](Link& link) -> Status {
    out.assign(keys.size(), {});
    return Lookups(link, keys, out, removed);
  });
  stats_.stale_entries_removed += removed;
  if (!st.ok()) {
    ++stats_.failures;
    return st;
  }
  return out;
}

// One script per keys_per_script_ keys, all pipelined; those answered NOSCRIPT (the server's
// script cache was flushed) are sent again with EVAL.
Status FleetDirectory::Lookups(Link& link, const std::vector<std::string>& keys,
                               std::vector<std::vector<Owner>>& out, uint64_t& removed) const {
  const std::string node_prefix = options_.key_prefix + "node:";
  const std::string cap = std::to_string(options_.max_owners_per_key);
  const std::string chunk_prefix = options_.key_prefix + "chunk:";
  const size_t k = keys_per_script_;
  const size_t scripts = (keys.size() + k - 1) / k;
  auto send = [&](size_t s, bool eval) -> Status {
    const size_t from = s * k, to = std::min(keys.size(), from + k);
    std::vector<std::string> full;
    full.reserve(to - from);
    for (size_t i = from; i < to; ++i) full.push_back(chunk_prefix + keys[i]);
    const std::string count = std::to_string(to - from);
    std::vector<l2::RespArg> args = {eval ? "EVAL" : "EVALSHA",
                                     eval ? kLookupScript : std::string_view(link.sha), count};
    args.insert(args.end(), full.begin(), full.end());
    args.insert(args.end(), {node_prefix, self_.node, cap});
    return link.conn->Append(args);  // copies or writes the arguments before returning
  };
  auto receive = [&](size_t s, bool* noscript) -> Status {
    auto r = link.conn->GetReply();
    if (!r.ok()) return r.status();
    const redisReply* reply = r->get();
    if (l2::IsError(reply)) {
      if (noscript != nullptr && l2::ReplyString(reply).starts_with("NOSCRIPT")) {
        *noscript = true;
        return Status::Ok();
      }
      return ServerError("lookup", reply);
    }
    const size_t from = s * k, count = std::min(keys.size(), from + k) - from;
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) return Malformed("lookup", "not a pair");
    const redisReply* n = reply->element[0];
    const redisReply* per_key = reply->element[1];
    if (n == nullptr || n->type != REDIS_REPLY_INTEGER || n->integer < 0) {
      return Malformed("lookup", "removed count is not a non-negative integer");
    }
    if (per_key == nullptr || per_key->type != REDIS_REPLY_ARRAY || per_key->elements != count) {
      return Malformed("lookup", "not one answer per key");
    }
    for (size_t i = 0; i < count; ++i) {
      const redisReply* o = per_key->element[i];
      if (o == nullptr || o->type != REDIS_REPLY_ARRAY || o->elements % 3 != 0 ||
          o->elements / 3 > options_.max_owners_per_key) {
        return Malformed("lookup", "owners are not at most max_owners_per_key triples");
      }
      std::vector<Owner>& owners = out[from + i];
      for (size_t j = 0; j < o->elements; j += 3) {
        const redisReply* f[3] = {o->element[j], o->element[j + 1], o->element[j + 2]};
        for (const redisReply* e : f) {
          if (e == nullptr || e->type != REDIS_REPLY_STRING) {
            return Malformed("lookup", "owner field not a string");
          }
        }
        const std::string_view node = l2::ReplyString(f[0]), url = l2::ReplyString(f[2]);
        const auto incarnation = ParseIncarnation(l2::ReplyString(f[1]));
        if (!ValidNode(node) || node == self_.node || !incarnation || !ValidUrl(url)) {
          return Malformed("lookup", "invalid owner");
        }
        owners.push_back({std::string(node), *incarnation, std::string(url)});
      }
    }
    removed += static_cast<uint64_t>(n->integer);
    return Status::Ok();
  };

  for (size_t s = 0; s < scripts; ++s) KVD_RETURN_IF_ERROR(send(s, false));
  std::vector<size_t> again;
  Status first;
  for (size_t s = 0; s < scripts; ++s) {
    bool noscript = false;
    Status st = receive(s, &noscript);
    if (link.conn->broken()) return st;
    if (noscript) again.push_back(s);
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  if (!first.ok() || again.empty()) return first;
  for (size_t s : again) KVD_RETURN_IF_ERROR(send(s, true));
  for (size_t s : again) {
    Status st = receive(s, nullptr);
    if (link.conn->broken()) return st;
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  return first;
}

Status FleetDirectory::Leave() {
  MutexLock lock(&mu_);
  return EvalOneLocked("leave", kLeaveScript, node_key_, node_value_, "");
}

Status FleetDirectory::Forget(const std::string& key, const Owner& owner) {
  KVD_RETURN_IF_ERROR(ValidateKeys({key}));
  if (!ValidNode(owner.node) || owner.incarnation == 0) {
    return Status::InvalidArgument("forget: not an owner (node \"" + owner.node.substr(0, 200) + "\")");
  }
  MutexLock lock(&mu_);
  ++stats_.forgets;
  return EvalOneLocked("forget", kForgetScript, options_.key_prefix + "chunk:" + key, owner.node,
                       std::to_string(owner.incarnation));
}

Status FleetDirectory::EvalOneLocked(std::string_view what, std::string_view script,
                                     const std::string& key, const std::string& arg1,
                                     const std::string& arg2) {
  Status st = WithLink([&](Link& link) -> Status {
    std::vector<std::string_view> args{"EVAL", script, "1", key, arg1};
    if (!arg2.empty()) args.push_back(arg2);
    auto r = link.conn->Command(args);
    if (!r.ok()) return r.status();
    if (l2::IsError(r->get())) return ServerError(what, r->get());
    if ((*r)->type != REDIS_REPLY_INTEGER) return Malformed(what, "not an integer");
    return Status::Ok();
  });
  if (!st.ok()) ++stats_.failures;
  return st;
}

FleetDirectory::Stats FleetDirectory::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvd::p2p
