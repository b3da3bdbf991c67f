// CheckModelName: the one rule for the model names clients send (registrations, keys, the
// HTTP object routes). A model name ends up in L1 namespaces, KV events and tier object keys
// (lmcache's spelling, l2/object_key.h: '/' written as "-SEP-", '@' separating fields), so a
// name that could be confused with another once spelled there is refused:
//   - empty, unless `allow_empty` (a name that selects objects rather than registering);
//   - longer than kMaxModelNameBytes (it is kept per namespace and echoed in logs);
//   - containing '@' (the field separator of lmcache's object keys);
//   - containing "-SEP-" (issue 27, finding 5: "org-SEP-model" and "org/model" would be the
//     same tier object key, so one deployment would read the other's KV).
// Pure function.
#pragma once

#include <cstddef>
#include <string_view>

#include "common/status.h"

namespace kvd {

inline constexpr size_t kMaxModelNameBytes = 1024;

Status CheckModelName(std::string_view name, bool allow_empty = false);

}  // namespace kvd
