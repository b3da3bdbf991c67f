#include "http/lmcache_api.h"
#include "http/json_body.h"
#include "common/hex.h"
#include "common/model_name.h"

#include <dirent.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvd::http {
namespace {

using json = nlohmann::ordered_json;

constexpr int64_t kMaxPageSize = 5000;       // lmcache's _MAX_PAGE_SIZE
constexpr int64_t kDefaultPageSize = 500;    // lmcache's _DEFAULT_PAGE_SIZE
constexpr size_t kMaxDeleteBatch = 10000;    // lmcache's MAX_DELETE_BATCH
constexpr size_t kMaxSaltLength = 128;       // ObjectKey._SALT_MAX_LEN
constexpr size_t kMaxTokenIds = 1'000'000;  // lmcache's MAX_TOKEN_IDS
constexpr const char* kNoL2 = "no L2 adapters configured";

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Reply JsonReply(int status, const json& j) { return Reply{status, "application/json", Dump(j), {}}; }

Reply Detail(int status, const std::string& detail) { return JsonReply(status, {{"detail", detail}}); }

Reply Text(int status, std::string body) {
  return Reply{status, "text/plain; charset=utf-8", std::move(body), {}};
}

// One FastAPI validation error (422).
struct Invalid {
  std::vector<json> errors;
  void Add(const char* type, json loc, std::string msg, json input) {
    errors.push_back({{"type", type}, {"loc", std::move(loc)}, {"msg", std::move(msg)},
                      {"input", BoundedEcho(input)}});
  }
  bool any() const { return !errors.empty(); }
  Reply reply() const { return JsonReply(422, {{"detail", errors}}); }
};

std::optional<std::string> Param(const QueryParams& q, const char* name) {
  auto it = q.find(name);
  if (it == q.end()) return std::nullopt;
  return it->second;
}

// Python's int(): optional sign, digits, surrounding blanks.
std::optional<int64_t> ParseInt(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  // One sign: from_chars reads a '-' itself, so "+-1" must not get that far.
  if (s.size() > 1 && s.front() == '+' && s[1] != '-') s.remove_prefix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

bool IsTier(std::string_view t) { return t == "l1" || t == "l2" || t == "all"; }

void TierError(Invalid& bad, json loc, const json& input) {
  bad.Add("enum", std::move(loc), "Input should be 'l1', 'l2' or 'all'", input);
}

// Reads an optional string-enum tier field of `body` (default `def`).
std::string TierField(const json& body, const char* field, const char* def, Invalid& bad) {
  if (!body.contains(field)) return def;
  const json& v = body[field];
  if (!v.is_string() || !IsTier(v.get<std::string>())) {
    TierError(bad, {"body", field}, v);
    return def;
  }
  return v.get<std::string>();
}

// pydantic's lax booleans: true/false, 0/1 and the strings it reads as them.
bool BoolField(const json& body, const char* field, Invalid& bad) {
  if (!body.contains(field)) return false;
  const json& v = body[field];
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number() && (v.get<double>() == 0.0 || v.get<double>() == 1.0)) {
    return v.get<double>() == 1.0;  // pydantic takes 0, 1, 0.0 and 1.0
  }
  if (v.is_string()) {
    std::string t = v.get<std::string>();
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const char* yes : {"1", "on", "t", "true", "y", "yes"}) {
      if (t == yes) return true;
    }
    for (const char* no : {"0", "off", "f", "false", "n", "no"}) {
      if (t == no) return false;
    }
  }
  bad.Add(v.is_string() ? "bool_parsing" : "bool_type", {"body", field},
          "Input should be a valid boolean", v);
  return false;
}

// pydantic's lax integers: JSON integers, integral floats and strings that parse as one.
// kvd keeps integers in 64 bits: a larger one is refused (422), never wrapped or cast.
std::optional<int64_t> IntValue(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // [-2^63, 2^63): outside it the cast below is undefined.
    if (!(d >= -0x1p63 && d < 0x1p63) || d != std::trunc(d)) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  if (v.is_string()) return ParseInt(v.get<std::string>());
  return std::nullopt;
}

void IntError(Invalid& bad, json loc, const json& v) {
  const bool integral_float = v.is_number_float() && v.get<double>() == std::trunc(v.get<double>());
  if (v.is_number_integer() || integral_float) {
    bad.Add("int_too_big", std::move(loc), "Input should be an integer in the signed 64-bit range", v);
  } else if (v.is_string()) {
    bad.Add("int_parsing", std::move(loc),
            "Input should be a valid integer, unable to parse string as an integer", v);
  } else if (v.is_number_float()) {
    bad.Add("int_from_float", std::move(loc), "Input should be a valid integer, got a number with a fractional part", v);
  } else {
    bad.Add("int_type", std::move(loc), "Input should be a valid integer", v);
  }
}

// Parses a JSON object body; a missing body is `null` when allowed.
std::optional<json> ParseBody(std::string_view body, bool optional, Invalid& bad) {
  const bool blank = std::all_of(body.begin(), body.end(),
                                 [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
  if (blank) {
    if (optional) return json::object();
    bad.Add("missing", {"body"}, "Field required", nullptr);
    return std::nullopt;
  }
  std::string why;
  json j = ParseJsonBody<json>(body, &why);
  if (j.is_discarded()) {
    bad.Add("json_invalid", {"body", 0}, "JSON decode error: " + why, std::string(body.substr(0, 200)));
    return std::nullopt;
  }
  if (optional && j.is_null()) return json::object();
  if (!j.is_object()) {
    bad.Add("dataclass_type", {"body"}, "Input should be a dictionary", j);
    return std::nullopt;
  }
  return j;
}

std::optional<std::array<uint8_t, 32>> HashFromHex(const std::string& hex) {
  const auto bytes = HexDecode(hex);
  if (!bytes || bytes->size() != 32) return std::nullopt;
  std::array<uint8_t, 32> h{};
  std::memcpy(h.data(), bytes->data(), h.size());
  return h;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Python logging's level names for spdlog's levels.
const char* LevelName(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return "NOTSET";
    case spdlog::level::debug: return "DEBUG";
    case spdlog::level::info: return "INFO";
    case spdlog::level::warn: return "WARNING";
    case spdlog::level::err: return "ERROR";
    case spdlog::level::critical: return "CRITICAL";
    default: return "CRITICAL";
  }
}

std::optional<spdlog::level::level_enum> LevelOf(const std::string& upper) {
  if (upper == "NOTSET") return spdlog::level::trace;
  if (upper == "DEBUG") return spdlog::level::debug;
  if (upper == "INFO") return spdlog::level::info;
  if (upper == "WARNING" || upper == "WARN") return spdlog::level::warn;
  if (upper == "ERROR") return spdlog::level::err;
  if (upper == "CRITICAL" || upper == "FATAL") return spdlog::level::critical;
  return std::nullopt;
}

// lmcache's selection of an L2 adapter: none named, the first (primary); else the first
// whose type_name matches (kvd also accepts its l2_name, "<type>#<index>").
struct AdapterChoice {
  size_t index = 0;
  Reply error;
  bool ok() const { return error.body.empty(); }
};

AdapterChoice ResolveAdapter(const std::vector<L2AdapterView>& adapters,
                             const std::optional<std::string>& selector) {
  AdapterChoice c;
  if (adapters.empty()) {
    c.error = Detail(503, kNoL2);
    return c;
  }
  if (!selector) return c;
  for (size_t i = 0; i < adapters.size(); ++i) {
    if (adapters[i].type == *selector) {
      c.index = i;
      return c;
    }
  }
  for (size_t i = 0; i < adapters.size(); ++i) {
    if (adapters[i].name == *selector) {
      c.index = i;
      return c;
    }
  }
  c.error = Detail(404, "no L2 adapter with type_name='" + *selector + "'");
  return c;
}

std::string HashHex(const std::array<uint8_t, 32>& h) {
  return HexEncode(h.data(), h.size());
}

// A total order of objects for paging (NUL separates fields: no field holds one).
std::string ObjectId(const ObjectKeyRef& k) {
  std::string id = k.model_name;
  for (const std::string& part : {std::to_string(k.kv_rank), std::to_string(k.object_group_id),
                                  HashHex(k.chunk_hash), k.layout_tag, k.cache_salt}) {
    id.push_back('\0');
    id.append(part);
  }
  return id;
}

// lmcache's EncodedObjectKey; kvd-private objects add their layout tag.
json EncodedKey(const ObjectKeyRef& k) {
  json j = {{"chunk_hash_hex", HashHex(k.chunk_hash)},
            {"model_name", k.model_name},
            {"kv_rank", k.kv_rank},
            {"object_group_id", k.object_group_id},
            {"cache_salt", k.cache_salt}};
  if (!k.layout_tag.empty()) j["layout_tag"] = k.layout_tag;
  return j;
}

}  // namespace

Reply RootReply() { return JsonReply(200, {{"status", "ok"}, {"service", "LMCache HTTP API"}}); }

bool WantsHtml(std::string_view accept) { return accept.find("text/html") != std::string_view::npos; }

Reply ClearCacheReply(AdminPort& admin, std::string_view body) {
  Invalid bad;
  auto j = ParseBody(body, /*optional=*/true, bad);
  if (!j) return bad.reply();
  const std::string tier = TierField(*j, "tier", "l1", bad);
  BoolField(*j, "force", bad);  // kvd's clear never waits for locks (docs/operations.md)
  if (bad.any()) return bad.reply();
  if (tier != "l1") return Detail(400, "tier '" + tier + "' not supported; only 'l1'");
  const uint64_t n = admin.ClearCache();
  spdlog::info("http: L1 cleared on request ({} entries)", n);
  return JsonReply(200, {{"status", "ok"}, {"cleared", {{"tier", "l1"}}}, {"cleared_entries", n}});
}

Reply ListObjectsReply(StatsSource& source, const QueryParams& q) {
  Invalid bad;
  std::string tier = Param(q, "tier").value_or("l2");
  if (!IsTier(tier)) TierError(bad, {"query", "tier"}, tier);
  int64_t page_size = kDefaultPageSize;
  if (auto ps = Param(q, "page_size")) {
    auto v = ParseInt(*ps);
    if (!v) {
      bad.Add("int_parsing", {"query", "page_size"},
              "Input should be a valid integer, unable to parse string as an integer", *ps);
    } else if (*v < 1) {
      bad.Add("greater_than_equal", {"query", "page_size"}, "Input should be greater than or equal to 1", *ps);
    } else if (*v > kMaxPageSize) {
      bad.Add("less_than_equal", {"query", "page_size"},
              "Input should be less than or equal to " + std::to_string(kMaxPageSize), *ps);
    } else {
      page_size = *v;
    }
  }
  if (bad.any()) return bad.reply();
  if (tier != "l2") return Detail(400, "tier '" + tier + "' not supported; only 'l2'");
  const auto adapters = source.L2Adapters();
  auto index = ResolveAdapter(adapters, Param(q, "adapter"));
  if (!index.ok()) return index.error;
  std::string after;
  if (auto token = Param(q, "page_token")) {
    auto raw = HexDecode(*token);
    if (!raw) return Detail(400, "malformed page_token");
    after = std::move(*raw);
  }
  const L2AdapterView& adapter = adapters[index.index];
  auto listing = source.ListL2Objects(index.index);
  if (!listing.ok()) {
    return Detail(503, "L2 adapter '" + adapter.type + "' could not list its objects: " +
                           listing.status().message());
  }
  const auto model = Param(q, "model_name");
  std::vector<std::pair<std::string, const L2ObjectView*>> sorted;
  for (const auto& o : listing.value()) {
    if (model && o.key.model_name != *model) continue;
    std::string id = ObjectId(o.key);
    if (!after.empty() && id <= after) continue;
    sorted.emplace_back(std::move(id), &o);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  json entries = json::array();
  const size_t n = std::min(sorted.size(), static_cast<size_t>(page_size));
  for (size_t i = 0; i < n; ++i) {
    entries.push_back({{"key", EncodedKey(sorted[i].second->key)},
                       {"size_bytes", sorted[i].second->size_bytes}});
  }
  json next = nullptr;
  if (sorted.size() > n) next = HexEncode(sorted[n - 1].first);
  return JsonReply(200, {{"adapter", adapter.type},
                         {"shared", adapter.shared},
                         {"entries", std::move(entries)},
                         {"next_page_token", std::move(next)}});
}

Reply DeleteObjectsReply(StatsSource& source, AdminPort& admin, std::string_view body) {
  Invalid bad;
  auto j = ParseBody(body, /*optional=*/false, bad);
  if (!j) return bad.reply();
  const std::string tier = TierField(*j, "tier", "l2", bad);
  const bool force = BoolField(*j, "force", bad);
  if (j->contains("adapter") && !(*j)["adapter"].is_null() && !(*j)["adapter"].is_string()) {
    bad.Add("string_type", {"body", "adapter"}, "Input should be a valid string", (*j)["adapter"]);
  }
  std::vector<ObjectKeyRef> keys;
  std::vector<std::string> hexes;
  if (!j->contains("keys")) {
    bad.Add("missing", {"body", "keys"}, "Field required", *j);
  } else if (!(*j)["keys"].is_array()) {
    bad.Add("list_type", {"body", "keys"}, "Input should be a valid list", (*j)["keys"]);
  } else {
    const json& arr = (*j)["keys"];
    for (size_t i = 0; i < arr.size(); ++i) {
      const json& k = arr[i];
      if (!k.is_object()) {
        bad.Add("dataclass_type", {"body", "keys", i}, "Input should be a dictionary", k);
        continue;
      }
      auto str = [&](const char* f, bool required, std::string* out) {
        if (!k.contains(f)) {
          if (required) bad.Add("missing", {"body", "keys", i, f}, "Field required", k);
          return;
        }
        if (!k[f].is_string()) {
          bad.Add("string_type", {"body", "keys", i, f}, "Input should be a valid string", k[f]);
          return;
        }
        *out = k[f].get<std::string>();
      };
      auto num = [&](const char* f, bool required, int64_t* out) {
        if (!k.contains(f)) {
          if (required) bad.Add("missing", {"body", "keys", i, f}, "Field required", k);
          return;
        }
        auto v = IntValue(k[f]);
        if (!v) {
          IntError(bad, {"body", "keys", i, f}, k[f]);
          return;
        }
        *out = *v;
      };
      ObjectKeyRef key;
      std::string hex;
      str("chunk_hash_hex", true, &hex);
      str("model_name", true, &key.model_name);
      num("kv_rank", true, &key.kv_rank);
      num("object_group_id", false, &key.object_group_id);
      str("cache_salt", false, &key.cache_salt);
      str("layout_tag", false, &key.layout_tag);  // kvd's extension (kvd-private objects)
      keys.push_back(std::move(key));
      hexes.push_back(std::move(hex));
    }
  }
  if (bad.any()) return bad.reply();
  if (keys.size() > kMaxDeleteBatch) {
    return Detail(400, "too many keys in a single request (limit=" + std::to_string(kMaxDeleteBatch) +
                           ", got=" + std::to_string(keys.size()) + ")");
  }
  // ObjectKey's invariants, as lmcache checks them.
  std::vector<ObjectKeyRef> valid;
  for (size_t i = 0; i < keys.size(); ++i) {
    ObjectKeyRef& k = keys[i];
    const std::string where = "keys[" + std::to_string(i) + "]: ";
    const bool hex_ok = hexes[i].size() % 2 == 0 &&
                        std::all_of(hexes[i].begin(), hexes[i].end(),
                                    [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
    if (!hex_ok) return Detail(400, where + "chunk_hash_hex is not valid hex");
    if (Status st = CheckModelName(k.model_name, /*allow_empty=*/true); !st.ok()) {
      return Detail(400, where + st.message());
    }
    if (k.object_group_id < 0 || k.object_group_id > UINT32_MAX) {
      return Detail(400, where + "object_group_id must be in [0, 2^32)");
    }
    if (k.kv_rank < 0 || k.kv_rank > UINT32_MAX) return Detail(400, where + "kv_rank must be in [0, 2^32)");
    if (!std::all_of(k.layout_tag.begin(), k.layout_tag.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); })) {
      return Detail(400, where + "layout_tag must be lower-case hex");
    }
    if (k.cache_salt.find_first_of(std::string_view("@/\\\0", 4)) != std::string::npos) {
      return Detail(400, where + "cache_salt must not contain '@', '/', '\\' or NUL");
    }
    // lmcache's len(): characters (UTF-8 code points; the JSON parser admits only valid UTF-8).
    const size_t salt_chars = std::count_if(k.cache_salt.begin(), k.cache_salt.end(),
                                            [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
    if (salt_chars > kMaxSaltLength) {
      return Detail(400, where + "cache_salt exceeds max length " + std::to_string(kMaxSaltLength));
    }
    // kvd's chunk hashes are 32 bytes; any other hash names nothing kvd holds.
    if (auto h = HashFromHex(hexes[i])) {
      k.chunk_hash = *h;
      valid.push_back(std::move(k));
    }
  }
  // The adapter is resolved before anything is deleted: an error changes nothing.
  const bool l2 = tier == "l2" || tier == "all";
  AdapterChoice adapter;
  if (l2) {
    std::optional<std::string> selector;
    if (j->contains("adapter") && (*j)["adapter"].is_string()) selector = (*j)["adapter"].get<std::string>();
    adapter = ResolveAdapter(source.L2Adapters(), selector);
    if (!adapter.ok()) return adapter.error;
  }
  uint64_t deleted = 0, skipped = 0;
  std::string error;
  if (tier == "l1" || tier == "all") {
    std::vector<ObjectKeyRef> l1_keys;
    for (const auto& k : valid) {
      if (k.layout_tag.empty()) l1_keys.push_back(k);  // a layout tag names a tier object only
    }
    auto r = admin.DeleteL1Objects(l1_keys, force);
    deleted += r.deleted;
    skipped += r.skipped;
  }
  if (l2 && !valid.empty()) {
    auto r = admin.DeleteL2Objects(adapter.index, valid);
    if (!r.ok()) {
      error = r.status().message();
    } else {
      deleted += r.value().deleted;
      error = r.value().error;
    }
  }
  json out = {{"deleted", deleted}, {"skipped", skipped}, {"ok", error.empty()}};
  if (!error.empty()) out["error"] = error;
  return JsonReply(200, out);
}

Reply SubmitPrefetchReply(StatsSource& stats, std::string_view body) {
  Invalid bad;
  auto j = ParseBody(body, /*optional=*/false, bad);
  if (!j) return bad.reply();
  auto require = [&](const char* f) {
    if (!j->contains(f)) bad.Add("missing", {"body", f}, "Field required", *j);
    return j->contains(f);
  };
  if (require("model_name") && !(*j)["model_name"].is_string()) {
    bad.Add("string_type", {"body", "model_name"}, "Input should be a valid string", (*j)["model_name"]);
  }
  if (require("world_size") && !IntValue((*j)["world_size"])) {
    IntError(bad, {"body", "world_size"}, (*j)["world_size"]);
  }
  if (require("token_ids")) {
    const json& t = (*j)["token_ids"];
    if (!t.is_array()) {
      bad.Add("list_type", {"body", "token_ids"}, "Input should be a valid list", t);
    } else {
      for (size_t i = 0; i < t.size(); ++i) {
        if (!IntValue(t[i])) IntError(bad, {"body", "token_ids", i}, t[i]);
      }
    }
  }
  if (j->contains("cache_salt") && !(*j)["cache_salt"].is_string()) {
    bad.Add("string_type", {"body", "cache_salt"}, "Input should be a valid string", (*j)["cache_salt"]);
  }
  const std::string source = TierField(*j, "source_tier", "l2", bad);
  const std::string target = TierField(*j, "target_tier", "l1", bad);
  if (bad.any()) return bad.reply();
  if (source != "l2" || target != "l1") {
    return Detail(400, "unsupported prefetch direction '" + source + "'->'" + target +
                           "'; only 'l2'->'l1'");
  }
  // lmcache's order: the model must have registered its KV cache here, then the token cap,
  // then a sequence shorter than a chunk is a no-op.
  const std::string model = (*j)["model_name"].get<std::string>();
  const int64_t world = *IntValue((*j)["world_size"]);
  const Snapshot snap = stats.Collect();
  const bool registered = std::any_of(snap.instances.begin(), snap.instances.end(), [&](const InstanceView& i) {
    return i.model_name == model && i.world_size == world;
  });
  if (!registered) {
    return Detail(503, "no layout registered for model_name='" + model + "' world_size=" +
                           std::to_string(world) +
                           "; the model has not allocated KV cache on this node yet");
  }
  const size_t tokens = (*j)["token_ids"].size();
  if (tokens > kMaxTokenIds) {
    return Detail(400, "too many token_ids in a single request (limit=" + std::to_string(kMaxTokenIds) +
                           ", got=" + std::to_string(tokens) + ")");
  }
  if (snap.chunk_size > 0 && tokens < static_cast<size_t>(snap.chunk_size)) {
    return JsonReply(202, {{"chunks", 0}, {"status", "noop"}});
  }
  const size_t tiers = stats.L2Adapters().size();
  if (tiers == 0) return Detail(503, kNoL2);
  // kvd prefetches from its tiers on LOOKUP (docs/tiers.md); a warm prefetch that keeps the
  // chunks in L1 without a reader is not offered yet.
  return Detail(501, "warm prefetch over HTTP is not offered by kvd; a LOOKUP of these tokens "
                     "loads their chunks from the " + std::to_string(tiers) +
                     " configured L2 adapter(s)");
}

Reply PrefetchStatusReply(std::string_view request_id) {
  return Detail(404, "unknown prefetch request_id='" + std::string(request_id) +
                         "' (already completed or never submitted)");
}

Reply LogLevelReply(const QueryParams& q) {
  const std::string name = Param(q, "logger_name").value_or("");
  const std::string level = Param(q, "level").value_or("");
  auto* logger = spdlog::default_logger_raw();
  if (name.empty() && level.empty()) {
    return Text(200, std::string("=== Loggers and Levels ===\nkvd: ") + LevelName(logger->level()) + "\n");
  }
  if (name.empty() && LevelOf(Upper(level))) return JsonReply(200, nullptr);  // lmcache's null
  if (level.empty()) return Text(200, name + ": " + LevelName(logger->level()));
  // Without a logger name lmcache answers null even for an unknown level; kvd refuses it.
  if (!LevelOf(Upper(level))) return Text(400, "Invalid log level: " + level);
  // lmcache sets the level here; a GET that changes state is what a web page can make a
  // browser send (issue 27, finding 8), so kvd points at the POST.
  Reply r = Detail(405, "GET /loglevel does not change the log level: send POST "
                        "/loglevel?logger_name=<name>&level=<level> (lmcache 0.5.6 sets it on "
                        "GET; kvd changes state only on POST, PUT and DELETE)");
  r.headers.emplace_back("Allow", "GET, HEAD, POST");
  return r;
}

Reply SetLogLevelReply(const QueryParams& q) {
  const std::string name = Param(q, "logger_name").value_or("");
  const std::string level = Param(q, "level").value_or("");
  if (level.empty()) {
    Invalid bad;
    bad.Add("missing", {"query", "level"}, "Field required", nullptr);
    return bad.reply();
  }
  auto l = LevelOf(Upper(level));
  if (!l) return Text(400, "Invalid log level: " + level);
  // kvd has one logger: every name sets it.
  spdlog::set_level(*l);
  const std::string shown = name.empty() ? "kvd" : name;
  spdlog::info("http: log level set to {} (logger '{}')", Upper(level), shown);
  return Text(200, "Set " + shown + " level to " + Upper(level) + " (including all handlers)");
}

Reply ThreadsReply(const QueryParams& q) {
  std::string filter = Param(q, "name").value_or("");
  std::optional<int64_t> tid;
  if (auto t = Param(q, "thread_id")) {
    tid = ParseInt(*t);
    if (!tid) {
      Invalid bad;
      bad.Add("int_parsing", {"query", "thread_id"},
              "Input should be a valid integer, unable to parse string as an integer", *t);
      return bad.reply();
    }
  }
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  filter = lower(filter);
  std::vector<std::pair<int64_t, std::string>> threads;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      auto id = ParseInt(e->d_name);
      if (!id) continue;
      std::ifstream comm("/proc/self/task/" + std::string(e->d_name) + "/comm");
      std::string n;
      std::getline(comm, n);
      threads.emplace_back(*id, n);
    }
    closedir(d);
  }
  std::sort(threads.begin(), threads.end());
  std::string out;
  size_t shown = 0;
  for (const auto& [id, n] : threads) {
    if (!filter.empty() && lower(n).find(filter) == std::string::npos) continue;
    if (tid && *tid != 0 && id != *tid) continue;
    if (shown++ > 0) out += "\n\n";
    out += "Thread: " + n + " (tid " + std::to_string(id) + ")\nNo stack trace available\n";
  }
  out += "\n\n=== Thread Summary ===\nTotal threads: " + std::to_string(shown) + "\n";
  return Text(200, std::move(out));
}

Reply VersionStringReply(const std::string& version) { return JsonReply(200, "kvd-" + version); }

Reply LmcVersionReply() { return JsonReply(200, "0.5.6"); }

Reply CommitIdReply(const std::string& version) { return JsonReply(200, "kvd-" + version); }

}  // namespace kvd::http
