// ZmtpRouter against real libzmq clients (DEALER sockets, as lmcache's client uses) and raw
// TCP peers: routing ids, round trips, round robin, limits that close one connection only,
// the read and write bounds, heartbeats, binding.
#include "net/zmtp_router.h"

#include "../common/descriptor_exhaustion.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvd::net {
namespace {

using Strings = std::vector<std::string>;

Strings AsStrings(const std::vector<zmq::message_t>& m) {
  Strings out;
  for (const auto& f : m) out.emplace_back(static_cast<const char*>(f.data()), f.size());
  return out;
}

class ZmtpRouterTest : public ::testing::Test {
 protected:
  void Start(ZmtpRouter::Options o = {}) {
    router_ = std::make_unique<ZmtpRouter>(o);
    ASSERT_TRUE(router_->Bind("127.0.0.1", 0).ok());
    url_ = "tcp://127.0.0.1:" + std::to_string(router_->port());
  }
  zmq::socket_t Dealer(const std::string& routing_id = "") {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    if (!routing_id.empty()) s.set(zmq::sockopt::routing_id, routing_id);
    s.connect(url_);
    return s;
  }
  // Runs the router until `n` messages arrived (or 5 s); returns them.
  std::vector<Strings> ReceiveN(size_t n, int timeout_ms = 5000) {
    std::vector<Strings> got;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (got.size() < n && std::chrono::steady_clock::now() < end) {
      router_->Wait(10);
      std::vector<zmq::message_t> f;
      while (got.size() < n && router_->Receive(&f)) {
        got.push_back(AsStrings(f));
        f.clear();
      }
    }
    return got;
  }
  void Pump(int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end) router_->Wait(5);
  }
  bool Reply(const std::string& id, const Strings& frames) {
    std::vector<zmq::message_t> m;
    m.emplace_back(id.data(), id.size());
    for (const auto& f : frames) m.emplace_back(f.data(), f.size());
    return router_->Send(m.data(), m.size());
  }
  static std::optional<Strings> Recv(zmq::socket_t& s, int timeout_ms = 5000) {
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 0) return std::nullopt;
    std::vector<zmq::message_t> m;
    if (!zmq::recv_multipart(s, std::back_inserter(m))) return std::nullopt;
    return AsStrings(m);
  }
  // A raw TCP connection to the router.
  int RawConnect() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(router_->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  }
  static void WriteAll(int fd, const std::string& b) {
    size_t off = 0;
    while (off < b.size()) {
      const ssize_t n = write(fd, b.data() + off, b.size() - off);
      ASSERT_GT(n, 0);
      off += static_cast<size_t>(n);
    }
  }
  static std::string ReadSome(int fd, size_t n, int timeout_ms = 2000) {
    std::string out;
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    while (out.size() < n) {
      const ssize_t r = read(fd, buf, std::min(sizeof(buf), n - out.size()));
      if (r <= 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
    return out;
  }
  std::string RawHandshake(int fd, const std::string& socket_type = "DEALER") {
    const std::pair<std::string_view, std::string_view> props[] = {{"Socket-Type", socket_type}};
    WriteAll(fd, EncodeGreeting() + EncodeReady(props));
    return "";
  }

  zmq::context_t ctx_{1};
  std::unique_ptr<ZmtpRouter> router_;
  std::string url_;
};

std::string Frame(std::string_view body, bool more) {
  uint8_t hdr[9];
  const size_t n = EncodeFrameHeader(body.size(), more, hdr);
  return std::string(reinterpret_cast<char*>(hdr), n) + std::string(body);
}

TEST_F(ZmtpRouterTest, DealerRoundTripWithAGeneratedRoutingId) {
  Start();
  auto d = Dealer();
  d.send(zmq::str_buffer("uid"), zmq::send_flags::sndmore);
  d.send(zmq::str_buffer("ping"), zmq::send_flags::none);
  auto got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].size(), 3u);
  const std::string id = got[0][0];
  EXPECT_EQ(id.size(), 5u);
  EXPECT_EQ(id[0], '\0');  // libzmq's form of a generated id
  EXPECT_EQ((Strings{got[0][1], got[0][2]}), (Strings{"uid", "ping"}));
  ASSERT_TRUE(Reply(id, {"uid", "pong", std::string(100000, 'r')}));
  router_->Flush();
  std::optional<Strings> r;
  for (int i = 0; i < 100 && !r; ++i) {
    router_->Wait(5);
    r = Recv(d, 10);
  }
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, (Strings{"uid", "pong", std::string(100000, 'r')}));
}

TEST_F(ZmtpRouterTest, ARoutingIdThePeerAsksForIsUsedAndASecondClaimantIsRefused) {
  Start();
  auto a = Dealer("worker-7");
  a.send(zmq::str_buffer("one"), zmq::send_flags::none);
  auto got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0][0], "worker-7");
  auto b = Dealer("worker-7");
  b.send(zmq::str_buffer("two"), zmq::send_flags::none);
  EXPECT_TRUE(ReceiveN(1, 300).empty());
  a.send(zmq::str_buffer("three"), zmq::send_flags::none);
  got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], (Strings{"worker-7", "three"}));
}

TEST_F(ZmtpRouterTest, MessagesAreTakenRoundRobinAcrossConnections) {
  Start();
  auto a = Dealer("a"), b = Dealer("b");
  // Both connected and their backlogs read before anything is taken.
  a.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  b.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  ASSERT_EQ(ReceiveN(2).size(), 2u);
  for (int i = 0; i < 50; ++i) a.send(zmq::str_buffer("a"), zmq::send_flags::none);
  for (int i = 0; i < 50; ++i) b.send(zmq::str_buffer("b"), zmq::send_flags::none);
  Pump(200);
  std::vector<zmq::message_t> f;
  std::string order;
  while (order.size() < 10 && router_->Receive(&f)) {
    order += AsStrings(f)[0];
    f.clear();
  }
  EXPECT_NE(order.find('a'), std::string::npos) << order;
  EXPECT_NE(order.find('b'), std::string::npos) << order;
  EXPECT_EQ(order.find("aaa"), std::string::npos) << order;
}

TEST_F(ZmtpRouterTest, AFrameOverTheLimitClosesOnlyThatConnection) {
  ZmtpRouter::Options o;
  o.limits.max_frame_bytes = 1000;
  o.limits.max_message_bytes = 2000;
  o.limits.max_frames = 4;
  Start(o);
  auto good = Dealer("good"), bad = Dealer("bad");
  bad.send(zmq::buffer(std::string(1001, 'x')), zmq::send_flags::none);
  Pump(200);
  EXPECT_EQ(router_->stats().protocol_errors, 1u);
  good.send(zmq::str_buffer("still"), zmq::send_flags::none);
  auto got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], (Strings{"good", "still"}));
}

// Regression (issue 11, finding 11): libzmq bounds each frame, not a message, so one message
// of many maximum-size frames was buffered whole (20 x 100 MiB: 2 GB of RSS).
TEST_F(ZmtpRouterTest, Finding11AMessageOfTooManyFramesOrBytesIsRefusedWhileArriving) {
  ZmtpRouter::Options o;
  o.limits.max_frame_bytes = 100000;
  o.limits.max_message_bytes = 150000;
  o.limits.max_frames = 4;
  Start(o);
  auto many = Dealer("many");
  for (int i = 0; i < 5; ++i) {
    many.send(zmq::str_buffer("f"), i < 4 ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  auto heavy = Dealer("heavy");
  const std::string f(90000, 'h');
  for (int i = 0; i < 3; ++i) {
    heavy.send(zmq::buffer(f), i < 2 ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  Pump(300);
  EXPECT_EQ(router_->stats().protocol_errors, 2u);
  std::vector<zmq::message_t> m;
  EXPECT_FALSE(router_->Receive(&m));
}

TEST_F(ZmtpRouterTest, AConnectionIsNotReadWhileItsMessagesWaitToBeTaken) {
  ZmtpRouter::Options o;
  o.max_pending_messages = 4;
  Start(o);
  auto d = Dealer("d");
  const std::string body(1024, 'p');
  const size_t sent = 500;  // under the DEALER's own SNDHWM: all of it leaves the client
  for (size_t i = 0; i < sent; ++i) d.send(zmq::buffer(body), zmq::send_flags::none);
  Pump(300);  // nothing taken: the router reads one budget of messages, then stops
  std::vector<zmq::message_t> m;
  size_t taken = 0;
  while (router_->Receive(&m)) {
    taken++;
    m.clear();
  }
  // At most what one read brings (the 16 KiB buffer: 15 messages of 1 KiB + headers) past
  // the bound.
  EXPECT_GE(taken, 4u);
  EXPECT_LE(taken, 4u + ZmtpDecoder::kBufferBytes / 1024);
  // Taking them resumes reading: everything arrives.
  auto rest = ReceiveN(sent - taken, 10000);
  EXPECT_EQ(rest.size(), sent - taken);
}

TEST_F(ZmtpRouterTest, RepliesToAPeerThatDoesNotReadAreBoundedThenDropped) {
  ZmtpRouter::Options o;
  o.max_unsent_bytes = 4u << 20;
  Start(o);
  const int fd = RawConnect();
  RawHandshake(fd);
  WriteAll(fd, Frame("hi", false));
  auto got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  const std::string id = got[0][0];
  const std::string big(1u << 20, 'u');
  int queued = 0;
  for (int i = 0; i < 64; ++i) {
    queued += Reply(id, {big});
    router_->Flush();
  }
  // The socket buffers take some; the rest stops at 4 MiB unsent.
  EXPECT_LT(queued, 64);
  EXPECT_GE(router_->stats().dropped_messages, 1u);
  close(fd);
}

TEST_F(ZmtpRouterTest, PingIsAnsweredWithPongAndItsContext) {
  Start();
  const int fd = RawConnect();
  RawHandshake(fd);
  WriteAll(fd, EncodeCommand("PING", std::string("\x00\x64", 2) + "ctx42"));
  Pump(200);
  // Our greeting, READY, then PONG.
  const std::string in = ReadSome(fd, 4096, 500);
  ASSERT_GE(in.size(), kGreetingBytes);
  EXPECT_EQ(in.substr(0, 12), EncodeGreeting().substr(0, 12));
  EXPECT_NE(in.find(EncodeCommand("PONG", "ctx42")), std::string::npos);
  close(fd);
}

TEST_F(ZmtpRouterTest, AMessageSentJustBeforeClosingIsStillDelivered) {
  Start();
  {
    zmq::socket_t d(ctx_, zmq::socket_type::dealer);
    d.set(zmq::sockopt::linger, 2000);
    d.connect(url_);
    d.send(zmq::str_buffer("last words"), zmq::send_flags::none);
    Pump(100);
  }  // closed
  auto got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0][1], "last words");
  Pump(100);
  EXPECT_EQ(router_->stats().connections, 0u);
}

TEST_F(ZmtpRouterTest, SocketsOfOtherTypesAndNonZmtpPeersAreClosed) {
  Start();
  const int pub = RawConnect();
  RawHandshake(pub, "PUB");
  const int http = RawConnect();
  WriteAll(http, "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(64, ' '));
  Pump(200);
  EXPECT_EQ(router_->stats().protocol_errors, 2u);
  EXPECT_EQ(router_->stats().connections, 0u);
  close(pub);
  close(http);
}

TEST_F(ZmtpRouterTest, AConnectionThatNeverFinishesItsHandshakeIsClosed) {
  ZmtpRouter::Options o;
  o.handshake_timeout_ms = 200;
  Start(o);
  const int silent = RawConnect();  // connects, sends nothing
  const int half = RawConnect();
  WriteAll(half, EncodeGreeting());  // a greeting but no READY
  auto d = Dealer("d");              // a real client: handshake done at once
  d.send(zmq::str_buffer("hi"), zmq::send_flags::none);
  ASSERT_EQ(ReceiveN(1).size(), 1u);
  Pump(500);
  EXPECT_EQ(router_->stats().handshake_timeouts, 2u);
  EXPECT_EQ(router_->stats().connections, 1u);
  // The silent peer got kvd's greeting, then the end of the stream.
  EXPECT_EQ(ReadSome(silent, kGreetingBytes, 500).size(), kGreetingBytes);
  char c;
  EXPECT_EQ(read(silent, &c, 1), 0) << "not closed by kvd";
  d.send(zmq::str_buffer("still here"), zmq::send_flags::none);
  auto got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0][1], "still here");
  close(silent);
  close(half);
}

// Finding 7 (issue 27): bounds on connections, descriptors, and how connections end.
bool ClosedByRouter(int fd, int timeout_ms = 500) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  for (;;) {
    const ssize_t r = read(fd, buf, sizeof(buf));
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    if (r < 0) return false;  // timed out: still open
  }
}

void ExpectEndsAddUp(const ZmtpRouter::Stats& s) {
  uint64_t sum = 0;
  for (uint64_t n : s.closed_by) sum += n;
  EXPECT_EQ(sum, s.closed);
  EXPECT_EQ(s.accepted, s.connections + s.closed);
}

TEST_F(ZmtpRouterTest, Finding7APerAddressBoundEvictsTheOldestHandshakeThenRejects) {
  ZmtpRouter::Options o;
  o.max_connections_per_address = 2;
  Start(o);
  const int a = RawConnect(), b = RawConnect();
  Pump(50);
  const int c = RawConnect();  // replaces a, the oldest unfinished handshake
  Pump(50);
  EXPECT_TRUE(ClosedByRouter(a));
  EXPECT_FALSE(ClosedByRouter(b, 50));
  RawHandshake(b);
  RawHandshake(c);
  Pump(50);
  const int d = RawConnect();  // both finished their handshake: d is rejected
  Pump(50);
  EXPECT_TRUE(ClosedByRouter(d));
  EXPECT_FALSE(ClosedByRouter(b, 50));
  EXPECT_FALSE(ClosedByRouter(c, 50));
  const ZmtpRouter::Stats s = router_->stats();
  EXPECT_EQ(s.connections, 2u);
  EXPECT_EQ(s.closed_by[static_cast<size_t>(ZmtpRouter::CloseReason::kEvicted)], 1u);
  EXPECT_EQ(s.rejected[static_cast<size_t>(ZmtpRouter::RejectReason::kPerAddress)], 1u);
  ExpectEndsAddUp(s);
  for (int fd : {a, b, c, d}) close(fd);
  Pump(50);
  EXPECT_EQ(router_->stats().connections, 0u);
  EXPECT_EQ(router_->stats().closed_by[static_cast<size_t>(ZmtpRouter::CloseReason::kPeer)], 2u);
  ExpectEndsAddUp(router_->stats());
}

TEST_F(ZmtpRouterTest, Finding7TheTotalBoundKeepsHandshakedClientsAndRejectsNewcomers) {
  ZmtpRouter::Options o;
  o.max_connections = 1;
  Start(o);
  auto d = Dealer("d");
  d.send(zmq::str_buffer("hi"), zmq::send_flags::none);
  ASSERT_EQ(ReceiveN(1).size(), 1u);
  const int late = RawConnect();
  Pump(50);
  EXPECT_TRUE(ClosedByRouter(late));
  EXPECT_EQ(router_->stats().rejected[static_cast<size_t>(ZmtpRouter::RejectReason::kTotal)], 1u);
  d.send(zmq::str_buffer("still here"), zmq::send_flags::none);
  ASSERT_EQ(ReceiveN(1).size(), 1u);
  close(late);
  ExpectEndsAddUp(router_->stats());
}

TEST_F(ZmtpRouterTest, Finding7OutOfDescriptorsAcceptingPausesInsteadOfSpinning) {
  Start();
  auto d = Dealer("d");  // handshaked: nothing to evict
  d.send(zmq::str_buffer("hi"), zmq::send_flags::none);
  ASSERT_EQ(ReceiveN(1).size(), 1u);
  const int waiting = RawConnect();  // in the backlog until the router accepts it
  int waits = 0;
  {
    testing_util::ExhaustDescriptors short_of_descriptors;
    ASSERT_TRUE(short_of_descriptors.ok());
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < end) {
      router_->Wait(50);
      ++waits;
    }
  }
  EXPECT_LT(waits, 40) << "the loop spun on the listener";
  EXPECT_GE(router_->stats().accept_pauses, 1u);
  EXPECT_EQ(router_->stats().connections, 1u);
  Pump(250);  // accepting resumed
  EXPECT_EQ(router_->stats().connections, 2u);
  close(waiting);
}

TEST_F(ZmtpRouterTest, Finding7OutOfDescriptorsTheOldestUnfinishedHandshakeMakesRoom) {
  Start();
  const int silent = RawConnect();
  Pump(50);
  const int waiting = RawConnect();
  {
    testing_util::ExhaustDescriptors short_of_descriptors;
    ASSERT_TRUE(short_of_descriptors.ok());
    Pump(50);
  }
  EXPECT_TRUE(ClosedByRouter(silent));
  EXPECT_EQ(router_->stats().closed_by[static_cast<size_t>(ZmtpRouter::CloseReason::kEvicted)], 1u);
  EXPECT_EQ(router_->stats().connections, 1u);  // `waiting` took its place
  close(silent);
  close(waiting);
}

// The descriptors of the router's accepted connections (a socket whose local port is the
// router's and that has a peer): the listener has no peer, the test's clients another port.
std::vector<int> AcceptedDescriptors(int port, int below) {
  std::vector<int> out;
  for (int fd = 0; fd < below; ++fd) {
    sockaddr_in local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || local.sin_family != AF_INET) continue;
    if (ntohs(local.sin_port) != port) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    out.push_back(fd);
  }
  return out;
}

TEST_F(ZmtpRouterTest, Finding7ADescriptorFloodNeverKeepsAConnectionPastTheReserve) {
  // Before the fix, a connection accepted on a descriptor past fd_limit() replaced the oldest
  // unfinished handshake but stayed on its high descriptor, so a flood filled the reserve one
  // eviction at a time and kvd ran out of descriptors for tier files and shared memory
  // (test_r2_finding7_a_descriptor_flood... failed under ASan: register_kv_cache got EMFILE).
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  const int probe = dup(0);
  close(probe);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(probe + 400);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  ZmtpRouter::Options o;
  o.fd_reserve = 200;
  Start(o);
  const int limit = router_->fd_limit();
  ASSERT_LE(limit, probe + 200);
  std::vector<int> flood;
  for (int i = 0; i < 150; ++i) {  // clients and accepted connections take turns
    flood.push_back(RawConnect());
    Pump(2);
  }
  Pump(50);
  const std::vector<int> accepted = AcceptedDescriptors(router_->port(), probe + 400);
  setrlimit(RLIMIT_NOFILE, &old);
  EXPECT_GE(router_->stats().closed_by[static_cast<size_t>(ZmtpRouter::CloseReason::kEvicted)], 1u);
  EXPECT_EQ(accepted.size(), router_->stats().connections);
  for (int fd : accepted) EXPECT_LT(fd, limit) << "a connection was kept past the reserve";
  ExpectEndsAddUp(router_->stats());
  for (int fd : flood) close(fd);
}

TEST_F(ZmtpRouterTest, BindErrorsNameTheAddress) {
  Start();
  ZmtpRouter other({});
  Status s = other.Bind("127.0.0.1", router_->port());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot listen on tcp://127.0.0.1:" + std::to_string(router_->port())),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("in use"), std::string::npos) << s.message();
  ZmtpRouter bad({});
  s = bad.Bind("no-such-host.invalid", 5555);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not an IP address or a network interface"), std::string::npos);
  ZmtpRouter lo({});
  EXPECT_TRUE(lo.Bind("lo", 0).ok());  // an interface name, as libzmq takes
}

TEST_F(ZmtpRouterTest, IPv6LoopbackServes) {
  router_ = std::make_unique<ZmtpRouter>(ZmtpRouter::Options{});
  Status s = router_->Bind("::1", 0);
  if (!s.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << s.message();
  zmq::socket_t d(ctx_, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.set(zmq::sockopt::ipv6, 1);
  d.connect("tcp://[::1]:" + std::to_string(router_->port()));
  d.send(zmq::str_buffer("v6"), zmq::send_flags::none);
  auto got = ReceiveN(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0][1], "v6");
}

}  // namespace
}  // namespace kvd::net
