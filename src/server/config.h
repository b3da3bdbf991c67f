// ServerConfig: the effective configuration of one kvd server process. Filled by the
// CLI (flag names and defaults follow `lmcache server`), validated once, then read-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvd::server {

struct ServerConfig {
  std::string host = "localhost";
  int port = 5555;
  int64_t chunk_size = 256;
  double l1_size_gb = 0;                 // required
  uint64_t l1_align_bytes = 4096;        // L1 allocation unit (--l1-align-bytes; a power of two)
  bool l1_use_lazy = true;               // --l1-use-lazy: L1 grows from l1_init_size_gb
  int64_t l1_init_size_gb = 20;          // --l1-init-size-gb (capped at l1_size_gb)
  // --l1-use-hugepages: L1 is private (anonymous) memory in 2 MiB pages, not shared memory
  // (the parser then turns lazy growth and engine-driven transfers off, as lmcache does).
  bool l1_use_hugepages = false;
  // --l1-populate: background population of L1 pages ahead of use: all | ahead | off
  // (l1/pool_populator.h).
  std::string l1_populate = "all";
  std::string eviction_policy;           // required: LRU
  double eviction_trigger_watermark = 0.8;
  double eviction_ratio = 0.2;
  double l1_read_ttl_seconds = 300;
  double l1_write_ttl_seconds = 600;
  int max_workers = 0;                   // 0: chosen from the core count
  int64_t null_block_id = 0;             // vLLM's null block: all-null chunks are not stored
  int copy_threads = 0;                  // threads for one large copy; 0: from the core count
  std::string hash_algorithm = "blake3";
  std::string shm_name;                  // L1 pool segment; "" → kvd_l1_pool_<pid>
                                         // (stays "" with l1_use_hugepages: no segment)
  double worker_reap_timeout_seconds = 120;
  // Silence allowed to a worker that registered but never sent a PING (lmcache 0.5.6
  // workers start pinging at their first transfer). Must be >= the reap timeout.
  double worker_registration_grace_seconds = 3600;
  double session_ttl_seconds = 600;
  // Bounds of the session table (sessions.h): live sessions and the bytes they hold; the
  // least recently used are evicted beyond them.
  uint64_t max_sessions = 65536;
  uint64_t max_session_bytes = uint64_t{1} << 30;
  // Memory for the keys of recently hashed chunks, shared by all requests, so a prefix
  // many requests send is hashed once (keys/chunk_key_memo.h; --chunk-key-memo-mb). 0: off.
  uint64_t chunk_key_memo_bytes = uint64_t{32} << 20;
  // Label sets kept per labelled metric family (--metrics-max-label-sets): (model, salt)
  // pairs of the lookup series, devices, (device, instance, model) of the throughput
  // histograms. Beyond, counts go to the "__other__" label set (server/service_counters.h).
  uint64_t metrics_max_label_sets = 256;
  // Per-connection memory bounds of the socket loop (see zmq_server.h): requests read but
  // not yet answered may hold this many bytes of frames (0: twice the largest legal
  // frame); the socket keeps at most this many unread requests (and 1 MiB of them) / unsent
  // replies per connection (net/zmtp_router.h; libzmq's names for the same bounds).
  uint64_t max_queued_bytes_per_connection = 0;
  int zmq_rcvhwm = 1000;
  int zmq_sndhwm = 100000;
  // Connections on the request port (net/zmtp_router.h, "CONNECTIONS AND DESCRIPTORS"): at
  // most this many, this many from one IP address, none past RLIMIT_NOFILE less fd_reserve
  // descriptors (at most half the limit), and a connection must finish its ZMTP handshake
  // within handshake_timeout_seconds (0: no limit). A connection that finished its handshake
  // is never closed for being idle (vLLM's stay open, idle at times, for hours).
  uint32_t max_connections = 1024;               // --max-connections
  uint32_t max_connections_per_address = 256;    // --max-connections-per-address
  uint32_t fd_reserve = 256;                     // --fd-reserve
  double handshake_timeout_seconds = 30;         // --handshake-timeout-seconds
  std::string log_level = "info";
  // Which transfer paths the server serves (--supported-transfer-mode): "auto" (both; kvd's
  // default), "lmcache_driven" (STORE/RETRIEVE into registered KV tensors) or
  // "engine_driven" (PREPARE/COMMIT into the shared L1 pool).
  std::string supported_transfer_mode = "auto";
  // --engine-type: "default" (prefix caching) or "blend" (CacheBlend's ops, server/blend_ops.h),
  // and blend's switches (no effect unless blend).
  std::string engine_type = "default";
  bool enable_segmented_prefix = false;  // blend: chunks past a prefix gap, at their positions
  bool enable_dedup_content = false;
  bool enable_blend_reorder = false;
  bool blend_lmcache_parity = false;     // kvd's --blend-lmcache-parity
  bool blend() const { return engine_type == "blend"; }
  // Records kept for KV-event subscribers (--kv-event-log-size); 0 turns the stream off.
  int64_t kv_event_log_size = 32768;
  std::string instance_id;               // --instance-id: shown in GET /config only
  // Whose shared memory REGISTER_KV_CACHE may map (--allowed-shm-uid, --allowed-shm-prefix):
  // owners of client segments (empty: only the uid kvd runs as) and a required name prefix
  // (empty: any name).
  std::vector<uint32_t> allowed_shm_uids;
  std::string allowed_shm_prefix;

  // What engine-driven operations between PREPARE and COMMIT may hold of L1 (staging
  // objects of prepared stores, read pins of prepared retrieves; server/engine_driven_holds.h):
  // all instances together at most this fraction of L1, one instance at most that fraction;
  // a hold older than the shed age may be shed to make room, and every hold is dropped after
  // the hold timeout (or the write / read TTL, if shorter) whether or not the worker pings.
  double engine_driven_max_held_fraction = 0.5;        // --engine-driven-max-held-fraction
  double engine_driven_instance_held_fraction = 0.25;  // --engine-driven-instance-held-fraction
  double engine_driven_hold_timeout_seconds = 60;      // --engine-driven-hold-timeout-seconds
  double engine_driven_shed_age_seconds = 5;           // --engine-driven-shed-age-seconds
  bool lmcache_driven_enabled() const { return supported_transfer_mode != "engine_driven"; }
  bool engine_driven_enabled() const { return supported_transfer_mode != "lmcache_driven"; }
  // Tiers behind L1 (lmcache's --l2-* flags): adapter JSON in priority order.
  std::vector<std::string> l2_adapters;
  std::string l2_store_policy = "default";     // default | skip_l1
  std::string l2_prefetch_policy = "default";  // default | retain
  int l2_prefetch_max_in_flight = 8;
  double l2_prefetch_timeout_seconds = 10;     // a lookup waits this long for its tiers
  // P2P reads of peer kvds' L1 (docs/p2p.md): on when p2p_advertise_url is set.
  std::string p2p_advertise_url;         // --p2p-advertise-url host:port (peers reach UCX here)
  std::string p2p_listen_url;            // --p2p-listen-url host:port; empty: the advertise url
  double p2p_lookup_timeout_seconds = 30;  // --p2p-lookup-timeout: one directory lookup
  double p2p_load_timeout_seconds = 30;    // --p2p-load-timeout: one read from a peer
  std::string p2p_transfer_engine = "ucx";  // --p2p-transfer-engine (only ucx is served)
  std::string p2p_directory;             // --p2p-directory redis://[[user]:password@]host:port[/db]
  std::string p2p_secret_file;           // --p2p-secret-file: the fleet's shared secret
  std::string p2p_ucx_tls;               // --p2p-ucx-tls: UCX_TLS for P2P; empty: UCX's choice
  bool p2p() const { return !p2p_advertise_url.empty(); }

  uint64_t l1_size_bytes() const { return static_cast<uint64_t>(l1_size_gb * (1ull << 30)); }
  // The part of L1 handed out before it grows: all of it unless lazy.
  uint64_t l1_init_bytes() const {
    if (!l1_use_lazy) return l1_size_bytes();
    const uint64_t init = static_cast<uint64_t>(l1_init_size_gb) << 30;
    return init < l1_size_bytes() ? init : l1_size_bytes();
  }
  std::string ZmqEndpoint() const;       // tcp://host:port
  std::string Describe() const;          // one line for the startup log
};

}  // namespace kvd::server
