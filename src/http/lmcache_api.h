// The routes of lmcache 0.5.6's HTTP API that kvd answers with lmcache's shapes
// (lmcache/v1/multiprocess/http_apis and internal_api_server/common), as pure functions of
// a request: HttpServer (http_server.h) routes to them. docs/operations.md lists each route,
// its shape and where kvd differs.
//
// Errors follow FastAPI's shapes: a body or query that does not validate answers 422
// {"detail":[{"type","loc","msg","input"}]}; a request the server cannot serve answers
// 400 / 404 / 503 {"detail": "..."} as lmcache's cache-control services do.
//
// Threads: every function is safe to call concurrently (the StatsSource is thread-safe).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>
#include <map>
#include <string>
#include <string_view>

#include "http/stats_source.h"

namespace kvd::http {

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // beyond Content-Type
};

// Query parameters, as httplib gives them (a name may repeat; the first value counts).
using QueryParams = std::multimap<std::string, std::string>;

// GET / for clients that do not ask for HTML: {"status":"ok","service":"LMCache HTTP API"}.
Reply RootReply();
// True when the Accept header prefers HTML (a browser): GET / then serves the dashboard.
bool WantsHtml(std::string_view accept);

// POST /cache/clear, body {"tier":"l1","force":false} (absent or empty: the defaults).
Reply ClearCacheReply(AdminPort& admin, std::string_view body);
// GET /cache/objects?tier&adapter&model_name&page_size&page_token.
Reply ListObjectsReply(StatsSource& source, const QueryParams& q);
// DELETE /cache/objects, body {"keys":[EncodedObjectKey...],"tier","force","adapter"}.
Reply DeleteObjectsReply(StatsSource& source, AdminPort& admin, std::string_view body);
// POST /cache/prefetches, body {model_name, world_size, token_ids, cache_salt, source_tier,
// target_tier}: validated as lmcache validates it (the model must be registered here, a
// sub-chunk sequence is a no-op), then 503 without tiers and 501 with them (kvd prefetches
// from its tiers on LOOKUP only); GET /cache/prefetches/{id}: 404 (no id is ever handed out).
Reply SubmitPrefetchReply(StatsSource& source, std::string_view body);
Reply PrefetchStatusReply(std::string_view request_id);

// GET /loglevel[?logger_name] (text/plain, lmcache's wording): the levels. lmcache's GET
// also sets a level when given `logger_name` and `level`; kvd's GET never changes state: a
// valid level there answers 405 naming POST /loglevel (an invalid one 400, as lmcache).
Reply LogLevelReply(const QueryParams& q);
// POST /loglevel?logger_name&level: sets the level (kvd has one logger: any name sets it),
// answering lmcache's text; `level` is required (422 without it, 400 when unknown).
Reply SetLogLevelReply(const QueryParams& q);
// GET /threads[?name&thread_id] (text/plain): the process's threads from /proc/self/task.
Reply ThreadsReply(const QueryParams& q);

// GET /version, /lmc_version, /commit_id: JSON strings, as lmcache answers them.
Reply VersionStringReply(const std::string& version);
Reply LmcVersionReply();
Reply CommitIdReply(const std::string& version);

}  // namespace kvd::http
