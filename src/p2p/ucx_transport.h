// UcxNode, UcxRegion, UcxPeer: the data path of P2P between kvd servers (docs/p2p.md). One UCX
// context and worker per node, a listener that peers connect to, and reads of a peer's objects
// into local memory. UCX picks the transport (RDMA verbs/RoCE, shared memory, TCP) from what
// the machine has; Options::tls narrows it (UCX_TLS's syntax), as tests do with "tcp".
//
// PROTOCOL. A read is asked, not taken: the reader sends one small active message per item
// ("object, offset, length", a request id and its node's token in a fixed-size header, the
// object's name, at most kMaxNameBytes, as the message's data, sent eagerly), and the serving
// node answers each with the bytes its Options::serve function hands it, or with an error. An
// ask whose header, name length and data disagree, or whose name came by rendezvous, is
// dropped unanswered (its reader times out), as is any other malformed ask. Large answers go
// by UCX's rendezvous protocol, which over RDMA is a zero-copy RDMA read by the reader,
// straight into the destination. kvd does not use one-sided RMA with remote keys: on
// transports without hardware RMA (TCP) UCX 1.13 emulates it in the target's progress and
// aborts the target process when a reader leaves while it answers; and there, confining a
// peer to the registered region would rest on UCX checking each emulated request, which it
// does not document. Here the serving node decides, item by item, what leaves it.
//
// SECURITY. UCX authenticates nobody: anyone who reaches the listener can connect. Each node
// derives a 32-byte token from Options::secret (BLAKE3 in key derivation mode), every ask
// carries it, and a serving node answers an ask whose token is not its own (compared in
// constant time) with FailedPrecondition, without calling `serve`, and counts it
// (refused_asks). Nodes with the same secret, the empty one included, read from each other.
// The token is a password on the wire, not encryption: the data, the names and the token
// travel in the clear, and whoever sees one ask can replay its token. Keep the listen address
// on a private network.
//
// THREADS. A UcxNode and everything made from it (regions, peers) belong to one thread, the
// node's owner: UCX's worker is created single-threaded, and every call below, construction and
// destruction included, must come from that thread, as must `serve`, which ProgressFor calls.
// The owner has to call ProgressFor while peers read from it.
//
// OWNERSHIP. UcxNode owns the context, worker, listener and the endpoints the listener
// accepted. Regions and peers hold a pointer to their node and must be destroyed before it (the
// node aborts in its destructor if one is alive: a programming error). The bytes `serve` hands
// out stay valid until the ServedBytes' `hold` is released, which the node does when UCX no
// longer reads them (the answer was sent, or failed).
//
// READS. UcxPeer::Read asks for every item at once and waits for all of them until the
// deadline. The answer is the count of leading items that arrived whole, plus the first error:
// an item that failed or did not finish never counts, and no item after it counts either, so a
// caller using it as "this many chunks arrived" never uses bytes that did not. Every answer is
// checked against what was asked (its request, its item, its exact length) before a byte is
// written. An answer still arriving at the deadline is cancelled by closing the endpoint (the
// peer is then broken for good); Read returns only when UCX no longer writes any destination.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

// UCX's handles, declared here so that users of this header do not include UCX.
typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_listener* ucp_listener_h;
typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_mem* ucp_mem_h;

namespace kvd::p2p {

using Deadline = std::chrono::steady_clock::time_point;

class UcxNode;
struct UcxCallbacks;  // UCX's C callbacks (ucx_transport.cc)

// Local memory registered with UCX: a destination of reads, and memory a node serves from
// without registering it per answer (kvd registers its L1 pool). Unregistered on destruction.
class UcxRegion {
 public:
  ~UcxRegion();
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  uint8_t* base() const { return base_; }
  size_t length() const { return length_; }
  bool Contains(const void* p, size_t len) const;

 private:
  friend class UcxNode;
  UcxRegion(UcxNode* node, ucp_mem_h memh, uint8_t* base, size_t length)
      : node_(node), memh_(memh), base_(base), length_(length) {}
  UcxNode* node_;
  ucp_mem_h memh_;
  uint8_t* base_;
  size_t length_;
};

// One item of a read: `length` bytes at `offset` of the peer's object named `name` (and
// `object`; what the name and the id mean is the serving node's business: kvd's peers serve
// L1 objects by name) into `dst`, which must lie inside a UcxRegion of the reading node. The
// name is at most UcxPeer::kMaxNameBytes and may be empty.
struct ReadItem {
  uint64_t object = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dst = nullptr;
  std::string name{};
};

struct ReadAnswer {
  size_t completed_prefix = 0;  // items [0, completed_prefix) arrived whole
  Status first_error;           // why item completed_prefix did not (OK when all did)
};

// What a serving node answers for one item: `length` bytes at `data`, inside a UcxRegion of the
// node (else the item is answered Internal), valid while `hold` lives.
struct ServedBytes {
  const uint8_t* data = nullptr;
  uint64_t length = 0;
  std::shared_ptr<const void> hold;
};
// One item a peer asked for, as `serve` sees it. `name` points into the node's queue: valid
// only during the call to `serve`.
struct ServeAsk {
  uint64_t object = 0;
  std::string_view name;
  uint64_t offset = 0;
  uint64_t length = 0;
};
// The serving node's answer to `ask` from the peer `peer_id` (an id the node gives each
// accepted endpoint). Called only for asks that carried this node's token. An error status
// goes back to the reader as the item's error.
using ServeFn = std::function<Result<ServedBytes>(uint64_t peer_id, const ServeAsk& ask)>;

// An endpoint to one peer's listener.
class UcxPeer {
 public:
  ~UcxPeer();
  UcxPeer(const UcxPeer&) = delete;
  UcxPeer& operator=(const UcxPeer&) = delete;

  // At most this many items per Read, each at most kMaxItemBytes, its name at most
  // kMaxNameBytes.
  static constexpr size_t kMaxItems = 4096;
  static constexpr uint64_t kMaxItemBytes = 1ull << 32;
  static constexpr size_t kMaxNameBytes = 1024;

  // Reads `items` (see READS above). Refuses the whole batch with InvalidArgument, reading
  // nothing, when an item has a zero length, is too long, has a name over kMaxNameBytes, or
  // has no destination inside a region of this node (or destinations overlap); Unavailable
  // when the peer is broken. An item the peer refused for a wrong secret fails with
  // FailedPrecondition (see SECURITY).
  ReadAnswer Read(std::span<const ReadItem> items, Deadline deadline);
  // Waits until the connection is established (a flush completes). Unavailable on failure.
  Status WaitConnected(Deadline deadline);
  // A transport error was reported on this endpoint, or a read was cancelled: every later call
  // answers Unavailable; make a new peer.
  bool broken() const { return !error_.ok(); }
  const std::string& address() const { return address_; }

 private:
  friend class UcxNode;
  friend struct UcxCallbacks;
  UcxPeer(UcxNode* node, std::string address) : node_(node), address_(std::move(address)) {}
  // Closes the endpoint (see CloseEndpoint: in order unless broken) and waits for the close.
  void Close();

  UcxNode* node_;
  std::string address_;
  ucp_ep_h ep_ = nullptr;
  Status error_;  // set by the error callback, a timeout or a cancelled read
  bool connected_ = false;
};

class UcxNode {
 public:
  struct Options {
    std::string listen_host = "127.0.0.1";  // empty: do not listen (a node that only reads)
    int listen_port = 0;                     // 0: any free port
    std::string tls;                         // UCX_TLS for this node; empty: UCX's own choice
    ServeFn serve;                           // null: every item is answered NotFound
    // The fleet's shared secret (at most kMaxSecretBytes; see SECURITY): this node's asks
    // carry its token, and it serves only asks that carry the same.
    std::string secret{};
    // How often UCX probes an idle connection: a peer that vanished without closing (a host
    // that died, a cable) is noticed after about this long, and what it held is released.
    double keepalive_s = 5;
    // An answer a peer has not taken after this long (a reader that gave up, or stopped
    // progressing) costs that peer its connection: the answers in flight on it are cancelled
    // and the bytes they held released. Transports where UCX's keepalive does not see a reader
    // that closed its endpoint without telling (TCP) rely on this.
    double answer_timeout_s = 30;
  };
  static constexpr size_t kMaxSecretBytes = 4096;
  // Errors: InvalidArgument for bad options (a secret over kMaxSecretBytes, timeouts out of
  // range, an unresolvable listen address, transports UCX refuses); Unavailable when UCX fails.
  static Result<std::unique_ptr<UcxNode>> Create(Options options);
  ~UcxNode();
  UcxNode(const UcxNode&) = delete;
  UcxNode& operator=(const UcxNode&) = delete;

  // The port the listener is bound to (0 when not listening).
  int listen_port() const { return listen_port_; }
  // Registers [base, base + length) with UCX (see UcxRegion).
  Result<std::unique_ptr<UcxRegion>> Register(void* base, size_t length);
  // An endpoint to the listener at host:port. The connection completes asynchronously: see
  // UcxPeer::WaitConnected (a Read waits for it too).
  Result<std::unique_ptr<UcxPeer>> Connect(const std::string& host, int port);
  // Progresses the worker: answers peers' items (calling `serve`) and completes this node's
  // reads. Sleeps on the worker's event descriptor for up to `wait` when there is nothing to do.
  void ProgressFor(std::chrono::milliseconds wait);

  // A peer's asks beyond this many unanswered ones are dropped (its reads time out), so that
  // one peer cannot queue unbounded work or pin unbounded bytes.
  static constexpr size_t kMaxUnanswered = 4096;
  // Endpoints the listener accepted and still holds; answers being sent.
  size_t accepted_peers() const { return accepted_.size(); }
  size_t answers_in_flight() const { return sends_.size(); }
  // Asks answered FailedPrecondition because their token was not this node's (see SECURITY).
  uint64_t refused_asks() const { return refused_asks_; }

 private:
  friend class UcxRegion;
  friend class UcxPeer;
  friend struct UcxCallbacks;
  struct PendingRead;
  struct Ask {  // an item a peer asked for, answered after progress returns
    ucp_ep_h reply_ep;
    uint64_t request;
    uint64_t index;
    uint64_t object, offset, length;
    std::string name{};   // copied: UCX's data is valid only during its callback
    bool refused = false;  // the ask's token was not this node's: answered without `serve`
  };
  struct Send {  // an answer UCX is sending (its header must live as long)
    alignas(8) uint8_t header[32];
    ucp_ep_h ep = nullptr;
    std::chrono::steady_clock::time_point started;
    void* request = nullptr;
    std::shared_ptr<const void> hold;
    bool done = false;
  };
  UcxNode() = default;
  bool ProgressOnce();
  void AnswerAsks();
  void ReapSends();
  void DropFailedEndpoints();
  bool InLocalRegion(const void* p, size_t len) const;
  // Closes `ep` and waits for the close: in order (the peer is told), or forcibly (its
  // operations are cancelled at once; the peer learns by its keepalive).
  void CloseEndpoint(ucp_ep_h ep, bool force);

  Options options_;
  std::array<uint8_t, 32> token_{};  // derived from options_.secret
  uint64_t refused_asks_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int event_fd_ = -1;
  int listen_port_ = 0;
  struct Accepted {
    uint64_t peer_id;
    size_t unanswered = 0;  // its asks queued or being answered (at most kMaxUnanswered)
  };
  std::unordered_map<ucp_ep_h, Accepted> accepted_;
  uint64_t next_peer_id_ = 1;
  std::vector<ucp_ep_h> accepted_failed_;  // reported by UCX's error callback
  std::vector<Ask> asks_;
  std::vector<std::unique_ptr<Send>> sends_;
  std::unordered_map<uint64_t, PendingRead*> reads_;  // request id -> the Read waiting for it
  uint64_t next_request_ = 1;
  std::vector<const UcxRegion*> regions_;
  size_t live_peers_ = 0;
  std::chrono::steady_clock::time_point last_busy_;  // the last progress that did something
};

}  // namespace kvd::p2p
