// THE flags table of `kvd server` (see flags.h for what the fields mean): lmcache's rows
// (flags_table_lmcache.cc) then kvd's own (flags_table_kvd.cc), joined once. docs/cli.md shows
// it (`kvd server --list-flags markdown`; tests/integration/test_cli_flags.py checks both).
// How to add or implement a flag: flags_table_parts.h.
#include <vector>

#include "cli/flags.h"
#include "cli/flags_table_parts.h"

namespace kvd::cli {

std::span<const FlagSpec> ServerFlags() {
  // Built once, on first use, and never changed after.
  static const std::vector<FlagSpec> kAll = [] {
    std::vector<FlagSpec> all(flag_rows::Lmcache().begin(), flag_rows::Lmcache().end());
    all.insert(all.end(), flag_rows::Kvd().begin(), flag_rows::Kvd().end());
    return all;
  }();
  return kAll;
}

}  // namespace kvd::cli
