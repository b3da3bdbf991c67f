// FleetDirectory: which kvd node holds which committed chunk in its L1, kept in one
// Redis/Valkey server so that a LOOKUP that misses locally can find a peer to read from.
// Each node publishes the chunks it commits, withdraws those it evicts, heartbeats, and asks
// the directory for the live owners of the chunks it lacks.
//
// DATA MODEL. Every key starts with Options::key_prefix (default "{kvd-p2p}:"), which must
// hold a Redis hash tag ("{...}", non-empty), so that all keys of one fleet hash to one
// Cluster slot and one Lua script may touch any of them.
//   <prefix>node:<node>         string "<incarnation> <url>", SET ... PX node_ttl_ms by
//                               Heartbeat(); gone when the node stops heartbeating.
//   <prefix>chunk:<chunk key>   hash: field = node name, value = decimal incarnation; HSET
//                               by Publish() with PEXPIRE entry_ttl_ms (so an entry lives
//                               entry_ttl_s after the last Publish of that chunk by any node),
//                               HDEL by Withdraw().
// An owner (a hash field) is LIVE when its node key exists and holds the same incarnation.
// Lookup() runs one Lua script that answers the live owners and HDELs every entry that is not
// live (its node is gone, restarted under a new incarnation, or either value is malformed):
// a stale entry costs one lookup and is gone. A node key that does not parse ("notanumber
// url") makes its entries not live, never an error. The script reads node keys it is not
// given in KEYS, which Redis allows, standalone and in a Cluster: they share the hash tag's slot.
//
// NAMES. node: 1..128 bytes of [A-Za-z0-9._:-]; incarnation: a non-zero uint64 the caller
// picks per process start (e.g. start time in ns), so a restarted node never inherits the
// entries of its previous life; url: the node's P2P address, 1..256 bytes, no whitespace or
// control bytes. Chunk keys are opaque bytes, 1..1024 each, at most Options::max_batch per
// call. Invalid input is refused with InvalidArgument before anything is sent. Two processes
// must not run under one node name at once.
//
// TRUST. The server is not trusted: every reply is checked (types, counts, names, that an
// incarnation parses) before use, and at most max_owners_per_key owners per key are accepted.
// A malformed reply answers Internal, never a crash. Lookup replies are bounded by
// l2::RespConnection::kMaxReplyBytes: a batch whose worst-case reply could exceed it is sent
// as several EVALSHAs pipelined in the same round trip.
//
// CLUSTER. With Options::cluster, `endpoint` is a seed of a Redis/Valkey Cluster: the
// connection asks it for the slot map (CLUSTER SLOTS, or CLUSTER SHARDS where that is gone)
// and goes to the master of the prefix's slot, which holds every key of the fleet. A MOVED or
// ASK answer (a failover, a resharding) drops the connection; the call dials again, asking
// the master it last used and then the seed, and retries once.
//
// ERRORS. Unavailable: the server cannot be reached, a request timed out, the server refused a
// command (its error named), or a Cluster kept redirecting. FailedPrecondition: a standalone
// directory (cluster false) answered a Cluster redirect (MOVED/ASK), or a Cluster directory's
// seed is not a Cluster. Internal: a malformed reply.
//
// THREADS AND CONNECTION. All methods are thread-safe; one connection, guarded by a mutex,
// carries one request at a time (calls queue behind the one in flight). A connection found
// broken is dropped: the call reconnects once (SCRIPT LOAD again) and, if it was using an
// older connection, retries once; every operation is idempotent. If reconnecting fails the
// call answers Unavailable and the next call tries again. A refused connection answers at
// once; a hung server holds a call for at most about 2 x request_timeout_s + connect_timeout_s.
// The destructor closes the connection without sending anything (call Leave() first for a
// clean shutdown).
//
// COST. A lookup script's work is linear in the entries of the keys it reads (at most one per
// node), all inside the server's single thread: keep batches and fleets moderate.
//
// USE. Heartbeat() before the first Publish() and then every node_ttl_s / 3 or so: entries
// published while the node key is missing are removed by the next lookup that sees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "l2/resp_connection.h"

namespace kvd::p2p {

class FleetDirectory {
 public:
  struct Options {
    l2::RespEndpoint endpoint;
    l2::RespConnectOptions connect;
    std::string key_prefix = "{kvd-p2p}:";  // must hold a non-empty {hash tag}; <= 256 bytes
    double node_ttl_s = 10;                 // >= 0.001, <= 1 year
    double entry_ttl_s = 3600;              // >= 0.001, <= 1 year
    size_t max_batch = 4096;                // keys per call, 1..65536
    size_t max_owners_per_key = 8;          // owners a lookup answers per key, 1..1024
    bool cluster = false;                   // endpoint is a seed of a Cluster (see CLUSTER)
  };
  // This node.
  struct Self {
    std::string node;
    uint64_t incarnation = 0;
    std::string url;
  };
  // A live owner of a chunk, as the directory answers it.
  struct Owner {
    std::string node;
    uint64_t incarnation = 0;
    std::string url;
    bool operator==(const Owner&) const = default;
  };
  // Calls that passed validation, and those of them that then failed (any non-OK answer).
  struct Stats {
    uint64_t heartbeats = 0;
    uint64_t publishes = 0;
    uint64_t withdraws = 0;
    uint64_t forgets = 0;
    uint64_t lookups = 0;
    uint64_t stale_entries_removed = 0;  // as the lookup script reported
    uint64_t failures = 0;
    uint64_t reconnects = 0;  // connections made after the one Connect() made
  };

  // Validates `options` and `self` (InvalidArgument), connects and loads the lookup script
  // (Unavailable or FailedPrecondition as l2::RespConnection::Connect answers). Writes nothing.
  static Result<std::unique_ptr<FleetDirectory>> Connect(Options options, Self self);
  ~FleetDirectory();
  FleetDirectory(const FleetDirectory&) = delete;
  FleetDirectory& operator=(const FleetDirectory&) = delete;

  // Writes this node's node key ("<incarnation> <url>") with a TTL of node_ttl_s.
  Status Heartbeat();
  // Records this node (under its incarnation) as an owner of each key; one round trip.
  Status Publish(const std::vector<std::string>& keys);
  // Removes this node from the owners of each key; one round trip.
  Status Withdraw(const std::vector<std::string>& keys);
  // For each key, in order, its live owners other than this node (at most max_owners_per_key,
  // in no particular order); removes the stale entries it meets. One round trip.
  Result<std::vector<std::vector<Owner>>> Lookup(const std::vector<std::string>& keys);
  // Deletes this node's node key if it still holds this incarnation (a restarted successor's
  // is left alone). Its entries are then removed by the lookups that meet them.
  Status Leave();
  // Removes `owner` from the owners of `key` if the entry still holds owner's incarnation: a
  // reader whose read found the chunk gone from that owner (its withdrawal was lost) tells the
  // fleet. One round trip.
  Status Forget(const std::string& key, const Owner& owner);

  Stats stats() const;
  const Self& self() const { return self_; }

 private:
  struct Link;  // a connection and the loaded script's SHA1
  FleetDirectory(Options options, Self self, std::unique_ptr<Link> link);
  Status ValidateKeys(const std::vector<std::string>& keys) const;
  // EVAL of a script on one key with one or two arguments (arg2 empty: one) that answers an
  // integer; counts a failure.
  Status EvalOneLocked(std::string_view what, std::string_view script, const std::string& key,
                       const std::string& arg1, const std::string& arg2) KVD_REQUIRES(mu_);
  // Publish and Withdraw: validates `keys`, counts the call in `counter`, appends each chunk
  // entry's commands with `append` (Status(l2::RespConnection&, const std::string& key)) and
  // reads replies_per_key integer replies per key, all in one round trip.
  template <typename AppendFn>
  Status PerKey(std::string_view what, uint64_t Stats::*counter,
                const std::vector<std::string>& keys, AppendFn&& append, size_t replies_per_key);
  // Connects (through the Cluster's slot map when options.cluster, asking `hint` first, then
  // the seed) and loads the lookup script.
  static Result<std::unique_ptr<Link>> Dial(const Options& options, const l2::RespEndpoint* hint);
  // Runs `fn` on the connection under the rules above. Status(Link&) callable.
  template <typename Fn>
  Status WithLink(Fn&& fn) KVD_REQUIRES(mu_);
  Status Lookups(Link& link, const std::vector<std::string>& keys,
                 std::vector<std::vector<Owner>>& out, uint64_t& removed) const;

  const Options options_;
  const Self self_;
  const std::string node_key_;    // <prefix>node:<self.node>
  const std::string node_value_;  // "<incarnation> <url>"
  const size_t keys_per_script_;  // so that one script's reply fits kMaxReplyBytes

  mutable Mutex mu_;
  std::unique_ptr<Link> link_ KVD_GUARDED_BY(mu_);  // null: dial on the next call
  std::optional<l2::RespEndpoint> last_master_ KVD_GUARDED_BY(mu_);  // cluster: asked first
  Stats stats_ KVD_GUARDED_BY(mu_);
};

}  // namespace kvd::p2p
