// The `kvd server` command line: one table (ServerFlags(), flags_table.cc) lists every flag of
// `lmcache server` 0.5.6, the environment variables it reads, and kvd's own flags, each with
// what kvd does with it. The parser, `--help`, the startup summary, `--list-flags` (which
// tests/integration/test_cli_flags.py and docs/cli.md follow) are all driven by that table.
//
// Per flag and value kvd does one of three things (Support):
//   kImplemented  the flag works as in lmcache (or as documented in docs/cli.md);
//   kAccepted     the flag is accepted and changes nothing, because in kvd it has nothing to
//                 act on; `note` says why. Such flags given on the command line are listed
//                 once at startup at info level;
//   kRefused      startup stops with one line naming the flag and `note` (why), exit 2.
// `serves` narrows a row to some values ("LRU", "4096", "" for an empty string, "false" for a
// --no-x form): those get `support`; values in `accepts` are accepted with no effect
// (`accept_note` says why); every other valid value is refused with `refusal`.
//
// Errors are one line without a trailing newline, e.g. "--port abc: not an integer" (the
// caller prefixes "kvd: " and exits 2): a value of the wrong type, out of range, not one of
// the choices, or JSON that does not parse; an unknown flag; a refused flag or value; a
// missing required flag; flags that contradict each other.
//
// Thread-compatible: pure functions over immutable data.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli_config.h"
#include "common/status.h"

namespace kvd::cli {

enum class FlagKind : uint8_t {
  kHelp,       // -h/--help
  kSwitch,     // present or not (argparse store_true); value "true"
  kBool,       // --x / --no-x (argparse BooleanOptionalAction); value "true" / "false"
  kInt,
  kFloat,
  kString,
  kChoice,     // one of `choices`
  kJson,       // one JSON object
  kJsonList,   // a JSON object per occurrence (argparse append)
  kList,       // zero or more words after the flag (argparse nargs='*')
};

enum class Support : uint8_t { kImplemented, kAccepted, kRefused };

// Where a row comes from: a flag of `lmcache server` 0.5.6, an environment variable that
// lmcache reads, or a flag only kvd has.
enum class Origin : uint8_t { kLmcache, kLmcacheEnv, kKvd };

// One given flag, as parsed.
struct FlagValue {
  std::string text;                // the value (kSwitch/kBool: "true"/"false"; kList: joined)
  std::vector<std::string> items;  // kList / kJsonList: each item
  int64_t AsInt() const;           // valid for kInt after validation
  double AsFloat() const;          // valid for kFloat after validation
  bool AsBool() const { return text == "true"; }
};

struct FlagSpec {
  const char* name;                 // "--l1-size-gb", or the variable name for kLmcacheEnv
  const char* negation = nullptr;   // kBool: "--no-l1-use-lazy"
  const char* short_name = nullptr; // "-q"
  const char* group = nullptr;      // lmcache's --help group ("MP Server", ...)
  FlagKind kind = FlagKind::kString;
  Origin origin = Origin::kLmcache;
  const char* lmcache_default = nullptr;  // as lmcache 0.5.6 has it; nullptr: none
  const char* choices = nullptr;    // kChoice: '|'-separated values lmcache allows
  Support support = Support::kImplemented;
  const char* serves = nullptr;     // '|'-separated values that get `support`; nullptr: all
  const char* accepts = nullptr;    // values outside `serves` accepted with no effect ...
  const char* accept_note = nullptr;  // ... and why
  const char* note = "";            // implemented: what it does; accepted/refused: why
  const char* refusal = nullptr;    // why the other values are refused
  double min = -1e300;              // kInt/kFloat: inclusive range
  double max = 1e300;
  bool hidden = false;              // not in --help (lmcache hides it too)
  // Implemented values: stores the value into the config.
  void (*apply)(const FlagValue& value, CliConfig& config) = nullptr;
  // Implemented rows: the effective value, for the startup summary ("" to omit).
  std::string (*show)(const CliConfig& config) = nullptr;
};

// The table, in lmcache's --help order (groups as lmcache prints them), then kvd's flags.
std::span<const FlagSpec> ServerFlags();
const FlagSpec* FindFlag(const std::string& name);

// A flag or variable that was given, is accepted and has no effect.
struct IgnoredFlag {
  std::string flag;
  std::string value;
  std::string why;
};

struct ParsedCommandLine {
  CliConfig config;
  bool help = false;                   // -h/--help given: print ServerHelp() and exit 0
  std::vector<IgnoredFlag> ignored;    // in command-line order, each flag once
  // Settings another flag changed (e.g. --l1-use-hugepages turning lazy allocation off):
  // one line each, logged at startup.
  std::vector<std::string> notes;
};

// Reads the environment (LMCACHE_LOG_LEVEL, ...) through `getenv`, so tests can pass a map.
using EnvLookup = std::function<const char*(const char* name)>;

// Parses the arguments after `kvd server`. InvalidArgument carries the one-line error.
Result<ParsedCommandLine> ParseServerCommandLine(std::span<const std::string> args,
                                                 const EnvLookup& getenv);

// An admin token (--admin-token, or the line of --admin-token-file): 1 to 4096 visible ASCII
// characters, no blanks (what `Authorization: Bearer` can carry).
bool ValidAdminToken(std::string_view token);

// `kvd server --help`: usage and every visible flag, grouped as lmcache groups them.
std::string ServerHelp();
// The startup summary: one line per group with the effective values, e.g.
// "MP Server: host=localhost port=5555 ...". Implemented rows only.
std::vector<std::string> StartupSummary(const CliConfig& config);
// Every row as JSON (for tests and tools) or as the markdown table in docs/cli.md.
std::string FlagsJson();
std::string FlagsMarkdown();

}  // namespace kvd::cli
