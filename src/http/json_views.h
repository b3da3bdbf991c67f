// JSON bodies of the HTTP endpoints, built from a Snapshot. Pure functions.
#pragma once

#include <string>

#include "http/stats_source.h"

namespace kvd::http {

// GET /status.
std::string StatusJson(const Snapshot& s, const Health& health, const std::string& version);
// GET /version.
std::string VersionJson(const std::string& version);

}  // namespace kvd::http
