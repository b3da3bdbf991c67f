#include "p2p/ucx_transport.h"
#include "p2p/ucx_messages.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include <spdlog/spdlog.h>

#include "keys/blake3.h"

namespace kvd::p2p {

namespace {

// A node queues at most this many unanswered items of its peers; more are dropped (their
// readers time out), so that a flooding peer cannot grow the queue without bound.
constexpr size_t kMaxQueuedAsks = 1 << 16;

Status UcxError(const std::string& what, ucs_status_t status) {
  return Status::Unavailable(what + ": " + ucs_status_string(status));
}

// Resolves host:port (numeric or a name) to a socket address. Port 0 (any) only to listen.
Result<sockaddr_storage> Resolve(const std::string& host, int port, bool to_listen) {
  if (host.empty()) return Status::InvalidArgument("p2p: empty host");
  if (port < (to_listen ? 0 : 1) || port > 65535) {
    return Status::InvalidArgument("p2p: port " + std::to_string(port) + " out of range");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::InvalidArgument("p2p: cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, std::min<size_t>(found->ai_addrlen, sizeof(out)));
  freeaddrinfo(found);
  return out;
}

// Compares two tokens in time independent of where they differ.
bool SameToken(const uint8_t* a, const uint8_t* b) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < kTokenBytes; ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

socklen_t AddrLen(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

Status StatusFromPeer(uint64_t code, const std::string& peer, uint64_t index) {
  std::string what = "p2p: " + peer + " answered item " + std::to_string(index) + ": ";
  switch (static_cast<StatusCode>(code)) {
    case StatusCode::kNotFound: return Status::NotFound(what + "not found");
    case StatusCode::kInvalidArgument: return Status::InvalidArgument(what + "invalid");
    case StatusCode::kFailedPrecondition:
      return Status::FailedPrecondition(what + "refused (by its serve, or a wrong shared secret)");
    case StatusCode::kResourceExhausted: return Status::ResourceExhausted(what + "no room");
    default: return Status::Unavailable(what + "error " + std::to_string(code));
  }
}

}  // namespace

// A context of its own, so that the token is no other hash of the secret that kvd computes.
std::array<uint8_t, kTokenBytes> AskToken(std::string_view secret) {
  keys::Blake3Hasher hasher = keys::Blake3Hasher::DeriveKey("kvd 2025 p2p ask token v1");
  hasher.Update(secret.data(), secret.size());
  return hasher.Finalize();
}

// One Read in progress, found by its request id when an answer arrives.
struct UcxNode::PendingRead {
  enum State : uint8_t { kWaiting, kReceiving, kDone, kFailed };
  std::span<const ReadItem> items;
  UcxPeer* peer = nullptr;
  std::vector<State> state;
  std::vector<Status> error;
  std::vector<void*> receive;  // a rendezvous receive in flight per item (kReceiving)
  std::vector<AskHeader> asks;
  std::vector<void*> ask_sends;
  // Rendezvous answers seen in a callback, started after progress returns.
  std::vector<std::pair<size_t, void*>> deferred;
};

// UCX's C callbacks. They run inside ucp_worker_progress, on the node's owner thread, and only
// record what happened: endpoints are closed and answers sent after progress returns.
struct UcxCallbacks {
  static void PeerError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<UcxPeer*>(arg);
    if (peer->error_.ok()) peer->error_ = UcxError("p2p: peer " + peer->address_, status);
  }
  static void AcceptedError(void* arg, ucp_ep_h ep, ucs_status_t) {
    static_cast<UcxNode*>(arg)->accepted_failed_.push_back(ep);
  }
  static void ConnRequest(ucp_conn_request_h request, void* arg) {
    auto* node = static_cast<UcxNode*>(arg);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxCallbacks::AcceptedError;
    params.err_handler.arg = node;
    ucp_ep_h ep = nullptr;
    ucs_status_t st = ucp_ep_create(node->worker_, &params, &ep);
    if (st != UCS_OK) {
      spdlog::warn("p2p: could not accept a peer's connection: {}", ucs_status_string(st));
      return;
    }
    node->accepted_.emplace(ep, UcxNode::Accepted{.peer_id = node->next_peer_id_++});
  }
  static void SendDone(void*, ucs_status_t, void* user_data) {
    static_cast<UcxNode::Send*>(user_data)->done = true;
  }
  // A peer asks for an item: queued, answered by AnswerAsks. The name is its data, delivered
  // eagerly (a rendezvous descriptor is dropped by answering UCS_OK) and copied here.
  static ucs_status_t Ask(void* arg, const void* header, size_t header_length, void* data,
                          size_t length, const ucp_am_recv_param_t* param) {
    auto* node = static_cast<UcxNode*>(arg);
    AskHeader h;
    if (header_length != sizeof(h) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
      return UCS_OK;  // not an ask of this protocol: dropped
    }
    std::memcpy(&h, header, sizeof(h));
    if (h.magic != kAskMagic || h.name_length > UcxPeer::kMaxNameBytes || length != h.name_length ||
        (length != 0 && data == nullptr)) {
      return UCS_OK;
    }
    auto peer = node->accepted_.find(param->reply_ep);
    if (peer == node->accepted_.end() || peer->second.unanswered >= UcxNode::kMaxUnanswered ||
        node->asks_.size() >= kMaxQueuedAsks) {
      return UCS_OK;
    }
    ++peer->second.unanswered;
    UcxNode::Ask ask{.reply_ep = param->reply_ep, .request = h.request, .index = h.index,
                     .object = h.object, .offset = h.offset, .length = h.length};
    // A wrong token is answered (FailedPrecondition), not dropped: its reader learns at once.
    ask.refused = !SameToken(h.token, node->token_.data());
    if (!ask.refused) ask.name.assign(static_cast<const char*>(data), length);
    node->asks_.push_back(std::move(ask));
    return UCS_OK;
  }
  // An answer to one of this node's reads: checked against what was asked, then written.
  static ucs_status_t Answer(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param) {
    auto* node = static_cast<UcxNode*>(arg);
    AnswerHeader h;
    if (header_length != sizeof(h)) return UCS_OK;
    std::memcpy(&h, header, sizeof(h));
    auto it = node->reads_.find(h.request);
    if (it == node->reads_.end()) return UCS_OK;  // late: its Read has returned
    UcxNode::PendingRead& read = *it->second;
    // Only the peer that was asked may answer, and only once per item.
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || read.peer->ep_ == nullptr ||
        param->reply_ep != read.peer->ep_ || h.index >= read.items.size() ||
        read.state[h.index] != UcxNode::PendingRead::kWaiting) {
      return UCS_OK;
    }
    const ReadItem& item = read.items[h.index];
    auto fail = [&](Status s) {
      read.state[h.index] = UcxNode::PendingRead::kFailed;
      read.error[h.index] = std::move(s);
      return UCS_OK;
    };
    if (h.status != static_cast<uint64_t>(StatusCode::kOk)) {
      return fail(StatusFromPeer(h.status, read.peer->address_, h.index));
    }
    if (h.length != item.length || length != item.length) {
      return fail(Status::InvalidArgument("p2p: " + read.peer->address_ + " answered " +
                                          std::to_string(length) + " bytes for item " +
                                          std::to_string(h.index) + " of " +
                                          std::to_string(item.length)));
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      read.state[h.index] = UcxNode::PendingRead::kReceiving;
      read.deferred.emplace_back(h.index, data);
      return UCS_INPROGRESS;  // the descriptor is kept for ucp_am_recv_data_nbx
    }
    std::memcpy(item.dst, data, length);
    read.state[h.index] = UcxNode::PendingRead::kDone;
    return UCS_OK;
  }
};

// ---- UcxNode -------------------------------------------------------------------------------

Result<std::unique_ptr<UcxNode>> UcxNode::Create(Options options) {
  if (options.secret.size() > kMaxSecretBytes) {
    return Status::InvalidArgument("p2p: a shared secret of " +
                                   std::to_string(options.secret.size()) + " bytes (at most " +
                                   std::to_string(kMaxSecretBytes) + ")");
  }
  std::unique_ptr<UcxNode> node(new UcxNode());
  node->options_ = std::move(options);
  const Options& o = node->options_;
  node->token_ = AskToken(o.secret);
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError("p2p: reading UCX's configuration", st);
  if (!o.tls.empty()) {
    st = ucp_config_modify(config, "TLS", o.tls.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return Status::InvalidArgument("p2p: UCX transports '" + o.tls + "' refused: " +
                                     ucs_status_string(st));
    }
  }
  for (auto [name, value] : {std::pair{"keepalive", o.keepalive_s}, {"answer timeout", o.answer_timeout_s}}) {
    if (!(value > 0 && value <= 3600)) {
      ucp_config_release(config);
      return Status::InvalidArgument(std::string("p2p: ") + name + " of " + std::to_string(value) +
                                     " s (must be in (0, 3600])");
    }
  }
  std::string keepalive = std::to_string(static_cast<long long>(o.keepalive_s * 1e6)) + "us";
  st = ucp_config_modify(config, "KEEPALIVE_INTERVAL", keepalive.c_str());
  if (st != UCS_OK) {
    ucp_config_release(config);
    return UcxError("p2p: setting UCX's keepalive", st);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &node->context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcxError("p2p: starting UCX with transports '" + o.tls + "'", st);

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(node->context_, &wparams, &node->worker_);
  if (st != UCS_OK) return UcxError("p2p: creating the UCX worker", st);
  st = ucp_worker_get_efd(node->worker_, &node->event_fd_);
  if (st != UCS_OK) return UcxError("p2p: the UCX worker's event descriptor", st);
  ucp_worker_attr_t wattr{};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  st = ucp_worker_query(node->worker_, &wattr);
  if (st != UCS_OK) return UcxError("p2p: querying the UCX worker", st);
  if (wattr.max_am_header < sizeof(AskHeader)) {
    return Status::Unavailable("p2p: UCX carries active message headers of at most " +
                               std::to_string(wattr.max_am_header) + " bytes, an ask's is " +
                               std::to_string(sizeof(AskHeader)));
  }
  for (auto [id, cb] : {std::pair{kAskId, &UcxCallbacks::Ask}, {kAnswerId, &UcxCallbacks::Answer}}) {
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    h.id = id;
    h.cb = cb;
    h.arg = node.get();
    st = ucp_worker_set_am_recv_handler(node->worker_, &h);
    if (st != UCS_OK) return UcxError("p2p: setting an active message handler", st);
  }
  // Request ids start at a random point: an answer must also come from the asked endpoint,
  // this only makes a forged one harder to aim.
  node->next_request_ = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);

  if (!o.listen_host.empty()) {
    auto addr = Resolve(o.listen_host, o.listen_port, /*to_listen=*/true);
    if (!addr.ok()) return addr.status();
    ucp_listener_params_t lparams{};
    lparams.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lparams.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
    lparams.sockaddr.addrlen = AddrLen(*addr);
    lparams.conn_handler.cb = &UcxCallbacks::ConnRequest;
    lparams.conn_handler.arg = node.get();
    st = ucp_listener_create(node->worker_, &lparams, &node->listener_);
    if (st != UCS_OK) {
      return UcxError("p2p: listening on " + o.listen_host + ":" + std::to_string(o.listen_port), st);
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(node->listener_, &attr);
    if (st != UCS_OK) return UcxError("p2p: querying the listener", st);
    node->listen_port_ = attr.sockaddr.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&attr.sockaddr)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&attr.sockaddr)->sin_port);
  }
  return node;
}

UcxNode::~UcxNode() {
  if (!regions_.empty() || live_peers_ != 0) {
    spdlog::critical("p2p: UcxNode destroyed before its {} regions and {} peers",
                     regions_.size(), live_peers_);
    std::abort();
  }
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  if (worker_ != nullptr) {
    std::vector<ucp_ep_h> accepted;
    for (auto& [ep, peer] : accepted_) accepted.push_back(ep);
    accepted_.clear();
    for (ucp_ep_h ep : accepted) CloseEndpoint(ep, /*force=*/true);
    // Closing the endpoints cancelled every answer in flight; their holds go with them.
    while (!sends_.empty()) {
      ProgressOnce();
      ReapSends();
    }
    ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucp_cleanup(context_);
}

bool UcxNode::ProgressOnce() { return ucp_worker_progress(worker_) != 0; }

void UcxNode::ProgressFor(std::chrono::milliseconds wait) {
  // Polls for a short while before sleeping: shared-memory transports do not always wake the
  // event descriptor, and an answer usually comes within microseconds.
  // An idle node (nothing for kActive) sleeps at once: no polling while nothing moves.
  constexpr auto kSpin = std::chrono::microseconds(200);
  constexpr auto kActive = std::chrono::milliseconds(10);
  bool busy = false;
  const auto now = std::chrono::steady_clock::now();
  const auto spin_until = now - last_busy_ < kActive || !sends_.empty() ? now + kSpin : now;
  do {
    while (ProgressOnce()) busy = true;
  } while (!busy && asks_.empty() && std::chrono::steady_clock::now() < spin_until);
  if (busy) last_busy_ = std::chrono::steady_clock::now();
  if (!busy && asks_.empty() && accepted_failed_.empty() && wait.count() > 0) {
    if (ucp_worker_arm(worker_) == UCS_OK) {
      pollfd pfd{event_fd_, POLLIN, 0};
      (void)poll(&pfd, 1, static_cast<int>(wait.count()));
    }
    while (ProgressOnce()) {
    }
  }
  DropFailedEndpoints();
  AnswerAsks();
  ReapSends();
}

void UcxNode::DropFailedEndpoints() {
  while (!accepted_failed_.empty()) {
    std::vector<ucp_ep_h> failed;
    failed.swap(accepted_failed_);
    for (ucp_ep_h ep : failed) {
      if (accepted_.erase(ep) == 0) continue;
      CloseEndpoint(ep, /*force=*/true);
      // UCX may hand the same handle to a later peer: nothing may refer to this one now.
      std::erase_if(asks_, [ep](const Ask& a) { return a.reply_ep == ep; });
      for (auto& send : sends_) {
        if (send->ep == ep) send->ep = nullptr;
      }
    }
  }
}

void UcxNode::AnswerAsks() {
  std::vector<Ask> asks;
  asks.swap(asks_);
  for (const Ask& ask : asks) {
    auto peer = accepted_.find(ask.reply_ep);
    if (peer == accepted_.end()) continue;  // the endpoint failed since: nobody to answer
    if (ask.refused) {
      if (++refused_asks_ == 1) {
        spdlog::warn("p2p: refused an ask whose token is not this node's (a wrong shared secret)");
      }
    }
    Result<ServedBytes> served =
        ask.refused    ? Result<ServedBytes>(Status::FailedPrecondition("p2p: wrong shared secret"))
        : options_.serve ? options_.serve(peer->second.peer_id,
                                          ServeAsk{.object = ask.object, .name = ask.name,
                                                   .offset = ask.offset, .length = ask.length})
                         : Result<ServedBytes>(Status::NotFound("p2p: this node serves nothing"));
    if (served.ok() && (served->length != ask.length || served->data == nullptr)) {
      spdlog::error("p2p: serve answered {} bytes for an item of {}", served->length, ask.length);
      served = Status::Internal("p2p: serve answered a wrong length");
    } else if (served.ok() && !InLocalRegion(served->data, served->length)) {
      // Answers come from registered memory only (kvd's L1): no registration per answer, and
      // nothing that relies on UCX's memory hooks (docs/p2p.md).
      spdlog::error("p2p: serve answered bytes outside every registered region");
      served = Status::Internal("p2p: serve answered unregistered memory");
    }
    auto send = std::make_unique<Send>();
    AnswerHeader h{.request = ask.request, .index = ask.index,
                   .status = static_cast<uint64_t>(served.ok() ? StatusCode::kOk : served.status().code()),
                   .length = served.ok() ? served->length : 0};
    static_assert(sizeof(h) <= sizeof(send->header));
    std::memcpy(send->header, &h, sizeof(h));
    if (served.ok()) send->hold = std::move(served->hold);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    param.cb.send = &UcxCallbacks::SendDone;
    param.user_data = send.get();
    ucs_status_ptr_t r = ucp_am_send_nbx(ask.reply_ep, kAnswerId, send->header, sizeof(h),
                                         served.ok() ? served->data : nullptr,
                                         served.ok() ? served->length : 0, &param);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {  // sent (or failed) at once: hold released
      --peer->second.unanswered;
      continue;
    }
    send->request = r;
    send->ep = ask.reply_ep;
    send->started = std::chrono::steady_clock::now();
    sends_.push_back(std::move(send));
  }
}

void UcxNode::ReapSends() {
  const auto expired = std::chrono::steady_clock::now() -
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(options_.answer_timeout_s));
  std::erase_if(sends_, [&](const std::unique_ptr<Send>& s) {
    if (!s->done) {
      // Not taken in time: the endpoint is closed by the next DropFailedEndpoints.
      if (s->started < expired && accepted_.contains(s->ep) &&
          std::find(accepted_failed_.begin(), accepted_failed_.end(), s->ep) == accepted_failed_.end()) {
        spdlog::warn("p2p: a peer did not take an answer in {} s; closing its connection",
                     options_.answer_timeout_s);
        accepted_failed_.push_back(s->ep);
      }
      return false;
    }
    ucp_request_free(s->request);
    if (auto peer = accepted_.find(s->ep); peer != accepted_.end()) --peer->second.unanswered;
    return true;
  });
}

void UcxNode::CloseEndpoint(ucp_ep_h ep, bool force) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  while (ucp_request_check_status(request) == UCS_INPROGRESS) ProgressOnce();
  ucp_request_free(request);
}

bool UcxNode::InLocalRegion(const void* p, size_t len) const {
  return std::any_of(regions_.begin(), regions_.end(),
                     [&](const UcxRegion* r) { return r->Contains(p, len); });
}

Result<std::unique_ptr<UcxRegion>> UcxNode::Register(void* base, size_t length) {
  if (base == nullptr || length == 0) {
    return Status::InvalidArgument("p2p: cannot register an empty region");
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = length;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_, &params, &memh);
  if (st != UCS_OK) return UcxError("p2p: registering " + std::to_string(length) + " bytes", st);
  std::unique_ptr<UcxRegion> region(new UcxRegion(this, memh, static_cast<uint8_t*>(base), length));
  regions_.push_back(region.get());
  return region;
}

Result<std::unique_ptr<UcxPeer>> UcxNode::Connect(const std::string& host, int port) {
  auto addr = Resolve(host, port, /*to_listen=*/false);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<UcxPeer> peer(new UcxPeer(this, host + ":" + std::to_string(port)));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  params.sockaddr.addrlen = AddrLen(*addr);
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxCallbacks::PeerError;
  params.err_handler.arg = peer.get();
  ucs_status_t st = ucp_ep_create(worker_, &params, &peer->ep_);
  if (st != UCS_OK) return UcxError("p2p: connecting to " + peer->address_, st);
  ++live_peers_;
  return peer;
}

// ---- UcxRegion -----------------------------------------------------------------------------

UcxRegion::~UcxRegion() {
  auto& regions = node_->regions_;
  regions.erase(std::remove(regions.begin(), regions.end(), this), regions.end());
  ucp_mem_unmap(node_->context_, memh_);
}

bool UcxRegion::Contains(const void* p, size_t len) const {
  auto at = reinterpret_cast<uintptr_t>(p);
  auto begin = reinterpret_cast<uintptr_t>(base_);
  return at >= begin && len <= length_ && at - begin <= length_ - len;
}

// ---- UcxPeer -------------------------------------------------------------------------------

UcxPeer::~UcxPeer() {
  Close();
  --node_->live_peers_;
}

void UcxPeer::Close() {
  if (ep_ == nullptr) return;
  ucp_ep_h ep = ep_;
  ep_ = nullptr;
  // A healthy connection is closed in order, so that the peer learns at once and drops its
  // endpoint; a broken one (or one with reads cancelled) is closed at once.
  node_->CloseEndpoint(ep, /*force=*/broken());
}

Status UcxPeer::WaitConnected(Deadline deadline) {
  if (!error_.ok()) return error_;
  if (connected_) return Status::Ok();
  ucp_request_param_t param{};
  ucs_status_ptr_t request = ucp_ep_flush_nbx(ep_, &param);
  if (UCS_PTR_IS_ERR(request)) {
    error_ = UcxError("p2p: connecting to " + address_, UCS_PTR_STATUS(request));
    Close();
    return error_;
  }
  if (request != nullptr) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS && error_.ok() &&
           std::chrono::steady_clock::now() < deadline) {
      node_->ProgressFor(std::chrono::milliseconds(1));
    }
    ucs_status_t st = ucp_request_check_status(request);
    if (st == UCS_INPROGRESS) {
      if (error_.ok()) error_ = Status::Unavailable("p2p: connecting to " + address_ + " timed out");
      Close();  // completes the flush (cancelled)
      while ((st = ucp_request_check_status(request)) == UCS_INPROGRESS) node_->ProgressOnce();
    }
    ucp_request_free(request);
    if (st != UCS_OK && error_.ok()) error_ = UcxError("p2p: connecting to " + address_, st);
  }
  if (!error_.ok()) {
    Close();
    return error_;
  }
  connected_ = true;
  return Status::Ok();
}

ReadAnswer UcxPeer::Read(std::span<const ReadItem> items, Deadline deadline) {
  ReadAnswer answer;
  if (items.empty()) return answer;
  if (items.size() > kMaxItems) {
    answer.first_error = Status::InvalidArgument("p2p: " + std::to_string(items.size()) +
                                                 " items in one read (at most " +
                                                 std::to_string(kMaxItems) + ")");
    return answer;
  }
  // Every item is checked before any is asked for: a bad batch reads nothing.
  for (size_t i = 0; i < items.size(); ++i) {
    const ReadItem& item = items[i];
    std::string which = "p2p: item " + std::to_string(i) + " of a read from " + address_;
    if (item.length == 0 || item.length > kMaxItemBytes || item.dst == nullptr) {
      answer.first_error = Status::InvalidArgument(which + ": length " + std::to_string(item.length));
      return answer;
    }
    if (!node_->InLocalRegion(item.dst, item.length)) {
      answer.first_error = Status::InvalidArgument(which + ": destination not in a registered region");
      return answer;
    }
    if (item.name.size() > kMaxNameBytes) {
      answer.first_error = Status::InvalidArgument(which + ": a name of " +
                                                   std::to_string(item.name.size()) + " bytes (at most " +
                                                   std::to_string(kMaxNameBytes) + ")");
      return answer;
    }
  }
  if (Status s = WaitConnected(deadline); !s.ok()) {
    answer.first_error = s;
    return answer;
  }

  using P = UcxNode::PendingRead;
  P read;
  read.items = items;
  read.peer = this;
  read.state.assign(items.size(), P::kWaiting);
  read.error.resize(items.size());
  read.receive.assign(items.size(), nullptr);
  read.asks.resize(items.size());
  read.ask_sends.assign(items.size(), nullptr);
  const uint64_t request = node_->next_request_++;
  node_->reads_[request] = &read;

  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& name = items[i].name;
    read.asks[i] = AskHeader{.request = request, .index = i, .object = items[i].object,
                             .offset = items[i].offset, .length = items[i].length,
                             .name_length = name.size()};
    std::memcpy(read.asks[i].token, node_->token_.data(), kTokenBytes);
    // The name goes eagerly (the serving node drops a name that comes by rendezvous); UCX reads
    // it until the send completes, which `step` below waits for.
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep_, kAskId, &read.asks[i], sizeof(AskHeader),
                                         name.empty() ? nullptr : name.data(), name.size(), &param);
    if (UCS_PTR_IS_ERR(r)) {
      read.state[i] = P::kFailed;
      read.error[i] = UcxError("p2p: asking " + address_, UCS_PTR_STATUS(r));
    } else {
      read.ask_sends[i] = r;
    }
  }

  // Starts deferred rendezvous receives and collects finished ones; true while any item waits.
  auto step = [&] {
    for (auto [index, desc] : std::exchange(read.deferred, {})) {
      ucp_request_param_t param{};
      ucs_status_ptr_t r = ucp_am_recv_data_nbx(node_->worker_, desc, items[index].dst,
                                                items[index].length, &param);
      if (r == nullptr) {
        read.state[index] = P::kDone;
      } else if (UCS_PTR_IS_ERR(r)) {
        read.state[index] = P::kFailed;
        read.error[index] = UcxError("p2p: receiving from " + address_, UCS_PTR_STATUS(r));
      } else {
        read.receive[index] = r;
      }
    }
    bool waiting = false;
    for (size_t i = 0; i < items.size(); ++i) {
      if (read.ask_sends[i] != nullptr && ucp_request_check_status(read.ask_sends[i]) != UCS_INPROGRESS) {
        ucp_request_free(read.ask_sends[i]);
        read.ask_sends[i] = nullptr;
      }
      if (read.receive[i] != nullptr) {
        ucs_status_t st = ucp_request_check_status(read.receive[i]);
        if (st != UCS_INPROGRESS) {
          ucp_request_free(read.receive[i]);
          read.receive[i] = nullptr;
          read.state[i] = st == UCS_OK ? P::kDone : P::kFailed;
          if (st != UCS_OK) read.error[i] = UcxError("p2p: receiving from " + address_, st);
        }
      }
      waiting |= read.state[i] == P::kWaiting || read.state[i] == P::kReceiving ||
                 read.ask_sends[i] != nullptr;
    }
    return waiting;
  };
  while (step() && error_.ok() && std::chrono::steady_clock::now() < deadline) {
    node_->ProgressFor(std::chrono::milliseconds(0));  // polls: the reads are this thread's work
  }
  if (step()) {
    // Late or failed: no answer is accepted any more, and closing the endpoint cancels what is
    // in flight; wait until UCX has finished every receive, so that no destination is written
    // after Read returns.
    node_->reads_.erase(request);
    if (error_.ok()) error_ = Status::Unavailable("p2p: read from " + address_ + " timed out");
    Close();
    for (auto [index, desc] : std::exchange(read.deferred, {})) {
      ucp_am_data_release(node_->worker_, desc);
      read.state[index] = P::kFailed;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (read.state[i] == P::kWaiting) read.state[i] = P::kFailed;
    }
    while (step()) node_->ProgressOnce();
  }
  node_->reads_.erase(request);
  for (size_t i = 0; i < items.size(); ++i) {
    if (read.state[i] != P::kDone) {
      answer.first_error = !read.error[i].ok() ? read.error[i] : error_;
      if (answer.first_error.ok()) answer.first_error = Status::Unavailable("p2p: item not read");
      return answer;
    }
    answer.completed_prefix = i + 1;
  }
  return answer;
}

}  // namespace kvd::p2p
