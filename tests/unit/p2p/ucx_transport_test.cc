// UcxNode / UcxPeer with real UCX: a serving node on its own thread (it owns its node, as the
// contract requires) and a reading node on the test's thread, over loopback. "tcp" is the
// transport every machine has; "" lets UCX choose (shared memory on one host). One test kills
// a reader process (this binary, re-run as UcxReaderChild) in the middle of its reads.
#include "p2p/ucx_transport.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

namespace kvd::p2p {
namespace {

using namespace std::chrono_literals;

uint8_t PatternByte(size_t i) { return static_cast<uint8_t>((i * 131 + (i >> 12) * 7 + 1) & 0xff); }

Deadline In(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

// A node that listens and serves `objects` objects of `object_bytes` each, cut from one
// registered buffer filled with PatternByte, progressing on its own thread until destroyed.
class ServingNode {
 public:
  ServingNode(std::string tls, size_t objects, size_t object_bytes)
      : object_bytes_(object_bytes), memory_(objects * object_bytes) {
    for (size_t i = 0; i < memory_.size(); ++i) memory_[i] = PatternByte(i);
    std::promise<Status> started;
    auto ready = started.get_future();
    thread_ = std::thread([this, tls, &started] { Run(tls, started); });
    status_ = ready.get();
  }
  ~ServingNode() {
    stop_.store(true);
    thread_.join();
  }
  const Status& status() const { return status_; }
  int port() const { return port_; }
  // Stops progressing (a hung peer) and returns once the node's thread has stopped.
  void Pause() {
    pause_.store(true);
    while (!paused_.load()) std::this_thread::sleep_for(1ms);
  }
  void Resume() { pause_.store(false); }
  size_t accepted() const { return accepted_.load(); }
  size_t serves() const { return serves_.load(); }
  long holds() const { return holds_.load(); }  // answers whose bytes UCX may still read
  void set_wrong_length(bool on) { wrong_length_.store(on); }
  // Waits (up to 5 s) until `pred` holds.
  template <typename P>
  bool WaitFor(P pred) const {
    for (int i = 0; i < 5000; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(1ms);
    }
    return pred();
  }

 private:
  void Run(const std::string& tls, std::promise<Status>& started) {
    auto serve = [this](uint64_t, uint64_t object, uint64_t offset,
                        uint64_t length) -> Result<ServedBytes> {
      ++serves_;
      if (object >= memory_.size() / object_bytes_) return Status::NotFound("no such object");
      if (offset > object_bytes_ || length > object_bytes_ - offset) {
        return Status::InvalidArgument("outside the object");
      }
      ++holds_;
      auto hold = std::shared_ptr<const void>(nullptr, [this](const void*) { --holds_; });
      uint64_t answered = wrong_length_.load() ? length - 1 : length;
      return ServedBytes{memory_.data() + object * object_bytes_ + offset, answered, hold};
    };
    auto node = UcxNode::Create(
        {.listen_host = "127.0.0.1", .tls = tls, .serve = serve, .answer_timeout_s = 1});
    if (!node.ok()) return started.set_value(node.status());
    auto region = (*node)->Register(memory_.data(), memory_.size());
    if (!region.ok()) return started.set_value(region.status());
    port_ = (*node)->listen_port();
    started.set_value(Status::Ok());
    while (!stop_.load()) {
      if (pause_.load()) {
        paused_.store(true);
        std::this_thread::sleep_for(1ms);
        continue;
      }
      paused_.store(false);
      (*node)->ProgressFor(5ms);
      accepted_.store((*node)->accepted_peers());
    }
    region->reset();
    node->reset();
  }

  size_t object_bytes_;
  std::vector<uint8_t> memory_;
  int port_ = 0;
  Status status_;
  std::atomic<bool> stop_{false}, pause_{false}, paused_{false}, wrong_length_{false};
  std::atomic<size_t> accepted_{0}, serves_{0};
  std::atomic<long> holds_{0};
  std::thread thread_;
};

// The reading side: a node that does not listen, with `bytes` of registered destination.
struct Reader {
  explicit Reader(const std::string& tls, size_t bytes) : local(bytes, 0xEE) {
    auto n = UcxNode::Create({.listen_host = "", .tls = tls, .serve = nullptr});
    status = n.status();
    if (!n.ok()) return;
    node = std::move(*n);
    auto r = node->Register(local.data(), local.size());
    status = r.status();
    if (r.ok()) region = std::move(*r);
  }
  ~Reader() {
    peer.reset();
    region.reset();
  }
  Status Connect(int port) {
    auto p = node->Connect("127.0.0.1", port);
    if (!p.ok()) return p.status();
    peer = std::move(*p);
    return Status::Ok();
  }
  std::vector<uint8_t> local;
  Status status;
  std::unique_ptr<UcxNode> node;
  std::unique_ptr<UcxRegion> region;
  std::unique_ptr<UcxPeer> peer;
};

constexpr size_t kObject = 1 << 20;

class UcxTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxTransportTest, ReadsObjectsByteExactLargeAndSmall) {
  ServingNode server(GetParam(), 8, kObject);
  ASSERT_TRUE(server.status().ok()) << server.status().ToString();
  Reader reader(GetParam(), 4 * kObject + 4096);
  ASSERT_TRUE(reader.status.ok()) << reader.status.ToString();
  ASSERT_TRUE(reader.Connect(server.port()).ok());

  // Three whole objects (rendezvous), one object's tail and a 64-byte piece (eager).
  struct Want { uint64_t object, offset, length; } want[] = {
      {0, 0, kObject}, {3, 0, kObject}, {7, 0, kObject}, {5, kObject - 300000, 300000}, {2, 17, 64}};
  std::vector<ReadItem> items;
  size_t at = 0;
  for (const Want& w : want) {
    items.push_back({w.object, w.offset, w.length, reader.local.data() + at});
    at += w.length;
  }
  ReadAnswer answer = reader.peer->Read(items, In(20s));
  ASSERT_TRUE(answer.first_error.ok()) << answer.first_error.ToString();
  EXPECT_EQ(answer.completed_prefix, items.size());
  at = 0;
  for (const Want& w : want) {
    size_t src = w.object * kObject + w.offset;
    for (size_t b = 0; b < w.length; b += 997) {
      ASSERT_EQ(reader.local[at + b], PatternByte(src + b)) << "object " << w.object << " byte " << b;
    }
    ASSERT_EQ(reader.local[at + w.length - 1], PatternByte(src + w.length - 1));
    at += w.length;
  }
  EXPECT_EQ(reader.local[at], 0xEE);  // nothing written past the last item
  EXPECT_FALSE(reader.peer->broken());
  EXPECT_TRUE(server.WaitFor([&] { return server.holds() == 0; })) << server.holds();
}

TEST_P(UcxTransportTest, AnItemTheServerRefusesEndsThePrefixThere) {
  ServingNode server(GetParam(), 4, kObject);
  ASSERT_TRUE(server.status().ok());
  Reader reader(GetParam(), 3 * kObject);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ReadItem items[] = {{1, 0, kObject, reader.local.data()},
                      {9, 0, kObject, reader.local.data() + kObject},   // no such object
                      {2, 0, kObject, reader.local.data() + 2 * kObject}};
  ReadAnswer answer = reader.peer->Read(items, In(20s));
  EXPECT_EQ(answer.completed_prefix, 1u);
  EXPECT_EQ(answer.first_error.code(), StatusCode::kNotFound) << answer.first_error.ToString();
  EXPECT_EQ(reader.local[5], PatternByte(kObject + 5));
  EXPECT_EQ(reader.local[kObject + 5], 0xEE);
  // The peer is fine: a refused item is an answer, not a transport failure.
  EXPECT_FALSE(reader.peer->broken());
  ReadItem outside[] = {{1, kObject - 10, 20, reader.local.data()}};
  EXPECT_EQ(reader.peer->Read(outside, In(20s)).first_error.code(), StatusCode::kInvalidArgument);
}

TEST_P(UcxTransportTest, ABadBatchIsRefusedWholeAndNothingIsAsked) {
  ServingNode server(GetParam(), 2, kObject);
  ASSERT_TRUE(server.status().ok());
  Reader reader(GetParam(), 1 << 16);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  std::vector<uint8_t> unregistered(4096, 0xEE);
  uint8_t* dst = reader.local.data();
  struct Case {
    const char* what;
    ReadItem bad;
  } cases[] = {
      {"zero length", {0, 0, 0, dst + 4096}},
      {"over the item bound", {0, 0, UcxPeer::kMaxItemBytes + 1, dst + 4096}},
      {"no destination", {0, 0, 16, nullptr}},
      {"unregistered destination", {0, 0, 1024, unregistered.data()}},
      {"destination runs past its region", {0, 0, 1024, dst + reader.local.size() - 512}},
  };
  for (const Case& c : cases) {
    ReadItem items[] = {{0, 0, 4096, dst}, c.bad};  // a good item first: not read either
    ReadAnswer answer = reader.peer->Read(items, In(5s));
    EXPECT_EQ(answer.first_error.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(answer.completed_prefix, 0u) << c.what;
  }
  std::vector<ReadItem> too_many(UcxPeer::kMaxItems + 1, ReadItem{0, 0, 1, dst});
  EXPECT_EQ(reader.peer->Read(too_many, In(5s)).first_error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dst[0], 0xEE);
  EXPECT_EQ(server.serves(), 0u);
  for (uint8_t b : unregistered) ASSERT_EQ(b, 0xEE);
}

TEST_P(UcxTransportTest, AnAnswerOfTheWrongLengthIsNotWritten) {
  ServingNode server(GetParam(), 2, kObject);
  ASSERT_TRUE(server.status().ok());
  server.set_wrong_length(true);  // the serving side answers one byte short: caught there
  Reader reader(GetParam(), kObject);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ReadItem items[] = {{0, 0, kObject, reader.local.data()}};
  ReadAnswer answer = reader.peer->Read(items, In(20s));
  EXPECT_EQ(answer.completed_prefix, 0u);
  EXPECT_FALSE(answer.first_error.ok());
  EXPECT_EQ(reader.local[0], 0xEE);
  EXPECT_EQ(reader.local[kObject - 2], 0xEE);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest, ::testing::Values("tcp", ""),
                         [](const auto& info) { return info.param.empty() ? "UcxChoice" : info.param; });

// A peer that stops progressing is a hung peer: the reads end at the deadline as a miss, and
// when it wakes up, its answers to the closed endpoint fail quietly (it keeps serving).
TEST(UcxTransportTcpTest, AHungPeerEndsReadsAtTheDeadlineAndSurvivesItsLateAnswers) {
  ServingNode server("tcp", 4, kObject);
  ASSERT_TRUE(server.status().ok());
  Reader reader("tcp", 4 * kObject);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ASSERT_TRUE(reader.peer->WaitConnected(In(10s)).ok());

  server.Pause();
  ReadItem items[] = {{0, 0, kObject, reader.local.data()}, {1, 0, kObject, reader.local.data() + kObject}};
  auto start = std::chrono::steady_clock::now();
  ReadAnswer answer = reader.peer->Read(items, In(300ms));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(answer.completed_prefix, 0u);
  EXPECT_EQ(answer.first_error.code(), StatusCode::kUnavailable) << answer.first_error.ToString();
  EXPECT_TRUE(reader.peer->broken());
  EXPECT_EQ(reader.peer->Read(items, In(10s)).first_error.code(), StatusCode::kUnavailable);
  EXPECT_EQ(reader.local[0], 0xEE);
  server.Resume();

  // The woken peer drops the dead endpoint and the bytes it held, and serves a new one.
  EXPECT_TRUE(server.WaitFor([&] { return server.accepted() == 0 && server.holds() == 0; }))
      << server.accepted() << " endpoints, " << server.holds() << " holds";
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ReadAnswer ok = reader.peer->Read(items, In(20s));
  ASSERT_TRUE(ok.first_error.ok()) << ok.first_error.ToString();
  EXPECT_EQ(ok.completed_prefix, 2u);
  EXPECT_EQ(reader.local[kObject + 5], PatternByte(kObject + 5));
}

// The child side of the next test: reads from UCX_READER_CHILD_PORT until killed.
TEST(UcxReaderChild, ReadsUntilKilled) {
  const char* port = std::getenv("UCX_READER_CHILD_PORT");
  if (port == nullptr) GTEST_SKIP() << "run by AReaderKilledMidTransferCostsTheServerNothing";
  Reader reader("tcp", 4 * kObject);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(std::atoi(port)).ok());
  ReadItem items[] = {{0, 0, kObject, reader.local.data()}, {1, 0, kObject, reader.local.data() + kObject},
                      {2, 0, kObject, reader.local.data() + 2 * kObject},
                      {3, 0, kObject, reader.local.data() + 3 * kObject}};
  for (;;) {
    ReadAnswer a = reader.peer->Read(items, In(20s));
    ASSERT_TRUE(a.first_error.ok()) << a.first_error.ToString();
    std::fputc('.', stdout);
    std::fflush(stdout);
  }
}

TEST(UcxTransportTcpTest, AReaderKilledMidTransferCostsTheServerNothing) {
  ServingNode server("tcp", 4, kObject);
  ASSERT_TRUE(server.status().ok());
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  pid_t child = fork();
  if (child == 0) {
    dup2(out[1], STDOUT_FILENO);
    setenv("UCX_READER_CHILD_PORT", std::to_string(server.port()).c_str(), 1);
    execl("/proc/self/exe", "p2p_tests", "--gtest_filter=UcxReaderChild.ReadsUntilKilled",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  // Wait for a few completed reads, then kill the child while it reads.
  char buf[64];
  size_t dots = 0;
  while (dots < 5) {
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    dots += std::count(buf, buf + n, '.');
  }
  kill(child, SIGKILL);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  close(out[0]);
  ASSERT_GE(dots, 5u) << "the child never read";

  EXPECT_TRUE(server.WaitFor([&] { return server.accepted() == 0 && server.holds() == 0; }))
      << server.accepted() << " endpoints, " << server.holds() << " holds";
  Reader reader("tcp", kObject);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ReadItem items[] = {{3, 0, kObject, reader.local.data()}};
  ReadAnswer answer = reader.peer->Read(items, In(20s));
  ASSERT_TRUE(answer.first_error.ok()) << answer.first_error.ToString();
  EXPECT_EQ(reader.local[77], PatternByte(3 * kObject + 77));
}

TEST(UcxTransportTcpTest, NoListenerAnswersUnavailableWithinTheDeadline) {
  int port = 0;
  {
    auto probe = UcxNode::Create({.listen_host = "127.0.0.1", .tls = "tcp", .serve = nullptr});
    ASSERT_TRUE(probe.ok());
    port = (*probe)->listen_port();
  }
  Reader reader("tcp", 4096);
  ASSERT_TRUE(reader.status.ok());
  Status connect = reader.Connect(port);
  if (!connect.ok()) {
    EXPECT_EQ(connect.code(), StatusCode::kUnavailable);
    return;
  }
  auto start = std::chrono::steady_clock::now();
  ReadItem items[] = {{0, 0, 16, reader.local.data()}};
  ReadAnswer answer = reader.peer->Read(items, In(3s));
  EXPECT_EQ(answer.first_error.code(), StatusCode::kUnavailable) << answer.first_error.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
  EXPECT_TRUE(reader.peer->broken());
}

TEST(UcxTransportTcpTest, TheListenerDropsTheEndpointOfAReaderThatLeft) {
  ServingNode server("tcp", 1, 4096);
  ASSERT_TRUE(server.status().ok());
  Reader reader("tcp", 4096);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ASSERT_TRUE(reader.peer->WaitConnected(In(10s)).ok());
  EXPECT_TRUE(server.WaitFor([&] { return server.accepted() == 1; }));
  reader.peer.reset();
  EXPECT_TRUE(server.WaitFor([&] { return server.accepted() == 0; }));
}

TEST(UcxTransportTest, BadOptionsAndAddressesAreRefusedByName) {
  auto node = UcxNode::Create({.listen_host = "", .tls = "tcp", .serve = nullptr});
  ASSERT_TRUE(node.ok());
  EXPECT_EQ((*node)->Connect("127.0.0.1", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*node)->Connect("127.0.0.1", 70000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*node)->Connect("", 5000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*node)->Connect("no-such-host.invalid", 5000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*node)->Register(nullptr, 10).status().code(), StatusCode::kInvalidArgument);
  auto listen_bad = UcxNode::Create({.listen_host = "127.0.0.1", .listen_port = 70000, .tls = "tcp", .serve = nullptr});
  EXPECT_EQ(listen_bad.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::p2p
