// The two halves of `kvd server`'s flags table (flags.h; ServerFlags() in flags_table.cc
// joins them): lmcache's flags and environment variables, in the order and groups of
// `lmcache server` 0.5.6's --help (flags_table_lmcache.cc), and kvd's own flags
// (flags_table_kvd.cc). They change for different reasons: lmcache's rows when lmcache's
// parser does (tests/integration/test_cli_flags.py compares them with the real one), kvd's
// rows when kvd gains a setting.
//
// To implement a refused flag: set `support` to kImplemented (or widen `serves`), write
// `apply` (and `show`), say in `note` what it does, then regenerate the table in docs/cli.md
// (scripts/update-cli-doc.sh).
//
// Internal to cli/: immutable data, no state.
#pragma once

#include <cstdio>
#include <span>
#include <string>

#include "cli/flags.h"

namespace kvd::cli::flag_rows {

// lmcache's flags and variables, in its --help order.
std::span<const FlagSpec> Lmcache();
// kvd's own flags (group "kvd extensions").
std::span<const FlagSpec> Kvd();

// How `show` prints a number and a bool in the startup summary.
inline std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
inline std::string Bool(bool b) { return b ? "true" : "false"; }

}  // namespace kvd::cli::flag_rows
