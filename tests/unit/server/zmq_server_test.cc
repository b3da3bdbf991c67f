// The socket loop over real ZMQ: envelopes echoed byte for byte, exactly one reply
// frame, malformed messages answered or dropped without disturbing other clients.
#include "server/zmq_server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>
#include <msgpack.hpp>

#include "wire/codec.h"

namespace kvd::server {
namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

class ZmqServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.host = "127.0.0.1";
    cfg_.port = FreePort();
    cfg_.l1_size_gb = 0.01;
    cfg_.eviction_policy = "LRU";
    cfg_.shm_name = "kvd_zmq_test_" + std::to_string(getpid());
    svc_ = std::move(KvService::Create(cfg_, &clock_)).value();
    server_ = std::make_unique<ZmqServer>(cfg_, svc_.get(), &metrics_);
    ASSERT_TRUE(server_->Bind().ok());
    thread_ = std::thread([this] { server_->Run(stop_); });
  }
  void TearDown() override {
    stop_ = true;
    thread_.join();
  }
  zmq::socket_t Client() {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 5000);
    s.connect(cfg_.ZmqEndpoint());
    return s;
  }
  static void SendFrames(zmq::socket_t& s, const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      s.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  static std::vector<std::string> Recv(zmq::socket_t& s) {
    std::vector<zmq::message_t> msg;
    auto r = zmq::recv_multipart(s, std::back_inserter(msg));
    std::vector<std::string> out;
    if (!r) return out;
    for (auto& m : msg) out.push_back(m.to_string());
    return out;
  }

  ServerConfig cfg_;
  SteadyClock clock_;
  std::unique_ptr<KvService> svc_;
  RequestMetrics metrics_;
  std::unique_ptr<ZmqServer> server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  zmq::context_t ctx_{1};
};

TEST_F(ZmqServerTest, EchoesUidAndOpAndSendsOneReplyFrame) {
  auto c = Client();
  std::string uid = wire::EncodeInt(300);  // a 3-byte msgpack int
  std::string op = wire::EncodeInt(21);    // get_chunk_size
  SendFrames(c, {uid, op});
  auto r = Recv(c);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], uid);
  EXPECT_EQ(r[1], op);
  EXPECT_EQ(r[2], wire::EncodeInt(256));
  // The op by name, as newer clients send ops missing from the frozen table.
  SendFrames(c, {uid, wire::EncodeStr("noop")});
  r = Recv(c);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1], wire::EncodeStr("noop"));
  EXPECT_EQ(r[2], wire::EncodeStr("OK"));
}

TEST_F(ZmqServerTest, MalformedRequestsGetFailureRepliesAndOthersKeepWorking) {
  auto bad = Client();
  auto good = Client();
  SendFrames(bad, {wire::EncodeInt(1)});                               // no op frame: dropped
  SendFrames(bad, {wire::EncodeInt(2), wire::EncodeInt(77)});          // unknown op
  auto r = Recv(bad);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], wire::EncodeInt(2));
  EXPECT_EQ(r[2], wire::EncodeNil());
  SendFrames(bad, {wire::EncodeInt(3), wire::EncodeInt(6), "\x93"});   // store, 1 broken frame
  r = Recv(bad);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2], wire::EncodeHandleAndOk("", false));
  SendFrames(bad, {wire::EncodeInt(4), wire::EncodeInt(7), "x", "y", "z", "w"});  // retrieve garbage
  r = Recv(bad);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2], wire::EncodeHandleAndOk("", false));
  SendFrames(bad, {wire::EncodeInt(5), wire::EncodeInt(9)});            // query: missing request id
  r = Recv(bad);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2], wire::EncodeInt(0));
  // The other client is served normally throughout.
  SendFrames(good, {wire::EncodeInt(0), wire::EncodeInt(22), wire::EncodeNil()});  // ping(None)
  r = Recv(good);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2], wire::EncodeBool(true));
}

// Regression: a message with an empty op frame that no open KV-event stream took got no
// reply at all (lmcache's server drops it too), leaving a client waiting.
TEST_F(ZmqServerTest, EmptyOpFrameIsAnsweredWithAClearError) {
  auto c = Client();
  auto error_of = [&](const std::vector<std::string>& frames) {
    SendFrames(c, frames);
    auto r = Recv(c);
    EXPECT_EQ(r.size(), 3u);
    if (r.size() != 3u) return std::string();
    EXPECT_EQ(r[0], frames[0]) << "the uid is echoed";
    EXPECT_EQ(r[1], "") << "the op frame is echoed (empty): not the op of any request";
    auto oh = msgpack::unpack(r[2].data(), r[2].size());
    return oh.get().as<std::string>();
  };
  EXPECT_NE(error_of({wire::EncodeInt(1), ""}).find("empty op frame"), std::string::npos);
  EXPECT_NE(error_of({wire::EncodeInt(2), "", "bogus"}).find("empty op frame"), std::string::npos);
  EXPECT_NE(error_of({wire::EncodeInt(3), "", "ack", "extra"}).find("empty op frame"), std::string::npos);
  EXPECT_NE(error_of({wire::EncodeInt(4), "", "ack"}).find("no KV-event stream is open"),
            std::string::npos);
  EXPECT_NE(error_of({wire::EncodeInt(5), "", "cancel"}).find("no KV-event stream is open"),
            std::string::npos);
  // The connection keeps working.
  SendFrames(c, {wire::EncodeInt(6), wire::EncodeInt(21)});
  auto r = Recv(c);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[2], wire::EncodeInt(256));
}

TEST_F(ZmqServerTest, ManyOutstandingRequestsAreAllAnsweredByUid) {
  auto c = Client();
  const int n = 500;
  for (int i = 0; i < n; ++i) {
    // Alternate inline (ping) and pooled (end_session) ops so replies interleave.
    if (i % 2) {
      SendFrames(c, {wire::EncodeInt(i), wire::EncodeInt(22), wire::EncodeInt(1)});
    } else {
      SendFrames(c, {wire::EncodeInt(i), wire::EncodeInt(13), wire::EncodeStr(std::string("r").append(std::to_string(i)))});
    }
  }
  std::vector<bool> seen(n, false);
  for (int i = 0; i < n; ++i) {
    auto r = Recv(c);
    ASSERT_EQ(r.size(), 3u);
    auto h = msgpack::unpack(r[0].data(), r[0].size());
    int uid = h.get().as<int>();
    ASSERT_GE(uid, 0);
    ASSERT_LT(uid, n);
    EXPECT_FALSE(seen[uid]);
    seen[uid] = true;
  }
}

// Phases of one op in the metrics: {phase name: (count, sum seconds)}.
std::map<std::string, std::pair<uint64_t, double>> PhasesOf(const RequestMetrics& m,
                                                           const std::string& op) {
  std::map<std::string, std::pair<uint64_t, double>> out;
  for (const auto& o : m.Snapshot()) {
    if (o.name != op) continue;
    for (const auto& ph : o.phases) {
      uint64_t n = 0;
      for (uint64_t b : ph.buckets) n += b;
      out[ph.name] = {n, ph.sum_seconds};
    }
  }
  return out;
}

double DurationSumOf(const RequestMetrics& m, const std::string& op) {
  for (const auto& o : m.Snapshot()) {
    if (o.name == op) return o.latency_sum_seconds;
  }
  return -1;
}

TEST_F(ZmqServerTest, QueueDecodeAndReplyPhasesAreRecordedPerRequest) {
  auto c = Client();
  // A retrieve goes to its connection's lane: it waits for a lane thread (queue), is
  // decoded (here: refused by the decoder) and its reply is handed to the socket (reply).
  for (int i = 0; i < 3; ++i) {
    SendFrames(c, {wire::EncodeInt(40 + i), wire::EncodeInt(7), "x", "y", "z", "w"});
    ASSERT_EQ(Recv(c).size(), 3u);
  }
  // An inline op (get_chunk_size) runs on the loop's thread: no queue phase.
  SendFrames(c, {wire::EncodeInt(50), wire::EncodeInt(21)});
  ASSERT_EQ(Recv(c).size(), 3u);
  // The reply phase is recorded just after the send: wait for it.
  for (int i = 0; i < 200 && (PhasesOf(metrics_, "retrieve")["reply"].first < 3 ||
                              PhasesOf(metrics_, "get_chunk_size")["reply"].first < 1);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto retrieve = PhasesOf(metrics_, "retrieve");
  EXPECT_EQ(retrieve["queue"].first, 3u);
  EXPECT_EQ(retrieve["decode"].first, 3u);
  EXPECT_EQ(retrieve["reply"].first, 3u);
  EXPECT_GT(retrieve["queue"].second, 0.0);
  EXPECT_GT(retrieve["reply"].second, 0.0);
  EXPECT_EQ(retrieve.count("copy"), 0u);  // refused before any copy
  // queue and decode fall inside the request's duration.
  EXPECT_LE(retrieve["queue"].second + retrieve["decode"].second,
            DurationSumOf(metrics_, "retrieve") + 1e-9);
  auto inline_op = PhasesOf(metrics_, "get_chunk_size");
  EXPECT_EQ(inline_op.count("queue"), 0u);
  EXPECT_EQ(inline_op["reply"].first, 1u);
}

TEST_F(ZmqServerTest, ALongLookupRunsInlineWhenItIsTheOnlyMessageWaiting) {
  auto c = Client();
  // Payloads are not valid keys: each lookup is refused by the decoder, after the dispatch
  // decision this test is about. The op is 8 (LOOKUP).
  const std::string short_payload(8 << 10, 'x');
  const std::string long_payload(ZmqServer::kInlinePayloadBytes * 4, 'x');
  const std::string too_long(ZmqServer::kInlineWhenAlonePayloadBytes + 1, 'x');
  for (const std::string* p : {&short_payload, &long_payload, &too_long}) {
    SendFrames(c, {wire::EncodeInt(60), wire::EncodeInt(8), *p});
    ASSERT_EQ(Recv(c).size(), 3u);
  }
  for (int i = 0; i < 200 && PhasesOf(metrics_, "lookup")["reply"].first < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto lookup = PhasesOf(metrics_, "lookup");
  EXPECT_EQ(lookup["reply"].first, 3u);
  // Only the lookup over kInlineWhenAlonePayloadBytes waited for a pool thread.
  EXPECT_EQ(lookup["queue"].first, 1u);
}

}  // namespace
}  // namespace kvd::server
