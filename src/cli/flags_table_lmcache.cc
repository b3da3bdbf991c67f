// lmcache's rows of the flags table (flags_table_parts.h): every flag of `lmcache server`
// 0.5.6, in the order and groups of its --help, then the environment variables lmcache reads.
// tests/integration/test_cli_flags.py checks these rows against the real lmcache's parser (a
// flag lmcache adds fails that test).
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

constexpr const char* kOptions = "options";
constexpr const char* kMp = "MP Server";
constexpr const char* kP2p = "P2P";
constexpr const char* kL1 = "L1 Memory Manager";
constexpr const char* kGds = "GDS L1 tier";
constexpr const char* kTtl = "L1 Manager TTL";
constexpr const char* kEviction = "Eviction Policy";
constexpr const char* kL2Policies = "L2 Policies";
constexpr const char* kL2Adapters = "L2 Adapters";
constexpr const char* kHttp = "HTTP Frontend";
constexpr const char* kObs = "Observability";
constexpr const char* kHashLog = "Lookup Hash Logging";
constexpr const char* kGc = "GC Monitoring";
constexpr const char* kExtraLog = "Extra Logging";
constexpr const char* kTrace = "Trace Recording";
constexpr const char* kCoordinator = "Coordinator";
constexpr const char* kEnv = "Environment";

constexpr const char* kNoCoordinator = "only used with --coordinator-url, which kvd refuses";
constexpr const char* kNoGds = "only used with --gds-l1-path, which kvd refuses";
constexpr const char* kNoHashLog = "only used with --lookup-hash-log-dir, which kvd refuses";
constexpr const char* kNoGc = "kvd has no garbage collector to monitor";
constexpr const char* kCliOutput =
    "output options of lmcache's command metrics; the server command prints none";

const FlagSpec kRows[] = {
    // ---- options (argparse's default group) ----
    {.name = "--help", .short_name = "-h", .group = kOptions, .kind = K::kHelp,
     .note = "show this help and exit"},
    {.name = "--l1-manager", .group = kOptions, .kind = K::kJsonList, .lmcache_default = "[]",
     .support = S::kRefused,
     .note = "tagged L1 managers (DRAM, DEVDAX, GDS) are not implemented; use --l1-size-gb"},

    // ---- MP Server ----
    {.name = "--instance-id", .group = kMp, .lmcache_default = "random UUID",
     .support = S::kAccepted,
     .note = "kvd joins no coordinator and exports no OpenTelemetry resource; the id is only "
             "shown in GET /config",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.instance_id = v.text; }},
    {.name = "--transport", .group = kMp, .kind = K::kChoice, .lmcache_default = "zmq",
     .choices = "zmq|grpc", .serves = "zmq", .note = "the request transport",
     .refusal = "the gRPC transport is not implemented (kvd serves ZMQ)"},
    {.name = "--host", .group = kMp, .lmcache_default = "localhost", .note = "ZMQ bind host",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.host = v.text; },
     .show = [](const CliConfig& c) { return c.server.host; }},
    {.name = "--port", .group = kMp, .kind = K::kInt, .lmcache_default = "5555",
     .note = "ZMQ bind port", .min = 1, .max = 65535,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.port = static_cast<int>(v.AsInt()); },
     .show = [](const CliConfig& c) { return std::to_string(c.server.port); }},
    {.name = "--chunk-size", .group = kMp, .kind = K::kInt, .lmcache_default = "256",
     .note = "tokens per chunk", .min = 1, .max = 1 << 20,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.chunk_size = v.AsInt(); },
     .show = [](const CliConfig& c) { return std::to_string(c.server.chunk_size); }},
    {.name = "--null-block-id", .group = kMp, .kind = K::kInt, .lmcache_default = "0",
     .note = "engine block id that holds no KV; chunks made only of it are not stored",
     .min = -(1LL << 62), .max = 1LL << 62,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.null_block_id = v.AsInt(); },
     .show = [](const CliConfig& c) { return std::to_string(c.server.null_block_id); }},
    {.name = "--max-workers", .group = kMp, .kind = K::kInt, .lmcache_default = "1",
     .note = "request worker threads; kvd's default 0 sizes the pool from the core count",
     .min = 0, .max = 256,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.max_workers = static_cast<int>(v.AsInt());
       c.max_workers_given = true;
     },
     .show = [](const CliConfig& c) {
       return c.server.max_workers == 0 ? std::string("auto") : std::to_string(c.server.max_workers);
     }},
    {.name = "--max-gpu-workers", .group = kMp, .kind = K::kInt, .lmcache_default = "--max-workers",
     .note = "kvd has one pool: without --max-workers the larger of --max-gpu-workers and "
             "--max-cpu-workers sizes it",
     .min = 1, .max = 256,
     .apply = [](const FlagValue& v, CliConfig& c) { c.max_gpu_workers = static_cast<int>(v.AsInt()); }},
    {.name = "--max-cpu-workers", .group = kMp, .kind = K::kInt, .lmcache_default = "--max-workers",
     .note = "see --max-gpu-workers", .min = 1, .max = 256,
     .apply = [](const FlagValue& v, CliConfig& c) { c.max_cpu_workers = static_cast<int>(v.AsInt()); }},
    {.name = "--grpc-server-workers", .group = kMp, .kind = K::kInt, .lmcache_default = "32",
     .support = S::kAccepted, .note = "only used by --transport grpc, which kvd refuses",
     .min = 1, .max = 1 << 16},
    {.name = "--hash-algorithm", .group = kMp, .kind = K::kChoice, .lmcache_default = "blake3",
     .choices = "builtin|sha256_cbor|blake3", .serves = "blake3", .note = "chunk hash",
     .refusal = "kvd hashes chunks with blake3 only (the lmcache 0.5.6 client's default)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.hash_algorithm = v.text; },
     .show = [](const CliConfig& c) { return c.server.hash_algorithm; }},
    {.name = "--engine-type", .group = kMp, .kind = K::kChoice, .lmcache_default = "default",
     .choices = "default|blend",
     .note = "default: prefix caching; blend: CacheBlend's non-prefix reuse (ops cb_*; "
             "needs lmcache-driven transfers, refused with --supported-transfer-mode "
             "engine_driven)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.engine_type = v.text; },
     .show = [](const CliConfig& c) { return c.server.engine_type; }},
    {.name = "--supported-transfer-mode", .group = kMp, .kind = K::kChoice,
     .lmcache_default = "lmcache_driven", .choices = "lmcache_driven|engine_driven|auto",
     .note = "which transfer paths are served: lmcache_driven (STORE/RETRIEVE), engine_driven "
             "(PREPARE/COMMIT into the shared L1 pool) or auto (both); kvd's default is auto",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.supported_transfer_mode = v.text; },
     .show = [](const CliConfig& c) { return c.server.supported_transfer_mode; }},
    {.name = "--isolated-ipc", .negation = "--no-isolated-ipc", .group = kMp, .kind = K::kBool,
     .lmcache_default = "false", .serves = "false", .accepts = "true",
     .accept_note = "kvd follows each GPU worker's own mode whatever this flag says: a worker "
                    "started with lmcache.mp.isolated_ipc registers `cuda_raw` descriptors and "
                    "sends timeline-semaphore events, and gets timeline-semaphore events back",
     .note = "kvd follows each GPU worker's own mode: CUDA IPC event handles for torch `cuda` "
             "descriptors, timeline-semaphore events for lmcache's isolated-IPC `cuda_raw` ones"},
    {.name = "--runtime-plugin-locations", .group = kMp, .kind = K::kList, .lmcache_default = "[]",
     .serves = "", .note = "no runtime plugins",
     .refusal = "runtime plugins (scripts lmcache launches beside the server) are not run by kvd"},
    {.name = "--runtime-plugin-config", .group = kMp, .kind = K::kJson, .lmcache_default = "{}",
     .support = S::kAccepted, .note = "only read by runtime plugins, which kvd does not run"},
    {.name = "--shm-name", .group = kMp, .lmcache_default = "\"\" (no shared pool)",
     .note = "POSIX shared-memory name of the L1 pool; kvd always shares L1 (engine-driven "
             "workers map it), \"\" names it kvd_l1_pool_<pid>",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.shm_name = v.text; },
     .show = [](const CliConfig& c) { return c.server.shm_name; }},
    {.name = "--script-allowed-imports", .group = kMp, .kind = K::kList, .lmcache_default = "[]",
     .support = S::kAccepted, .note = "only used by POST /run_script, which kvd does not serve"},
    {.name = "--run-script-api-enabled", .negation = "--no-run-script-api-enabled", .group = kMp,
     .kind = K::kBool, .lmcache_default = "false", .serves = "false",
     .note = "POST /run_script stays off",
     .refusal = "kvd does not execute caller-supplied Python (POST /run_script)"},
    {.name = "--separate-object-groups", .negation = "--no-separate-object-groups", .group = kMp,
     .kind = K::kBool, .lmcache_default = "false", .serves = "false",
     .note = "kernel groups are not split per sliding-window size",
     .refusal = "one object group per sliding-window size is not implemented"},
    {.name = "--worker-reap-timeout-seconds", .group = kMp, .kind = K::kFloat,
     .lmcache_default = "120",
     .note = "forget workers that pinged and then went silent this long (0: never; else >= 30)",
     .min = 0, .max = 1e9,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.worker_reap_timeout_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.worker_reap_timeout_seconds); }},
    {.name = "--session-ttl-seconds", .group = kMp, .kind = K::kFloat, .lmcache_default = "600",
     .note = "idle request sessions, and LOOKUP results nobody took, are dropped after this "
             "long",
     .min = 1, .max = 1e9,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.session_ttl_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.session_ttl_seconds); }},
    {.name = "--worker-registration-grace-seconds", .group = kMp, .kind = K::kFloat,
     .lmcache_default = "3600",
     .note = "forget workers that registered but never pinged after this long (>= the reap "
             "timeout)",
     .min = 0, .max = 1e9,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.worker_registration_grace_seconds = v.AsFloat();
     },
     .show = [](const CliConfig& c) { return Num(c.server.worker_registration_grace_seconds); }},
    {.name = "--enable-segmented-prefix", .group = kMp, .kind = K::kSwitch,
     .lmcache_default = "false",
     .note = "--engine-type blend only: cb_unified_lookup also answers the chunks after a gap "
             "in the prompt's prefix that are still cached, at their own positions "
             "(segmented_prefix_segments: a pure load; the engine recomputes the gap)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.enable_segmented_prefix = v.AsBool(); },
     .show = [](const CliConfig& c) { return std::string(c.server.enable_segmented_prefix ? "true" : "false"); }},
    {.name = "--enable-dedup-content", .group = kMp, .kind = K::kSwitch,
     .lmcache_default = "false",
     .note = "--engine-type blend only: register a chunk's fingerprint once per content",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.enable_dedup_content = v.AsBool(); },
     .show = [](const CliConfig& c) { return std::string(c.server.enable_dedup_content ? "true" : "false"); }},
    {.name = "--enable-blend-reorder", .group = kMp, .kind = K::kSwitch,
     .lmcache_default = "false",
     .note = "--engine-type blend only: answer cb_reorder_plan with lmcache's planner "
             "(prompts recorded on stores; a plan's budget capped at 1 s)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.enable_blend_reorder = v.AsBool(); },
     .show = [](const CliConfig& c) { return std::string(c.server.enable_blend_reorder ? "true" : "false"); }},
    {.name = "--enable", .group = kMp, .kind = K::kList, .lmcache_default = "[]", .serves = "",
     .note = "no experimental transfer modules",
     .refusal = "the experimental transfer_query module (register_q_cache, store_q) is not "
                "implemented"},
    {.name = "--kv-event-log-size", .group = kMp, .kind = K::kInt, .lmcache_default = "32768",
     .note = "records (chunks stored into / removed from L1) kept for subscribe_kv_events "
             "streams and their replay; 0 turns the kv_event_stream capability off",
     .min = 0, .max = 1 << 24,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.kv_event_log_size = v.AsInt(); },
     .show = [](const CliConfig& c) { return std::to_string(c.server.kv_event_log_size); }},
    {.name = "--server-module", .group = kMp, .kind = K::kJsonList, .lmcache_default = "[]",
     .support = S::kRefused, .note = "out-of-tree Python server modules are not loaded by kvd"},

    // ---- P2P ----
    {.name = "--p2p-advertise-url", .group = kP2p, .lmcache_default = "\"\"",
     .note = "host:port where peers reach this node's P2P (UCX) listener; empty: P2P off. "
             "Needs --p2p-directory and --p2p-secret-file (docs/p2p.md)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_advertise_url = v.text; },
     .show = [](const CliConfig& c) { return c.server.p2p() ? c.server.p2p_advertise_url : std::string("off"); }},
    {.name = "--p2p-listen-url", .group = kP2p, .lmcache_default = "\"\"",
     .note = "host:port the P2P listener binds; empty: --p2p-advertise-url",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_listen_url = v.text; },
     .show = [](const CliConfig& c) { return c.server.p2p_listen_url; }},
    {.name = "--p2p-lookup-timeout", .group = kP2p, .kind = K::kFloat, .lmcache_default = "30",
     .note = "seconds a lookup waits for the fleet directory", .min = 0.001, .max = 3600,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_lookup_timeout_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.p2p_lookup_timeout_seconds); }},
    {.name = "--p2p-load-timeout", .group = kP2p, .kind = K::kFloat, .lmcache_default = "30",
     .note = "seconds one read from a peer may take; what has not arrived by then is a miss "
             "(a lookup also waits at most --l2-prefetch-timeout-seconds)",
     .min = 0.001, .max = 3600,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_load_timeout_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.p2p_load_timeout_seconds); }},
    {.name = "--p2p-transfer-engine", .group = kP2p, .kind = K::kChoice,
     .lmcache_default = "nixl", .choices = "nixl|mooncake_te|ucx", .serves = "ucx",
     .note = "ucx (kvd's default): peers' L1 objects move over UCX (RDMA, shared memory or TCP, "
             "as UCX chooses)",
     .refusal = "kvd moves P2P data with UCX only (--p2p-transfer-engine ucx); NIXL and Mooncake "
                "TE have their own wires, which kvd does not speak",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.p2p_transfer_engine = v.text; },
     .show = [](const CliConfig& c) { return c.server.p2p_transfer_engine; }},

    // ---- L1 Memory Manager ----
    {.name = "--l1-size-gb", .group = kL1, .kind = K::kFloat, .lmcache_default = "required",
     .note = "L1 (host memory) size in GiB; required", .min = 1e-6, .max = 1e7,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_size_gb = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.l1_size_gb); }},
    {.name = "--l1-use-lazy", .negation = "--no-l1-use-lazy", .group = kL1, .kind = K::kBool,
     .lmcache_default = "true",
     .note = "true: L1 hands out the first --l1-init-size-gb and grows it by 1 GiB steps up to "
             "--l1-size-gb as stores need room (before any eviction); false: all of --l1-size-gb "
             "at once. Either way the pool is sparse shared memory, shared with engine-driven "
             "workers, whose pages are populated in the background as far as L1 has grown "
             "(--l1-populate)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_use_lazy = v.AsBool(); },
     .show = [](const CliConfig& c) { return std::string(c.server.l1_use_lazy ? "true" : "false"); }},
    {.name = "--l1-init-size-gb", .group = kL1, .kind = K::kInt, .lmcache_default = "20",
     .note = "with --l1-use-lazy, the part of L1 handed out before it grows (GiB; capped at "
             "--l1-size-gb, as lmcache caps it)",
     .min = 0, .max = 1 << 20,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_init_size_gb = v.AsInt(); },
     .show = [](const CliConfig& c) { return std::to_string(c.server.l1_init_size_gb); }},
    {.name = "--l1-align-bytes", .group = kL1, .kind = K::kInt, .lmcache_default = "4096",
     .note = "alignment and allocation granularity of L1 objects, and of the pool's base "
             "address (a power of two, at most --l1-size-gb)",
     .min = 1, .max = 1 << 30,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_align_bytes = static_cast<uint64_t>(v.AsInt()); },
     .show = [](const CliConfig& c) { return std::to_string(c.server.l1_align_bytes); }},
    {.name = "--l1-use-hugepages", .negation = "--no-l1-use-hugepages", .group = kL1,
     .kind = K::kBool, .lmcache_default = "false",
     .note = "L1 in 2 MiB huge pages: the reserved pool (sysctl vm.nr_hugepages) when it has "
             "enough free pages, else transparent huge pages (one startup line says so); with "
             "neither kvd does not start, as lmcache. L1 is then private memory: refused with "
             "--shm-name or --supported-transfer-mode engine_driven, and it turns engine-driven "
             "transfers and lazy allocation off (docs/operations.md)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_use_hugepages = v.AsBool(); },
     .show = [](const CliConfig& c) { return Bool(c.server.l1_use_hugepages); }},
    {.name = "--l1-devdax-path", .group = kL1, .support = S::kRefused,
     .note = "a DAX device as L1 is not implemented"},

    // ---- GDS L1 tier ----
    {.name = "--gds-l1-path", .group = kGds, .support = S::kRefused,
     .note = "a GPUDirect Storage L1 tier is not implemented"},
    {.name = "--gds-l1-use-direct-io", .negation = "--no-gds-l1-use-direct-io", .group = kGds,
     .kind = K::kBool, .lmcache_default = "true", .support = S::kAccepted, .note = kNoGds},
    {.name = "--gds-l1-backend", .group = kGds, .kind = K::kChoice, .lmcache_default = "auto",
     .choices = "auto|cufile|hipfile|mufile|phx|ugds", .support = S::kAccepted, .note = kNoGds},

    // ---- L1 Manager TTL ----
    {.name = "--l1-write-ttl-seconds", .group = kTtl, .kind = K::kFloat, .lmcache_default = "600",
     .note = "write-lock TTL", .min = 1e-3, .max = 1e9,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_write_ttl_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.l1_write_ttl_seconds); }},
    {.name = "--l1-read-ttl-seconds", .group = kTtl, .kind = K::kFloat, .lmcache_default = "300",
     .note = "read-lock TTL", .min = 1e-3, .max = 1e9,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l1_read_ttl_seconds = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.l1_read_ttl_seconds); }},

    // ---- Eviction Policy ----
    {.name = "--eviction-policy", .group = kEviction, .kind = K::kChoice,
     .lmcache_default = "required", .choices = "LRU|ARC|IsolatedLRU|noop|S3-FIFO|LHD",
     .note = "L1 eviction policy; required (S3-FIFO and LHD are kvd's; docs/eviction.md compares them)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.eviction_policy = v.text; },
     .show = [](const CliConfig& c) { return c.server.eviction_policy; }},
    {.name = "--eviction-trigger-watermark", .group = kEviction, .kind = K::kFloat,
     .lmcache_default = "0.8", .note = "L1 usage fraction that triggers eviction",
     .min = 0.01, .max = 1,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.eviction_trigger_watermark = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.eviction_trigger_watermark); }},
    {.name = "--eviction-ratio", .group = kEviction, .kind = K::kFloat, .lmcache_default = "0.2",
     .note = "fraction of L1 freed per eviction round", .min = 0.001, .max = 1,
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.eviction_ratio = v.AsFloat(); },
     .show = [](const CliConfig& c) { return Num(c.server.eviction_ratio); }},

    // ---- L2 Policies ----
    {.name = "--l2-store-policy", .group = kL2Policies, .kind = K::kChoice,
     .lmcache_default = "default", .choices = "default|skip_l1",
     .note = "default: L1 keeps what it stored; skip_l1: a chunk's L1 copy goes once a tier "
             "holds it (docs/tiers.md)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l2_store_policy = v.text; },
     .show = [](const CliConfig& c) { return c.server.l2_store_policy; }},
    {.name = "--l2-prefetch-policy", .group = kL2Policies, .kind = K::kChoice,
     .lmcache_default = "default", .choices = "default|retain",
     .note = "default: chunks a lookup loads from a tier leave L1 after their retrieve; "
             "retain: they stay",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l2_prefetch_policy = v.text; },
     .show = [](const CliConfig& c) { return c.server.l2_prefetch_policy; }},
    {.name = "--l2-prefetch-max-in-flight", .group = kL2Policies, .kind = K::kInt,
     .lmcache_default = "8", .note = "lookups loading from the tiers at once; the others wait",
     .min = 1, .max = 1 << 20,
     .apply = [](const FlagValue& v, CliConfig& c) {
       c.server.l2_prefetch_max_in_flight = static_cast<int>(v.AsInt());
     },
     .show = [](const CliConfig& c) { return std::to_string(c.server.l2_prefetch_max_in_flight); }},
    {.name = "--periodic-notifier-interval-ms", .group = kL2Policies, .kind = K::kInt,
     .lmcache_default = "5", .support = S::kAccepted,
     .note = "kvd's completions are event driven: it has no periodic notifier", .min = 1,
     .max = 1 << 30},

    // ---- L2 Adapters ----
    {.name = "--l2-adapter", .group = kL2Adapters, .kind = K::kJsonList, .lmcache_default = "[]",
     .note = "a tier behind L1, lmcache's JSON: fs, fs_native, resp, valkey (standalone or "
             "cluster_mode); repeat in priority order (docs/tiers.md)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.server.l2_adapters = v.items; },
     .show = [](const CliConfig& c) { return std::to_string(c.server.l2_adapters.size()) + " tier(s)"; }},

    // ---- HTTP Frontend ----
    {.name = "--http-host", .group = kHttp, .lmcache_default = "127.0.0.1",
     .note = "HTTP bind host (admin API, /metrics, dashboard)",
     .apply = [](const FlagValue& v, CliConfig& c) { c.http.host = v.text; },
     .show = [](const CliConfig& c) { return c.http.host; }},
    {.name = "--http-port", .group = kHttp, .kind = K::kInt, .lmcache_default = "8080",
     .note = "HTTP bind port (0: no HTTP endpoints, a kvd extension)", .min = 0, .max = 65535,
     .apply = [](const FlagValue& v, CliConfig& c) { c.http.port = static_cast<int>(v.AsInt()); },
     .show = [](const CliConfig& c) { return std::to_string(c.http.port); }},

    // ---- Observability ----
    {.name = "--disable-observability", .group = kObs, .kind = K::kSwitch,
     .lmcache_default = "false",
     .note = "no metrics (GET /metrics answers 404) and no KV-event stream",
     .apply = [](const FlagValue&, CliConfig& c) {
       c.observability = false;
       c.http.metrics_enabled = false;
     },
     .show = [](const CliConfig& c) { return Bool(!c.observability); }},
    {.name = "--disable-metrics", .group = kObs, .kind = K::kSwitch, .lmcache_default = "false",
     .note = "GET /metrics answers 404",
     .apply = [](const FlagValue&, CliConfig& c) { c.http.metrics_enabled = false; },
     .show = [](const CliConfig& c) { return Bool(!c.http.metrics_enabled); }},
    {.name = "--disable-grpc-metrics", .group = kObs, .kind = K::kSwitch,
     .lmcache_default = "false", .support = S::kAccepted, .note = "kvd has no gRPC runtime"},
    {.name = "--disable-logging", .group = kObs, .kind = K::kSwitch, .lmcache_default = "false",
     .support = S::kAccepted,
     .note = "lmcache's event-bus logging subscribers; kvd has none (its log level is "
             "--log-level or LMCACHE_LOG_LEVEL)"},
    {.name = "--enable-tracing", .group = kObs, .kind = K::kSwitch, .lmcache_default = "false",
     .support = S::kRefused, .note = "OpenTelemetry spans are not exported by kvd"},
    {.name = "--otlp-endpoint", .group = kObs, .support = S::kRefused,
     .note = "OTLP export is not implemented; scrape GET /metrics instead"},
    {.name = "--event-bus-queue-size", .group = kObs, .kind = K::kInt, .lmcache_default = "10000",
     .support = S::kAccepted,
     .note = "kvd has no event bus (the KV-event log is sized by --kv-event-log-size)", .min = 1,
     .max = 1 << 30},
    {.name = "--prometheus-port", .group = kObs, .kind = K::kInt, .lmcache_default = "9090",
     .support = S::kAccepted,
     .note = "lmcache server 0.5.6 never opens it either: metrics are at GET /metrics on "
             "--http-port",
     .min = 0, .max = 65535},
    {.name = "--metrics-sample-rate", .group = kObs, .kind = K::kFloat, .lmcache_default = "0.01",
     .support = S::kAccepted,
     .note = "kvd has no sampled lifecycle histograms; its metrics count every request",
     .min = 0, .max = 1},

    // ---- Lookup Hash Logging ----
    {.name = "--lookup-hash-log-dir", .group = kHashLog, .lmcache_default = "\"\"", .serves = "",
     .note = "no lookup hash log", .refusal = "lookup hash logs are not written by kvd"},
    {.name = "--lookup-hash-log-rotation-interval", .group = kHashLog, .kind = K::kInt,
     .lmcache_default = "21600", .support = S::kAccepted, .note = kNoHashLog},
    {.name = "--lookup-hash-log-rotation-max-size", .group = kHashLog, .kind = K::kInt,
     .lmcache_default = "104857600", .support = S::kAccepted, .note = kNoHashLog},
    {.name = "--lookup-hash-log-max-files", .group = kHashLog, .kind = K::kInt,
     .lmcache_default = "100", .support = S::kAccepted, .note = kNoHashLog},

    // ---- GC Monitoring ----
    {.name = "--enable-gc-monitor", .group = kGc, .kind = K::kSwitch, .lmcache_default = "false",
     .support = S::kAccepted, .note = kNoGc},
    {.name = "--gc-monitor-min-pause-ms", .group = kGc, .kind = K::kFloat,
     .lmcache_default = "1.0", .support = S::kAccepted, .note = kNoGc},
    {.name = "--gc-monitor-top-objects", .group = kGc, .kind = K::kInt, .lmcache_default = "0",
     .support = S::kAccepted, .note = kNoGc},

    // ---- Extra Logging ----
    {.name = "--enable-extra-logging", .group = kExtraLog, .kind = K::kSwitch,
     .lmcache_default = "false",
     .note = "every --extra-logging-interval seconds, one info line with the store and "
             "retrieve throughput and the L1 usage",
     .apply = [](const FlagValue&, CliConfig& c) { c.extra_logging = true; },
     .show = [](const CliConfig& c) { return Bool(c.extra_logging); }},
    {.name = "--extra-logging-interval", .group = kExtraLog, .kind = K::kFloat,
     .lmcache_default = "10.0", .note = "seconds between extra-logging lines (at least 1)",
     .min = 1e-3, .max = 1e7,
     .apply = [](const FlagValue& v, CliConfig& c) { c.extra_logging_interval = v.AsFloat(); },
     .show = [](const CliConfig& c) {
       return c.extra_logging ? Num(c.extra_logging_interval) : std::string();
     }},

    // ---- Trace Recording ----
    {.name = "--trace-level", .group = kTrace, .kind = K::kChoice, .choices = "storage|events",
     .support = S::kRefused, .note = "trace recording for `lmcache trace` replay is not implemented"},
    {.name = "--trace-output", .group = kTrace, .support = S::kAccepted,
     .note = "only used with --trace-level, which kvd refuses"},

    // ---- Coordinator ----
    {.name = "--coordinator-url", .group = kCoordinator, .lmcache_default = "$LMCACHE_COORDINATOR_URL",
     .serves = "", .note = "no coordinator",
     .refusal = "kvd does not register with an lmcache coordinator"},
    {.name = "--coordinator-advertise-ip", .group = kCoordinator, .support = S::kAccepted,
     .note = kNoCoordinator},
    {.name = "--coordinator-heartbeat-interval", .group = kCoordinator, .kind = K::kFloat,
     .lmcache_default = "5.0", .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-event-reporting", .group = kCoordinator, .kind = K::kSwitch,
     .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-event-flush-interval", .group = kCoordinator, .kind = K::kFloat,
     .lmcache_default = "1.0", .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-event-transport", .group = kCoordinator, .kind = K::kChoice,
     .lmcache_default = "http", .choices = "http|kafka", .support = S::kAccepted,
     .note = kNoCoordinator},
    {.name = "--coordinator-kafka-bootstrap-servers", .group = kCoordinator,
     .lmcache_default = "\"\"", .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-kafka-topic", .group = kCoordinator,
     .lmcache_default = "lmcache-cache-events", .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-kafka-delivery-timeout", .group = kCoordinator, .kind = K::kFloat,
     .lmcache_default = "300.0", .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-blend-timeout", .group = kCoordinator, .kind = K::kFloat,
     .lmcache_default = "1.0", .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-blend-match-concurrency", .group = kCoordinator, .kind = K::kInt,
     .lmcache_default = "8", .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "--coordinator-l2-event-reporting", .group = kCoordinator, .kind = K::kSwitch,
     .support = S::kAccepted,
     .note = "deprecated alias of --coordinator-event-reporting (the LMCache operator <= 0.5.2 "
             "passes it); only used with --coordinator-url, which kvd refuses",
     .hidden = true},
    {.name = "--coordinator-l2-event-flush-interval", .group = kCoordinator, .kind = K::kFloat,
     .support = S::kAccepted,
     .note = "deprecated alias of --coordinator-event-flush-interval (the LMCache operator "
             "<= 0.5.2 passes it); only used with --coordinator-url, which kvd refuses",
     .hidden = true},

    // ---- generic output options of every lmcache command (argparse's default group) ----
    {.name = "--format", .group = kOptions, .support = S::kAccepted, .note = kCliOutput},
    {.name = "--output", .group = kOptions, .support = S::kAccepted, .note = kCliOutput},
    {.name = "--quiet", .short_name = "-q", .group = kOptions, .kind = K::kSwitch,
     .lmcache_default = "false", .support = S::kAccepted, .note = kCliOutput},

    // ---- environment variables lmcache reads ----
    {.name = "LMCACHE_LOG_LEVEL", .group = kEnv, .kind = K::kChoice, .origin = O::kLmcacheEnv,
     .lmcache_default = "INFO", .choices = "DEBUG|INFO|WARNING|ERROR|CRITICAL",
     .note = "log level when --log-level is not given (case-insensitive, as in lmcache)",
     .apply = [](const FlagValue& v, CliConfig& c) {
       std::string l = v.text;
       std::transform(l.begin(), l.end(), l.begin(), ::tolower);
       c.log_level = l;
       c.log_level_source = "LMCACHE_LOG_LEVEL";
     }},
    {.name = "LMCACHE_COORDINATOR_URL", .group = kEnv, .origin = O::kLmcacheEnv, .serves = "",
     .note = "no coordinator",
     .refusal = "kvd does not register with an lmcache coordinator (lmcache falls back to this "
                "variable for --coordinator-url)"},
    {.name = "LMCACHE_COORDINATOR_ADVERTISE_IP", .group = kEnv, .origin = O::kLmcacheEnv,
     .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL", .group = kEnv, .origin = O::kLmcacheEnv,
     .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "LMCACHE_COORDINATOR_EVENT_REPORTING", .group = kEnv, .origin = O::kLmcacheEnv,
     .support = S::kAccepted, .note = kNoCoordinator},
    {.name = "LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL", .group = kEnv, .origin = O::kLmcacheEnv,
     .support = S::kAccepted, .note = kNoCoordinator},
};

}  // namespace

std::span<const FlagSpec> Lmcache() { return kRows; }

}  // namespace kvd::cli::flag_rows
