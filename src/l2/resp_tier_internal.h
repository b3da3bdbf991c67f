// RespTier (internal): the helper shared by resp_tier.cc (construction, workers, per-item
// operations, the Tier interface) and resp_tier_routing.cc (connections, cluster routing,
// health). A pure function of its arguments: no state, callable from any thread. Not for use
// outside these two files.
#pragma once

#include <string_view>

namespace kvd::l2::detail {

inline bool StartsWith(std::string_view s, std::string_view p) { return s.rfind(p, 0) == 0; }

}  // namespace kvd::l2::detail
