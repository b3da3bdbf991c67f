// The /quota routes (lmcache's per-cache-salt quota API): GETs read a StatsSource, PUT and
// DELETE change quotas through the AdminPort:
//   PUT    /quota/{salt}  {"limit_gb": x}  -> {"cache_salt", "limit_gb", "status": "ok"}
//   GET    /quota/{salt}                   -> {"cache_salt", "limit_gb", "current_usage_gb", "exists"}
//   DELETE /quota/{salt}                   -> {"cache_salt", "status": "removed" | "not_found"}
//   GET    /quota                          -> {"users": {salt: {"limit_gb", "current_usage_gb"}}}
// `_default` in a path (and in answers) is the empty salt, un-salted traffic. GB are GiB
// (2^30 bytes), as in lmcache. A bad body or limit gets 400 {"error": ...} and changes nothing.
// Threads: the handlers run on httplib's worker threads; the source is thread-safe.
#pragma once

#include "http/routes.h"
#include "http/stats_source.h"

namespace kvd::http {

void AddQuotaRoutes(Router& router, StatsSource* source, AdminPort* admin);

}  // namespace kvd::http
