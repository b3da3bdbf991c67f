// Parser and renderers for the flags table (flags.h). The grammar follows argparse as
// `lmcache server` uses it: `--flag value` or `--flag=value`, `--x`/`--no-x` for booleans,
// words up to the next option for list flags, repeated JSON flags append, the last
// occurrence of any other flag wins, and an unambiguous prefix of a long flag names it.
#include "cli/flags.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

namespace kvd::cli {
namespace {

std::vector<std::string> SplitBar(const char* s) {
  std::vector<std::string> out;
  if (s == nullptr) return out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == '|' || *p == '\0') {
      out.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur.push_back(*p);
    }
  }
  return out;
}

bool Contains(const char* bar_list, const std::string& v) {
  for (const auto& s : SplitBar(bar_list)) {
    if (s == v) return true;
  }
  return false;
}

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

// A value as it appears in a message: quoted when empty or when it has spaces.
std::string Shown(const std::string& v) {
  if (!v.empty() && v.find_first_of(" \t'\"") == std::string::npos && v.size() <= 200) return v;
  std::string s = "'";
  s.append(v, 0, std::min<size_t>(v.size(), 200));
  if (v.size() > 200) s.append("...");
  s.push_back('\'');
  return s;
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = b + s.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, *out);
  return ec == std::errc() && p == e;
}

bool ParseFloat(const std::string& s, double* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  errno = 0;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(*out);
}

bool LooksLikeNumber(const std::string& s) {
  double d;
  return ParseFloat(s, &d);
}

std::string FlagLabel(const FlagSpec& f) {
  return f.origin == Origin::kLmcacheEnv ? std::string(f.name) : std::string(f.name);
}

bool TakesValue(FlagKind k) {
  return k != FlagKind::kHelp && k != FlagKind::kSwitch && k != FlagKind::kBool;
}

const char* KindName(FlagKind k) {
  switch (k) {
    case FlagKind::kHelp: return "help";
    case FlagKind::kSwitch: return "switch";
    case FlagKind::kBool: return "bool";
    case FlagKind::kInt: return "int";
    case FlagKind::kFloat: return "float";
    case FlagKind::kString: return "string";
    case FlagKind::kChoice: return "choice";
    case FlagKind::kJson: return "json";
    case FlagKind::kJsonList: return "json-list";
    case FlagKind::kList: return "list";
  }
  return "?";
}

const char* SupportName(Support s) {
  switch (s) {
    case Support::kImplemented: return "implemented";
    case Support::kAccepted: return "accepted";
    case Support::kRefused: return "refused";
  }
  return "?";
}

const char* OriginName(Origin o) {
  switch (o) {
    case Origin::kLmcache: return "lmcache";
    case Origin::kLmcacheEnv: return "lmcache-env";
    case Origin::kKvd: return "kvd";
  }
  return "?";
}

std::string RangeText(const FlagSpec& f) {
  auto num = [&](double v) {
    std::ostringstream os;
    if (f.kind == FlagKind::kInt) {
      os << static_cast<long long>(v);
    } else {
      os << v;
    }
    return os.str();
  };
  return "[" + num(f.min) + ", " + num(f.max) + "]";
}

bool HasRange(const FlagSpec& f) { return f.min > -1e299 || f.max < 1e299; }

// Checks the type of one value. Returns the error message, "" when valid.
std::string CheckValue(const FlagSpec& f, const std::string& v) {
  const std::string head = FlagLabel(f) + " " + Shown(v) + ": ";
  switch (f.kind) {
    case FlagKind::kInt: {
      int64_t i;
      if (!ParseInt(v, &i)) return head + "not an integer";
      if (HasRange(f) && (static_cast<double>(i) < f.min || static_cast<double>(i) > f.max)) {
        return head + "out of range " + RangeText(f);
      }
      return "";
    }
    case FlagKind::kFloat: {
      double d;
      if (!ParseFloat(v, &d)) return head + "not a number";
      if (HasRange(f) && (d < f.min || d > f.max)) return head + "out of range " + RangeText(f);
      return "";
    }
    case FlagKind::kChoice: {
      for (const auto& c : SplitBar(f.choices)) {
        if (c == v) return "";
        if (f.origin == Origin::kLmcacheEnv && c.size() == v.size() &&
            std::equal(c.begin(), c.end(), v.begin(), [](char a, char b) {
              return std::tolower(static_cast<unsigned char>(a)) ==
                     std::tolower(static_cast<unsigned char>(b));
            })) {
          return "";
        }
      }
      return head + "not one of " + Join(SplitBar(f.choices), ", ");
    }
    case FlagKind::kJson:
    case FlagKind::kJsonList: {
      auto j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return head + "not valid JSON";
      if (!j.is_object()) return head + "not a JSON object";
      return "";
    }
    default:
      return "";
  }
}

struct Given {
  const FlagSpec* spec = nullptr;
  FlagValue value;
  size_t order = 0;
};

}  // namespace

int64_t FlagValue::AsInt() const {
  int64_t v = 0;
  ParseInt(text, &v);
  return v;
}

double FlagValue::AsFloat() const {
  double v = 0;
  ParseFloat(text, &v);
  return v;
}

const FlagSpec* FindFlag(const std::string& name) {
  for (const auto& f : ServerFlags()) {
    if (name == f.name || (f.negation && name == f.negation) ||
        (f.short_name && name == f.short_name)) {
      return &f;
    }
  }
  return nullptr;
}

Result<ParsedCommandLine> ParseServerCommandLine(std::span<const std::string> args,
                                                 const EnvLookup& getenv) {
  ParsedCommandLine out;
  std::map<const FlagSpec*, Given> given;  // the last occurrence (lists: accumulated)
  size_t order = 0;

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& tok = args[i];
    if (tok.size() < 2 || tok[0] != '-' || tok == "--") {
      return Status::InvalidArgument("unexpected argument " + Shown(tok) +
                                     " (kvd server takes only flags; see kvd server --help)");
    }
    std::string name = tok;
    std::optional<std::string> inline_value;
    if (tok.rfind("--", 0) == 0) {
      if (size_t eq = tok.find('='); eq != std::string::npos) {
        name = tok.substr(0, eq);
        inline_value = tok.substr(eq + 1);
      }
    }
    const FlagSpec* spec = FindFlag(name);
    if (spec == nullptr && name.rfind("--", 0) == 0) {
      // argparse accepts an unambiguous prefix of a long flag.
      std::vector<std::string> matches;
      for (const auto& f : ServerFlags()) {
        if (f.origin == Origin::kLmcacheEnv) continue;
        for (const char* n : {f.name, f.negation}) {
          if (n && std::string(n).rfind(name, 0) == 0) matches.push_back(n);
        }
      }
      if (matches.size() == 1) {
        spec = FindFlag(matches[0]);
        name = matches[0];
      } else if (matches.size() > 1) {
        return Status::InvalidArgument(name + ": ambiguous, could be " + Join(matches, ", "));
      }
    }
    if (spec == nullptr || spec->origin == Origin::kLmcacheEnv) {
      return Status::InvalidArgument(name + ": not a flag of lmcache server 0.5.6 or of kvd "
                                            "(see kvd server --help)");
    }
    Given& g = given[spec];
    if (g.spec == nullptr) g.order = order++;  // listed in the order flags first appear
    g.spec = spec;
    switch (spec->kind) {
      case FlagKind::kHelp:
        out.help = true;
        continue;
      case FlagKind::kSwitch:
      case FlagKind::kBool:
        if (inline_value) {
          return Status::InvalidArgument(name + " " + Shown(*inline_value) + ": takes no value");
        }
        g.value.text = (spec->negation && name == spec->negation) ? "false" : "true";
        continue;
      case FlagKind::kList: {
        g.value.items.clear();
        if (inline_value) {
          g.value.items.push_back(*inline_value);
        } else {
          while (i + 1 < args.size() && (args[i + 1].empty() || args[i + 1][0] != '-' ||
                                         LooksLikeNumber(args[i + 1]))) {
            g.value.items.push_back(args[++i]);
          }
        }
        g.value.text = Join(g.value.items, " ");
        continue;
      }
      default:
        break;
    }
    std::string value;
    if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < args.size() &&
               (args[i + 1].empty() || args[i + 1][0] != '-' || LooksLikeNumber(args[i + 1]))) {
      value = args[++i];
    } else {
      return Status::InvalidArgument(name + ": expected a value");
    }
    if (std::string e = CheckValue(*spec, value); !e.empty()) return Status::InvalidArgument(e);
    if (spec->kind == FlagKind::kJsonList) {
      g.value.items.push_back(value);
      g.value.text = Join(g.value.items, " ");
    } else {
      g.value.text = value;
    }
  }
  if (out.help) return out;

  // Environment variables lmcache reads, after the flags (flags win where both exist).
  for (const auto& f : ServerFlags()) {
    if (f.origin != Origin::kLmcacheEnv) continue;
    const char* v = getenv(f.name);
    if (v == nullptr) continue;
    if (std::string e = CheckValue(f, v); !e.empty()) return Status::InvalidArgument(e);
    Given& g = given[&f];
    g.spec = &f;
    g.value.text = v;
    g.order = order++;
  }

  // Support, in command-line order: the first refused flag stops startup.
  std::vector<Given*> ordered;
  for (auto& [spec, g] : given) ordered.push_back(&g);
  std::sort(ordered.begin(), ordered.end(), [](Given* a, Given* b) { return a->order < b->order; });
  for (Given* g : ordered) {
    const FlagSpec& f = *g->spec;
    const std::string& v = g->value.text;
    const std::string shown = TakesValue(f.kind) || f.kind == FlagKind::kBool
                                  ? (f.kind == FlagKind::kBool
                                         ? (v == "true" ? std::string(f.name)
                                                        : std::string(f.negation))
                                         : FlagLabel(f) + " " + Shown(v))
                                  : FlagLabel(f);
    if (f.support == Support::kRefused) {
      return Status::InvalidArgument(shown + ": not supported by kvd (" + f.note + ")");
    }
    Support support = f.support;
    const char* why = f.note;
    if (f.serves != nullptr && !Contains(f.serves, v)) {
      if (f.accepts == nullptr || !Contains(f.accepts, v)) {
        return Status::InvalidArgument(shown + ": not supported by kvd (" +
                                       (f.refusal ? f.refusal : f.note) + ")");
      }
      support = Support::kAccepted;
      why = f.accept_note ? f.accept_note : f.note;
    }
    if (f.apply) f.apply(g->value, out.config);
    if (support == Support::kAccepted) {
      out.ignored.push_back({f.kind == FlagKind::kBool ? shown : FlagLabel(f),
                             TakesValue(f.kind) ? v : std::string(), why});
    }
  }

  // The flag given on the command line wins over LMCACHE_LOG_LEVEL.
  if (auto it = std::find_if(given.begin(), given.end(),
                             [](const auto& kv) { return std::string(kv.first->name) == "--log-level"; });
      it != given.end()) {
    it->first->apply(it->second.value, out.config);
  }

  CliConfig& c = out.config;
  if (!c.list_flags.empty()) return out;
  if (!given.count(FindFlag("--l1-size-gb"))) {
    return Status::InvalidArgument("--l1-size-gb: required (the L1 size in GiB)");
  }
  if (!given.count(FindFlag("--eviction-policy"))) {
    return Status::InvalidArgument("--eviction-policy: required (one of LRU, ARC, IsolatedLRU, noop, S3-FIFO)");
  }
  if (const uint64_t a = c.server.l1_align_bytes; (a & (a - 1)) != 0) {
    return Status::InvalidArgument("--l1-align-bytes " + std::to_string(a) +
                                   ": must be a power of two");
  } else if (a > c.server.l1_size_bytes()) {
    return Status::InvalidArgument("--l1-align-bytes " + std::to_string(a) +
                                   ": larger than --l1-size-gb (" +
                                   std::to_string(c.server.l1_size_bytes()) + " bytes)");
  }
  // --l1-init-size-gb larger than --l1-size-gb is capped at it (ServerConfig::l1_init_bytes),
  // as lmcache does: its default (20) exceeds most L1 sizes.
  if (!c.max_workers_given && std::max(c.max_gpu_workers, c.max_cpu_workers) > 0) {
    c.server.max_workers = std::max(c.max_gpu_workers, c.max_cpu_workers);
  }
  if (c.server.worker_reap_timeout_seconds > 0 && c.server.worker_reap_timeout_seconds < 30) {
    return Status::InvalidArgument("--worker-reap-timeout-seconds " +
                                   given[FindFlag("--worker-reap-timeout-seconds")].value.text +
                                   ": must be 0 (off) or at least 30");
  }
  if (c.server.worker_registration_grace_seconds < c.server.worker_reap_timeout_seconds) {
    std::ostringstream os;
    os << "--worker-registration-grace-seconds " << c.server.worker_registration_grace_seconds
       << ": must be at least --worker-reap-timeout-seconds ("
       << c.server.worker_reap_timeout_seconds << ")";
    return Status::InvalidArgument(os.str());
  }
  if (auto it = given.find(FindFlag("--allowed-shm-uid")); it != given.end()) {
    if (it->second.value.items.empty()) {
      return Status::InvalidArgument("--allowed-shm-uid: needs at least one uid");
    }
    for (const auto& item : it->second.value.items) {
      char* end = nullptr;
      const unsigned long uid = std::strtoul(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || item[0] == '-' || uid > 0xffffffffUL) {
        return Status::InvalidArgument("--allowed-shm-uid " + item + ": not a uid");
      }
    }
  }
  const bool token = given.count(FindFlag("--admin-token")) > 0;
  if (token && given.count(FindFlag("--admin-token-file"))) {
    return Status::InvalidArgument("--admin-token and --admin-token-file: give one of them");
  }
  if (token && !ValidAdminToken(c.http.admin_token)) {
    return Status::InvalidArgument("--admin-token: must be 1 to 4096 visible ASCII characters "
                                   "without blanks");
  }
  if (c.server.p2p()) {
    if (c.server.p2p_directory.empty() || c.server.p2p_secret_file.empty()) {
      return Status::InvalidArgument("--p2p-advertise-url: P2P needs --p2p-directory (the fleet "
                                     "directory's redis:// URL) and --p2p-secret-file (the "
                                     "fleet's shared secret)");
    }
    if (c.server.l2_store_policy == "skip_l1") {
      return Status::InvalidArgument("--p2p-advertise-url: peers read only L1, which "
                                     "--l2-store-policy skip_l1 empties; use default");
    }
  } else if (!c.server.p2p_listen_url.empty() || !c.server.p2p_directory.empty() ||
             !c.server.p2p_secret_file.empty() || !c.server.p2p_ucx_tls.empty()) {
    out.notes.push_back("P2P is off (no --p2p-advertise-url): --p2p-listen-url, --p2p-directory, "
                        "--p2p-secret-file and --p2p-ucx-tls have no effect");
  }
  if (!c.observability) c.server.kv_event_log_size = 0;
  // CacheBlend scatters into the worker's registered KV tensors: it needs the lmcache-driven
  // path, as in lmcache.
  if (c.server.blend() && c.server.supported_transfer_mode == "engine_driven") {
    return Status::InvalidArgument(
        "--engine-type blend: needs --supported-transfer-mode lmcache_driven or auto, got "
        "engine_driven (CacheBlend scatters into the KV cache a worker registers with "
        "register_kv_cache)");
  }
  // --l1-use-hugepages puts L1 in private memory (lmcache: "incompatible with shared
  // memory"): what needs the shared pool is refused or turned off, saying so.
  if (c.server.l1_use_hugepages) {
    if (!c.server.shm_name.empty()) {
      return Status::InvalidArgument(
          "--l1-use-hugepages: incompatible with a shared L1 pool (--shm-name " +
          c.server.shm_name + "): huge pages back private memory; leave --shm-name out");
    }
    if (c.server.supported_transfer_mode == "engine_driven") {
      return Status::InvalidArgument(
          "--l1-use-hugepages: engine-driven transfers (--supported-transfer-mode "
          "engine_driven) need L1 in shared memory, which huge pages are not");
    }
    if (c.server.supported_transfer_mode == "auto") {
      c.server.supported_transfer_mode = "lmcache_driven";
      out.notes.push_back("--l1-use-hugepages: L1 is private memory, so engine-driven "
                          "transfers are off (--supported-transfer-mode lmcache_driven)");
    }
    if (c.server.l1_use_lazy) {
      c.server.l1_use_lazy = false;
      out.notes.push_back("--l1-use-hugepages: lazy allocation is off (--no-l1-use-lazy), "
                          "as lmcache turns it off for huge pages");
    }
  }
  return out;
}

bool ValidAdminToken(std::string_view token) {
  return !token.empty() && token.size() <= 4096 &&
         std::all_of(token.begin(), token.end(), [](char ch) { return ch > ' ' && ch < 0x7f; });
}

// ---- renderers ------------------------------------------------------------------------

namespace {

std::string Metavar(const FlagSpec& f) {
  switch (f.kind) {
    case FlagKind::kInt: return " N";
    case FlagKind::kFloat: return " X";
    case FlagKind::kChoice: return " {" + Join(SplitBar(f.choices), ",") + "}";
    case FlagKind::kJson:
    case FlagKind::kJsonList: return " JSON";
    case FlagKind::kList: return " [WORD ...]";
    case FlagKind::kString: return " TEXT";
    default: return "";
  }
}

std::string Spelling(const FlagSpec& f) {
  std::string s;
  if (f.short_name) s += std::string(f.short_name) + ", ";
  s += f.name;
  if (f.negation) s += std::string(", ") + f.negation;
  return s + Metavar(f);
}

// What kvd does, in one phrase, for --help and the docs.
std::string Verdict(const FlagSpec& f) {
  std::string out;
  switch (f.support) {
    case Support::kImplemented: out = f.note; break;
    case Support::kAccepted: out = std::string("accepted, no effect: ") + f.note; break;
    case Support::kRefused: out = std::string("refused: ") + f.note; break;
  }
  if (f.serves != nullptr) {
    std::vector<std::string> vals = SplitBar(f.serves);
    for (auto& v : vals) v = v.empty() ? "\"\"" : v;
    out += " [kvd serves " + Join(vals, ", ");
    if (f.accepts) {
      out += std::string("; accepts ") + Join(SplitBar(f.accepts), ", ") + " with no effect: " +
             (f.accept_note ? f.accept_note : "");
    }
    if (f.refusal) out += std::string("; other values refused: ") + f.refusal;
    out += "]";
  }
  return out;
}

std::string Wrap(const std::string& text, size_t indent, size_t width) {
  std::string out;
  size_t col = indent;
  std::istringstream words(text);
  std::string w;
  bool first = true;
  while (words >> w) {
    if (!first && col + 1 + w.size() > width) {
      out += "\n" + std::string(indent, ' ');
      col = indent;
    } else if (!first) {
      out += ' ';
      ++col;
    }
    out += w;
    col += w.size();
    first = false;
  }
  return out;
}

}  // namespace

std::string ServerHelp() {
  std::ostringstream os;
  os << "usage: kvd server --l1-size-gb X --eviction-policy POLICY [options]\n\n"
        "kvd's drop-in for `lmcache server` (0.5.6): the same flags, grouped as lmcache groups\n"
        "them. Each says what kvd does with it; \"accepted, no effect\" flags are listed once\n"
        "at startup, refused ones stop startup with one line naming them (exit 2).\n"
        "Environment: LMCACHE_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR, CRITICAL) sets the log\n"
        "level when --log-level is not given. Full table: docs/cli.md.\n";
  std::vector<std::string> groups;
  for (const auto& f : ServerFlags()) {
    if (f.origin == Origin::kLmcacheEnv) continue;
    if (std::find(groups.begin(), groups.end(), f.group) == groups.end()) groups.push_back(f.group);
  }
  for (const auto& g : groups) {
    os << "\n" << g << ":\n";
    for (const auto& f : ServerFlags()) {
      if (f.hidden || f.origin == Origin::kLmcacheEnv || g != f.group) continue;
      std::string left = "  " + Spelling(f);
      std::string help = Verdict(f);
      if (f.lmcache_default) help += std::string(" (lmcache default: ") + f.lmcache_default + ")";
      if (left.size() > 30) {
        os << left << "\n" << std::string(32, ' ');
      } else {
        os << left << std::string(32 - left.size(), ' ');
      }
      os << Wrap(help, 32, 100) << "\n";
    }
  }
  return os.str();
}

std::vector<std::string> StartupSummary(const CliConfig& config) {
  std::vector<std::string> lines;
  std::vector<std::string> groups;
  for (const auto& f : ServerFlags()) {
    if (f.show && std::find(groups.begin(), groups.end(), f.group) == groups.end()) {
      groups.push_back(f.group);
    }
  }
  for (const auto& g : groups) {
    std::string line = g + ":";
    for (const auto& f : ServerFlags()) {
      if (!f.show || g != f.group) continue;
      std::string v = f.show(config);
      if (v.empty()) continue;
      std::string key = std::string(f.name).substr(2);
      std::replace(key.begin(), key.end(), '-', '_');
      line += " " + key + "=" + v;
    }
    lines.push_back(line);
  }
  return lines;
}

std::string FlagsJson() {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& f : ServerFlags()) {
    nlohmann::ordered_json r;
    r["name"] = f.name;
    r["negation"] = f.negation ? nlohmann::ordered_json(f.negation) : nullptr;
    r["short"] = f.short_name ? nlohmann::ordered_json(f.short_name) : nullptr;
    r["group"] = f.group;
    r["kind"] = KindName(f.kind);
    r["origin"] = OriginName(f.origin);
    r["lmcache_default"] = f.lmcache_default ? nlohmann::ordered_json(f.lmcache_default) : nullptr;
    r["choices"] = f.choices ? nlohmann::ordered_json(SplitBar(f.choices)) : nullptr;
    r["support"] = SupportName(f.support);
    r["serves"] = f.serves ? nlohmann::ordered_json(SplitBar(f.serves)) : nullptr;
    r["accepts"] = f.accepts ? nlohmann::ordered_json(SplitBar(f.accepts)) : nullptr;
    r["accept_note"] = f.accept_note ? nlohmann::ordered_json(f.accept_note) : nullptr;
    r["note"] = f.note;
    r["refusal"] = f.refusal ? nlohmann::ordered_json(f.refusal) : nullptr;
    if (HasRange(f)) r["range"] = {f.min, f.max};
    r["hidden"] = f.hidden;
    rows.push_back(std::move(r));
  }
  return rows.dump(1);
}

std::string FlagsMarkdown() {
  std::ostringstream os;
  os << "| flag | lmcache default | kvd | what kvd does |\n|---|---|---|---|\n";
  std::string group;
  for (const auto& f : ServerFlags()) {
    if (f.group != group) {
      group = f.group;
      os << "| **" << group << "** | | | |\n";
    }
    auto code = [](const char* n) {
      std::string c(1, '`');
      c.append(n);
      c.push_back('`');
      return c;
    };
    std::string name = code(f.name);
    if (f.negation) name.append(" / ").append(code(f.negation));
    if (f.short_name) name.append(" / ").append(code(f.short_name));
    if (f.hidden) name += " (hidden)";
    std::string status = SupportName(f.support);
    if (f.serves) {
      std::vector<std::string> vals = SplitBar(f.serves);
      for (auto& v : vals) v = v.empty() ? "\"\"" : v;
      status += " (" + Join(vals, ", ") + " only)";
    }
    std::string what = f.note;
    if (f.accepts) {
      what += "; " + Join(SplitBar(f.accepts), ", ") + " accepted, no effect: " +
              (f.accept_note ? f.accept_note : "");
    }
    if (f.refusal) what += "; other values refused: " + std::string(f.refusal);
    if (f.origin == Origin::kKvd) what = "kvd only: " + what;
    std::string def = f.lmcache_default ? f.lmcache_default : "";
    for (std::string* s : {&what, &def}) {
      std::string esc;
      for (char ch : *s) esc += ch == '|' ? std::string("\\|") : std::string(1, ch);
      *s = esc;
    }
    os << "| " << name << " | " << def << " | " << status << " | " << what << " |\n";
  }
  return os.str();
}

}  // namespace kvd::cli
