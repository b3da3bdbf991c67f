// kvd's own rows of the flags table (flags_table_parts.h): the settings `lmcache server`
// does not have, in group "kvd extensions", after lmcache's in --help and docs/cli.md.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cli/flags_table_parts.h"

namespace kvd::cli::flag_rows {
namespace {

using K = FlagKind;
using S = Support;
using O = Origin;

constexpr const char* kKvdGroup = "kvd extensions";

const FlagSpec kRows[] = {
    // ---- kvd's own flags ----
    {.name = "--log-level", .group = kKvdGroup, .kind = K::kChoice, .origin = O::kKvd,
     .lmcache_default = "info", .choices = "trace|debug|info|warning|warn|error|critical",
     .note = "log level (overrides LMCACHE_LOG_LEVEL)",
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.log_level = v.text == "warning" ? "warn" : v.text;
       c.log_level_source = "--log-level";
     },
     .show = [](const CliConfig& c) { return c.log_level + " (" + c.log_level_source + ")"; }},
    {.name = "--check-config", .group = kKvdGroup, .kind = K::kSwitch, .origin = O::kKvd,
     .lmcache_default = "false",
     .note = "validate the command line, print the startup summary and the ignored flags, "
             "exit 0 without starting",
     .apply = [](const FlagValue&, CliConfig& c) { c.check_only = true; }},
    {.name = "--allowed-shm-uid", .group = kKvdGroup, .kind = K::kList, .origin = O::kKvd,
     .lmcache_default = "the uid kvd runs as",
     .note = "uids whose POSIX shared-memory segments REGISTER_KV_CACHE may map (checked with "
             "fstat on the opened segment); give every uid the vLLM workers run as",
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.allowed_shm_uids.clear();
       for (const auto& item : v.items) {
         char* end = nullptr;
         const unsigned long uid = std::strtoul(item.c_str(), &end, 10);
         if (!item.empty() && *end == '\0' && uid <= 0xffffffffUL) {
           c.server.allowed_shm_uids.push_back(static_cast<uint32_t>(uid));
         }
       }
     },
     .show = [](const CliConfig& c) {
       std::string s;
       for (uint32_t u : c.server.allowed_shm_uids) {
         if (!s.empty()) s += ',';
         s += std::to_string(u);
       }
       return s.empty() ? std::string("own uid") : s;
     }},
    {.name = "--allowed-shm-prefix", .group = kKvdGroup, .kind = K::kString, .origin = O::kKvd,
     .lmcache_default = "\"\" (any name)",
     .note = "REGISTER_KV_CACHE maps only segments whose name starts with this (lmcache's CPU "
             "workers name theirs lmcache_kv_<pid>_<n>)",
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.allowed_shm_prefix = v.text.size() > 0 && v.text[0] == '/' ? v.text.substr(1) : v.text;
     },
     .show = [](const CliConfig& c) { return c.server.allowed_shm_prefix; }},
    {.name = "--blend-lmcache-parity", .group = kKvdGroup, .kind = K::kSwitch, .origin = O::kKvd,
     .lmcache_default = "false",
     .note = "--engine-type blend only: the matcher answers exactly as lmcache 0.5.6's (no "
             "digest check, one fingerprint per slot, chunk 0 of a prompt not registered, "
             "removal by strikes), for differential tests",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.blend_lmcache_parity = v.AsBool(); },
     .show = [](const CliConfig& c) { return std::string(c.server.blend_lmcache_parity ? "true" : "false"); }},
    {.name = "--max-sessions", .group = kKvdGroup, .kind = K::kInt, .origin = O::kKvd,
     .lmcache_default = "65536",
     .note = "live request sessions kept at most; the least recently used is dropped beyond "
             "(a dropped session's chunks are hashed again on its next request); also the "
             "bound on lookup read-lock holds (the oldest are released early beyond) and on "
             "LOOKUP results waiting to be taken (the oldest are dropped beyond)",
     .min = 1, .max = 1e9,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.max_sessions = static_cast<uint64_t>(v.AsInt());
     },
     .show = [](const CliConfig& c) { return Num(static_cast<double>(c.server.max_sessions)); }},
    {.name = "--max-session-memory-mb", .group = kKvdGroup, .kind = K::kInt, .origin = O::kKvd,
     .lmcache_default = "1024",
     .note = "MiB all request sessions (token ids and chunk hashes) may hold, and apart "
             "from them the LOOKUP results waiting to be taken; the least recently used are "
             "dropped beyond",
     .min = 1, .max = 1e7,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.max_session_bytes = static_cast<uint64_t>(v.AsInt()) << 20;
     },
     .show = [](const CliConfig& c) {
       return Num(static_cast<double>(c.server.max_session_bytes >> 20));
     }},
    {.name = "--engine-driven-max-held-fraction", .group = kKvdGroup, .kind = K::kFloat,
     .origin = O::kKvd, .lmcache_default = "0.5",
     .note = "fraction of L1 that engine-driven PREPARE_STORE staging objects and "
             "PREPARE_RETRIEVE pins not yet committed may hold, all workers together",
     .min = 0.01, .max = 1,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.engine_driven_max_held_fraction = v.AsFloat();
     },
     .show = [](const CliConfig& c) { return Num(c.server.engine_driven_max_held_fraction); }},
    {.name = "--engine-driven-instance-held-fraction", .group = kKvdGroup, .kind = K::kFloat,
     .origin = O::kKvd, .lmcache_default = "0.25",
     .note = "fraction of L1 the uncommitted engine-driven prepares of one worker (instance) "
             "may hold; beyond, its holds older than --engine-driven-shed-age-seconds are "
             "shed, else a store gets the chunks that fit and a retrieve is refused",
     .min = 0.001, .max = 1,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.engine_driven_instance_held_fraction = v.AsFloat();
     },
     .show = [](const CliConfig& c) { return Num(c.server.engine_driven_instance_held_fraction); }},
    {.name = "--engine-driven-hold-timeout-seconds", .group = kKvdGroup, .kind = K::kFloat,
     .origin = O::kKvd, .lmcache_default = "60",
     .note = "an engine-driven PREPARE_STORE / PREPARE_RETRIEVE not committed within this "
             "time is dropped (its staging objects freed, its pins released), pings or not",
     .min = 0.1, .max = 1e6,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.engine_driven_hold_timeout_seconds = v.AsFloat();
     },
     .show = [](const CliConfig& c) { return Num(c.server.engine_driven_hold_timeout_seconds); }},
    {.name = "--engine-driven-shed-age-seconds", .group = kKvdGroup, .kind = K::kFloat,
     .origin = O::kKvd, .lmcache_default = "5",
     .note = "an uncommitted engine-driven prepare may be shed to make room for newer ones "
             "once it is this old (younger ones are never shed: the worker may be copying)",
     .min = 0, .max = 1e6,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.engine_driven_shed_age_seconds = v.AsFloat();
     },
     .show = [](const CliConfig& c) { return Num(c.server.engine_driven_shed_age_seconds); }},
    {.name = "--chunk-key-memo-mb", .group = kKvdGroup, .kind = K::kInt, .origin = O::kKvd,
     .lmcache_default = "32",
     .note = "MiB for the keys of recently hashed chunks, shared by all requests: a prefix "
             "many requests send is hashed once (entries compared byte for byte, kept per "
             "cache salt); 0 turns it off",
     .min = 0, .max = 1e6,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.chunk_key_memo_bytes = static_cast<uint64_t>(v.AsInt()) << 20;
     },
     .show = [](const CliConfig& c) {
       return Num(static_cast<double>(c.server.chunk_key_memo_bytes >> 20));
     }},
    {.name = "--metrics-max-label-sets", .group = kKvdGroup, .kind = K::kInt, .origin = O::kKvd,
     .lmcache_default = "256",
     .note = "label sets kept per labelled metric family in /metrics (lookup series: "
             "(model_name, cache_salt) pairs); beyond, counts go to the \"__other__\" label set "
             "(docs/metrics.md)",
     .min = 1, .max = 65536,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.metrics_max_label_sets = static_cast<uint64_t>(v.AsInt());
     },
     .show = [](const CliConfig& c) {
       return Num(static_cast<double>(c.server.metrics_max_label_sets));
     }},
    {.name = "--l1-populate", .group = kKvdGroup, .kind = K::kChoice, .origin = O::kKvd,
     .lmcache_default = "all", .choices = "all|ahead|off",
     .note = "L1 pages zeroed and mapped by a background thread ahead of the stores that write "
             "them, so that stores into fresh L1 take no page faults. all: 1 GiB ahead of the "
             "allocator, then, while idle, the rest of L1 as far as it has grown; ahead: the "
             "1 GiB only; off: the first store into a page faults it in. Never below 1 GiB "
             "(or 1/16 of the memory) left free on the host or in kvd's memory cgroup",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_populate = v.text; },
     .show = [](const CliConfig& c) { return c.server.l1_populate; }},
    {.name = "--admin-token", .group = kKvdGroup, .kind = K::kString, .origin = O::kKvd,
     .lmcache_default = "none",
     .note = "HTTP routes that change state (POST, PUT, DELETE) need 'Authorization: Bearer "
             "<token>' and nothing else; without it they need a Host naming this kvd (an IP "
             "address, localhost, --http-host, the hostname) and no foreign Origin. Every "
             "local user can read a command line: prefer --admin-token-file",
     .apply = [](const FlagValue& v, CliConfig& c) { c.http.admin_token = v.text; },
     .show = [](const CliConfig& c) {
       return std::string(c.http.admin_token.empty() && c.http.admin_token_file.empty() ? "none" : "set");
     }},
    {.name = "--admin-token-file", .group = kKvdGroup, .kind = K::kString, .origin = O::kKvd,
     .lmcache_default = "none",
     .note = "--admin-token read from the first line of this file at startup (keep it "
             "readable by kvd's user only)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.http.admin_token_file = v.text; },
     .show = [](const CliConfig& c) { return c.http.admin_token_file; }},
    {.name = "--p2p-directory", .group = kKvdGroup, .kind = K::kString, .origin = O::kKvd,
     .lmcache_default = "none",
     .note = "the P2P fleet directory every kvd of the fleet uses: "
             "redis://[[user]:password@]host:port[/db] of a standalone Redis or Valkey, or "
             "redis-cluster://[[user]:password@]host:port of a seed of a Cluster; needed by "
             "--p2p-advertise-url",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_directory = v.text; },
     .show = [](const CliConfig& c) { return std::string(c.server.p2p_directory.empty() ? "none" : "set"); }},
    {.name = "--p2p-secret-file", .group = kKvdGroup, .kind = K::kString, .origin = O::kKvd,
     .lmcache_default = "none",
     .note = "the fleet's shared secret, the first line of this file (1 to 4096 bytes; keep it "
             "readable by kvd's user only): peers that do not present it are refused; needed by "
             "--p2p-advertise-url",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_secret_file = v.text; },
     .show = [](const CliConfig& c) { return c.server.p2p_secret_file; }},
    {.name = "--p2p-ucx-tls", .group = kKvdGroup, .kind = K::kString, .origin = O::kKvd,
     .lmcache_default = "none",
     .note = "UCX transports for P2P, in UCX_TLS's syntax (e.g. tcp, or rc,sm,self); none: "
             "UCX chooses",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_ucx_tls = v.text; },
     .show = [](const CliConfig& c) { return c.server.p2p_ucx_tls; }},
    {.name = "--http-request-timeout-seconds", .group = kKvdGroup, .kind = K::kFloat,
     .origin = O::kKvd, .lmcache_default = "10",
     .note = "an HTTP request (head and body) must arrive whole within this many seconds of "
             "its first byte, else it is answered 408 and its connection closed; a connection "
             "waiting for a request is closed after 5 s",
     .min = 0.1, .max = 3600,
     .apply = [](const FlagValue& v, CliConfig& c) { c.http.request_timeout_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.http.request_timeout_seconds); }},
    {.name = "--max-connections", .group = kKvdGroup, .kind = K::kInt, .origin = O::kKvd,
     .lmcache_default = "1024",
     .note = "client connections on the request port at most; a new one beyond replaces the "
             "connection that has waited longest for its ZMTP handshake, else it is closed at once "
             "(a connection that finished its handshake is never closed for a newcomer)",
     .min = 1, .max = 1e6,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.max_connections = static_cast<uint32_t>(v.AsInt()); },
     .show = [](const CliConfig& c) { return Num(c.server.max_connections); }},
    {.name = "--max-connections-per-address", .group = kKvdGroup, .kind = K::kInt, .origin = O::kKvd,
     .lmcache_default = "256",
     .note = "client connections on the request port from one IP address at most (as "
             "--max-connections, within that address)",
     .min = 1, .max = 1e6,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.max_connections_per_address = static_cast<uint32_t>(v.AsInt());
     },
     .show = [](const CliConfig& c) { return Num(c.server.max_connections_per_address); }},
    {.name = "--fd-reserve", .group = kKvdGroup, .kind = K::kInt, .origin = O::kKvd,
     .lmcache_default = "256",
     .note = "descriptors kept free for tier files and sockets and HTTP (at most half of "
             "RLIMIT_NOFILE, whose soft limit kvd raises to the hard one): a connection on the "
             "request port is not kept on a descriptor past the limit less this",
     .min = 0, .max = 1e6,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.fd_reserve = static_cast<uint32_t>(v.AsInt()); },
     .show = [](const CliConfig& c) { return Num(c.server.fd_reserve); }},
    {.name = "--handshake-timeout-seconds", .group = kKvdGroup, .kind = K::kFloat, .origin = O::kKvd,
     .lmcache_default = "30",
     .note = "a connection on the request port must finish its ZMTP handshake (greeting and "
             "READY) within this, else it is closed (libzmq's ZMQ_HANDSHAKE_IVL); 0: no limit. "
             "Connections that finished it are never closed for being idle",
     .min = 0, .max = 3600,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.handshake_timeout_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.handshake_timeout_seconds); }},
    {.name = "--list-flags", .group = kKvdGroup, .kind = K::kChoice, .origin = O::kKvd,
     .choices = "json|markdown",
     .note = "print this table of flags (as docs/cli.md shows it) and exit",
     .apply = [](const FlagValue& v, CliConfig& c) { c.list_flags = v.text; }},
};

}  // namespace

std::span<const FlagSpec> Kvd() { return kRows; }

}  // namespace kvd::cli::flag_rows
