#include "l2/adapter_config.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

namespace kvd::l2 {
namespace {

using nlohmann::json;

// lmcache 0.5.6's adapter types (l2_adapters/factory.py) that kvd does not implement.
constexpr const char* kLmcacheOnlyTypes[] = {
    "aerospike", "bigtable", "dax", "fault_inject", "hf3fs", "hfbucket", "mock",
    "mooncake_store", "native_plugin", "nixl_native", "nixl_store", "nixl_store_dynamic",
    "p2p", "plugin", "raw_block", "s3", "sagemaker-hyperpod"};
constexpr const char* kImplemented = "fs, fs_native, resp, valkey";

const std::set<std::string> kCommonKeys = {"type",    "affinity_tag", "shared",
                                           "persist_enabled", "eviction", "serde"};
const std::set<std::string> kFsKeys = {"base_path", "relative_tmp_dir", "read_ahead_size",
                                       "use_odirect", "num_workers", "max_capacity_gb"};
const std::set<std::string> kRespKeys = {"host", "port", "num_workers", "username", "password",
                                         "max_capacity_gb"};
const std::set<std::string> kValkeyKeys = {
    "startup_nodes", "cluster_mode",    "username",           "password",
    "key_prefix",    "num_workers",     "tls_enable",         "database_id",
    "request_timeout", "connection_timeout", "max_capacity_gb", "ttl_seconds"};

struct Parser {
  const json& j;
  std::string where;  // "--l2-adapter #1 ('fs')"

  Status Bad(const std::string& what) const { return Status::InvalidArgument(where + ": " + what); }

  bool Has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }

  Status String(const char* k, std::string* out, bool required = false) const {
    if (!Has(k)) return required ? Bad(std::string("'") + k + "' is required") : Status::Ok();
    if (!j.at(k).is_string()) return Bad(std::string("'") + k + "' must be a string");
    *out = j.at(k).get<std::string>();
    return Status::Ok();
  }
  Status Bool(const char* k, bool* out) const {
    if (!Has(k)) return Status::Ok();
    if (!j.at(k).is_boolean()) return Bad(std::string("'") + k + "' must be true or false");
    *out = j.at(k).get<bool>();
    return Status::Ok();
  }
  Status Int(const char* k, int64_t* out, int64_t lo, int64_t hi) const {
    if (!Has(k)) return Status::Ok();
    const json& v = j.at(k);
    if (!v.is_number_integer()) return Bad(std::string("'") + k + "' must be an integer");
    int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      return Bad(std::string("'") + k + "' must be in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + std::to_string(x));
    }
    *out = x;
    return Status::Ok();
  }
  Status Number(const char* k, double* out, double lo, bool lo_open = false) const {
    if (!Has(k)) return Status::Ok();
    const json& v = j.at(k);
    if (!v.is_number()) return Bad(std::string("'") + k + "' must be a number");
    double x = v.get<double>();
    if (x < lo || (lo_open && x == lo)) {
      char b[32];
      std::snprintf(b, sizeof b, "%g", lo);
      return Bad(std::string("'") + k + "' must be " + (lo_open ? "> " : ">= ") + b);
    }
    *out = x;
    return Status::Ok();
  }
};

Status CheckKeys(const Parser& p, const std::set<std::string>& allowed) {
  for (const auto& [k, v] : p.j.items()) {
    if (!kCommonKeys.count(k) && !allowed.count(k)) return p.Bad("unknown key '" + k + "'");
  }
  return Status::Ok();
}

Status ParseEviction(const Parser& p, AdapterConfig* c) {
  if (!p.Has("eviction")) return Status::Ok();
  const json& e = p.j.at("eviction");
  if (!e.is_object()) return p.Bad("'eviction' must be a JSON object");
  for (const auto& [k, v] : e.items()) {
    if (k != "eviction_policy" && k != "trigger_watermark" && k != "eviction_ratio") {
      return p.Bad("unknown key 'eviction." + k + "'");
    }
  }
  TierEvictionConfig ev;
  Parser ep{e, p.where};
  if (Status st = ep.String("eviction_policy", &ev.policy, true); !st.ok()) return st;
  if (ev.policy == "IsolatedLRU") {
    return p.Bad("eviction_policy '" + ev.policy +
                 "' is an lmcache tier policy that kvd does not implement (kvd: LRU, ARC, noop)");
  }
  if (ev.policy != "LRU" && ev.policy != "ARC" && ev.policy != "noop") {
    return p.Bad("eviction_policy must be 'LRU', 'ARC' or 'noop', got '" + ev.policy + "'");
  }
  if (Status st = ep.Number("trigger_watermark", &ev.trigger_watermark, 0, true); !st.ok()) return st;
  if (Status st = ep.Number("eviction_ratio", &ev.eviction_ratio, 0, true); !st.ok()) return st;
  if (ev.trigger_watermark > 1 || ev.eviction_ratio > 1) {
    return p.Bad("eviction trigger_watermark and eviction_ratio must be in (0, 1]");
  }
  c->eviction = ev;
  return Status::Ok();
}

Status ParseCommon(const Parser& p, AdapterConfig* c) {
  if (Status st = p.String("affinity_tag", &c->affinity_tag); !st.ok()) return st;
  if (c->affinity_tag.find_first_not_of(" \t") == std::string::npos) {
    return p.Bad("'affinity_tag' must be a non-empty string");
  }
  if (Status st = p.Bool("shared", &c->shared); !st.ok()) return st;
  if (Status st = p.Bool("persist_enabled", &c->persist_enabled); !st.ok()) return st;
  if (!c->persist_enabled) {
    return p.Bad("'persist_enabled': false is not supported by kvd for this type (objects "
                 "persist in the back-end)");
  }
  if (Status st = ParseEviction(p, c); !st.ok()) return st;
  if (p.Has("serde")) {
    if (!p.j.at("serde").is_object()) return p.Bad("'serde' must be a JSON object");
    c->serde_json = p.j.at("serde").dump();
  }
  return Status::Ok();
}

Status ParseWorkers(const Parser& p, AdapterConfig* c, int def) {
  int64_t w = def;
  if (Status st = p.Int("num_workers", &w, 1, 256); !st.ok()) return st;
  c->num_workers = static_cast<int>(w);
  return p.Number("max_capacity_gb", &c->max_capacity_gb, 0);
}

Status ParseFs(const Parser& p, AdapterConfig* c) {
  if (Status st = CheckKeys(p, kFsKeys); !st.ok()) return st;
  if (Status st = p.String("base_path", &c->base_path, true); !st.ok()) return st;
  if (c->base_path.empty()) return p.Bad("'base_path' must be a non-empty string");
  if (Status st = p.String("relative_tmp_dir", &c->relative_tmp_dir); !st.ok()) return st;
  if (!c->relative_tmp_dir.empty()) {
    const std::string& r = c->relative_tmp_dir;
    if (r[0] == '/' || r == ".." || r.rfind("../", 0) == 0 || r.find("/../") != std::string::npos ||
        (r.size() >= 3 && r.substr(r.size() - 3) == "/..")) {
      return p.Bad("'relative_tmp_dir' must be a relative path inside base_path, got '" + r + "'");
    }
  }
  if (Status st = p.Bool("use_odirect", &c->use_odirect); !st.ok()) return st;
  if (Status st = p.Int("read_ahead_size", &c->read_ahead_size, 1, int64_t{1} << 40); !st.ok()) return st;
  return ParseWorkers(p, c, 4);
}

Status ParseResp(const Parser& p, AdapterConfig* c) {
  if (Status st = CheckKeys(p, kRespKeys); !st.ok()) return st;
  std::string host;
  int64_t port = 0;
  if (Status st = p.String("host", &host, true); !st.ok()) return st;
  if (host.empty()) return p.Bad("'host' must be a non-empty string");
  if (!p.Has("port")) return p.Bad("'port' is required");
  if (Status st = p.Int("port", &port, 1, 65535); !st.ok()) return st;
  c->nodes = {{host, static_cast<int>(port)}};
  if (Status st = p.String("username", &c->username); !st.ok()) return st;
  if (Status st = p.String("password", &c->password); !st.ok()) return st;
  if (c->username.empty()) {
    if (const char* u = std::getenv("LMCACHE_RESP_USERNAME")) c->username = u;
  }
  if (c->password.empty()) {
    if (const char* pw = std::getenv("LMCACHE_RESP_PASSWORD")) c->password = pw;
  }
  return ParseWorkers(p, c, 8);
}

Status ParseNodes(const Parser& p, const std::string& raw, AdapterConfig* c) {
  size_t start = 0;
  while (start <= raw.size()) {
    size_t comma = raw.find(',', start);
    std::string item = raw.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? raw.size() + 1 : comma + 1;
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return p.Bad("startup_nodes entry must be 'host:port', got '" + item + "'");
    }
    std::string host = item.substr(0, colon), port_s = item.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    char* end = nullptr;
    long port = std::strtol(port_s.c_str(), &end, 10);
    if (port_s.empty() || *end != '\0' || port < 1 || port > 65535) {
      return p.Bad("startup_nodes entry has a bad port: '" + item + "'");
    }
    c->nodes.emplace_back(host, static_cast<int>(port));
  }
  if (c->nodes.empty()) return p.Bad("'startup_nodes' parsed to an empty list");
  return Status::Ok();
}

Status ParseValkey(const Parser& p, AdapterConfig* c) {
  if (Status st = CheckKeys(p, kValkeyKeys); !st.ok()) return st;
  std::string raw;
  if (Status st = p.String("startup_nodes", &raw, true); !st.ok()) return st;
  if (Status st = ParseNodes(p, raw, c); !st.ok()) return st;
  if (Status st = p.Bool("cluster_mode", &c->cluster_mode); !st.ok()) return st;
  if (Status st = p.String("username", &c->username); !st.ok()) return st;
  if (Status st = p.String("password", &c->password); !st.ok()) return st;
  if (c->password.empty() && !c->username.empty()) {
    // lmcache 0.5.6 passes (username, password) to glide's ServerCredentials(password,
    // username): a requirepass server admits it only with the password in "username". A
    // username without a password means nothing else (AUTH needs a password), so read it as
    // lmcache does; it is then reported as a password, redacted.
    c->password = std::move(c->username);
    c->username.clear();
  }
  if (Status st = p.String("key_prefix", &c->key_prefix); !st.ok()) return st;
  if (c->key_prefix.find('@') != std::string::npos) return p.Bad("'key_prefix' must not contain '@'");
  bool tls = false;
  if (Status st = p.Bool("tls_enable", &tls); !st.ok()) return st;
  if (tls) return p.Bad("'tls_enable': true is not supported by kvd (Debian's hiredis has no TLS)");
  int64_t db = 0;
  if (p.Has("database_id")) {
    if (Status st = p.Int("database_id", &db, 0, 1 << 20); !st.ok()) return st;
    if (!c->cluster_mode) c->database_id = db;  // ignored in cluster mode, as lmcache
  }
  if (Status st = p.Number("request_timeout", &c->request_timeout_s, 0, true); !st.ok()) return st;
  if (Status st = p.Number("connection_timeout", &c->connection_timeout_s, 0, true); !st.ok()) return st;
  if (p.Has("ttl_seconds")) {
    int64_t ttl = 0;
    if (Status st = p.Int("ttl_seconds", &ttl, 1, int64_t{1} << 40); !st.ok()) return st;
    c->ttl_seconds = ttl;
  }
  return ParseWorkers(p, c, 8);
}

}  // namespace

Result<AdapterConfig> ParseAdapterConfig(std::string_view text, int index) {
  const std::string where0 = "--l2-adapter #" + std::to_string(index + 1);
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(where0 + ": invalid JSON: " + std::string(text));
  if (!j.is_object()) return Status::InvalidArgument(where0 + ": expected a JSON object");
  if (!j.contains("type")) return Status::InvalidArgument(where0 + ": missing 'type'");
  if (!j.at("type").is_string()) return Status::InvalidArgument(where0 + ": 'type' must be a string");
  AdapterConfig c;
  c.index = index;
  c.type = j.at("type").get<std::string>();
  for (const char* t : kLmcacheOnlyTypes) {
    if (c.type == t) {
      return Status::InvalidArgument(where0 + ": adapter type '" + c.type +
                                     "' is an lmcache adapter type that kvd does not implement "
                                     "(kvd implements: " + kImplemented + ")");
    }
  }
  Parser p{j, where0 + " ('" + c.type + "')"};
  Status st;
  if (c.type == "fs" || c.type == "fs_native") {
    st = ParseFs(p, &c);
  } else if (c.type == "resp") {
    st = ParseResp(p, &c);
  } else if (c.type == "valkey") {
    st = ParseValkey(p, &c);
  } else {
    return Status::InvalidArgument(where0 + ": unknown adapter type '" + c.type +
                                   "' (kvd implements: " + kImplemented + ")");
  }
  if (!st.ok()) return st;
  if (Status cs = ParseCommon(p, &c); !cs.ok()) return cs;
  if (c.eviction && c.eviction->policy != "noop" && c.max_capacity_gb <= 0) {
    return p.Bad("an " + c.eviction->policy + " 'eviction' block needs 'max_capacity_gb' > 0");
  }
  return c;
}

std::string AdapterConfig::Describe() const {
  std::string s = type;
  if (type == "fs" || type == "fs_native") return s + " " + base_path;
  if (cluster_mode) s += " cluster";
  s += " ";
  for (size_t i = 0; i < nodes.size(); ++i) {
    s += i ? "," : "";
    s += nodes[i].first + ":" + std::to_string(nodes[i].second);
  }
  if (!key_prefix.empty()) s += " prefix " + key_prefix;
  return s;
}

std::string AdapterConfig::RedactedJson() const {
  json j = {{"type", type}, {"index", index}};
  if (type == "fs" || type == "fs_native") {
    j["base_path"] = base_path;
    j["relative_tmp_dir"] = relative_tmp_dir;
    j["use_odirect"] = use_odirect;
    if (read_ahead_size) j["read_ahead_size"] = read_ahead_size;
  } else {
    std::string nodes_s;
    for (size_t i = 0; i < nodes.size(); ++i) {
      nodes_s += i ? "," : "";
      nodes_s += nodes[i].first + ":" + std::to_string(nodes[i].second);
    }
    j[type == "resp" ? "host_port" : "startup_nodes"] = nodes_s;
    j["username"] = username;
    j["password"] = password.empty() ? "" : "***";
    if (type == "valkey") {
      j["cluster_mode"] = cluster_mode;
      j["key_prefix"] = key_prefix;
      if (ttl_seconds) j["ttl_seconds"] = *ttl_seconds;
      if (database_id) j["database_id"] = *database_id;
      j["request_timeout"] = request_timeout_s;
      j["connection_timeout"] = connection_timeout_s;
    }
  }
  j["num_workers"] = num_workers;
  j["max_capacity_gb"] = max_capacity_gb;
  if (eviction) {
    j["eviction"] = {{"eviction_policy", eviction->policy},
                     {"trigger_watermark", eviction->trigger_watermark},
                     {"eviction_ratio", eviction->eviction_ratio}};
  }
  if (!serde_json.empty()) j["serde"] = json::parse(serde_json);
  j["affinity_tag"] = affinity_tag;
  j["shared"] = shared;
  return j.dump();
}

}  // namespace kvd::l2
