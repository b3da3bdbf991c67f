// UcxNode / UcxPeer with real UCX: a serving node on its own thread (it owns its node, as the
// contract requires) and a reading node on the test's thread, over loopback. "tcp" is the
// transport every machine has; "" lets UCX choose (shared memory on one host). One test kills
// a reader process (this binary, re-run as UcxReaderChild) in the middle of its reads; others
// speak raw UCX to the serving node (RawPeer) to send it what UcxPeer never would.
#include "p2p/ucx_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <ucp/api/ucp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <tuple>

#include "p2p/ucx_messages.h"

namespace kvd::p2p {
namespace {

using namespace std::chrono_literals;

uint8_t PatternByte(size_t i) { return static_cast<uint8_t>((i * 131 + (i >> 12) * 7 + 1) & 0xff); }

Deadline In(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

// What `serve` was called with (the name copied: ServeAsk's is valid only during the call).
struct Served {
  uint64_t object;
  std::string name;
  uint64_t offset;
  uint64_t length;
  bool operator<(const Served& o) const {
    return std::tie(object, name, offset, length) < std::tie(o.object, o.name, o.offset, o.length);
  }
  bool operator==(const Served&) const = default;
};

// A node that listens and serves `objects` objects of `object_bytes` each, cut from one
// registered buffer filled with PatternByte, progressing on its own thread until destroyed.
// Its shared secret is `secret`.
class ServingNode {
 public:
  ServingNode(std::string tls, size_t objects, size_t object_bytes, std::string secret = "")
      : object_bytes_(object_bytes), memory_(objects * object_bytes) {
    for (size_t i = 0; i < memory_.size(); ++i) memory_[i] = PatternByte(i);
    std::promise<Status> started;
    auto ready = started.get_future();
    thread_ = std::thread([this, tls, secret, &started] { Run(tls, secret, started); });
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
  uint64_t refused() const { return refused_.load(); }  // the node's refused_asks()
  // Every ask `serve` was called with, sorted.
  std::vector<Served> served() const {
    std::lock_guard<std::mutex> lock(served_mu_);
    std::vector<Served> out = served_;
    std::sort(out.begin(), out.end());
    return out;
  }
  long holds() const { return holds_.load(); }  // answers whose bytes UCX may still read
  void set_wrong_length(bool on) { wrong_length_.store(on); }
  void set_answer_unregistered(bool on) { unregistered_answers_.store(on); }
  long max_holds() const { return max_holds_.load(); }
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
  void Run(const std::string& tls, const std::string& secret, std::promise<Status>& started) {
    auto serve = [this](uint64_t, const ServeAsk& ask) -> Result<ServedBytes> {
      const uint64_t object = ask.object, offset = ask.offset, length = ask.length;
      {
        std::lock_guard<std::mutex> lock(served_mu_);
        served_.push_back({object, std::string(ask.name), offset, length});
      }
      ++serves_;
      if (object >= memory_.size() / object_bytes_) return Status::NotFound("no such object");
      if (offset > object_bytes_ || length > object_bytes_ - offset) {
        return Status::InvalidArgument("outside the object");
      }
      long now = ++holds_;
      for (long seen = max_holds_.load(); now > seen && !max_holds_.compare_exchange_weak(seen, now);) {
      }
      auto hold = std::shared_ptr<const void>(nullptr, [this](const void*) { --holds_; });
      uint64_t answered = wrong_length_.load() ? length - 1 : length;
      if (unregistered_answers_.load()) {
        unregistered_.assign(length, 0x11);
        return ServedBytes{unregistered_.data(), answered, hold};
      }
      return ServedBytes{memory_.data() + object * object_bytes_ + offset, answered, hold};
    };
    auto node = UcxNode::Create(
        {.listen_host = "127.0.0.1", .tls = tls, .serve = serve, .secret = secret, .answer_timeout_s = 1});
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
      refused_.store((*node)->refused_asks());
    }
    region->reset();
    node->reset();
  }

  size_t object_bytes_;
  std::vector<uint8_t> memory_;
  std::vector<uint8_t> unregistered_;  // not registered with UCX
  int port_ = 0;
  Status status_;
  std::atomic<bool> stop_{false}, pause_{false}, paused_{false}, wrong_length_{false},
      unregistered_answers_{false};
  std::atomic<size_t> accepted_{0}, serves_{0};
  std::atomic<uint64_t> refused_{0};
  mutable std::mutex served_mu_;
  std::vector<Served> served_;
  std::atomic<long> holds_{0}, max_holds_{0};
  std::thread thread_;
};

// The reading side: a node that does not listen, with `bytes` of registered destination (0xEE
// until read into), whose shared secret is `secret`.
struct Reader {
  explicit Reader(const std::string& tls, size_t bytes, const std::string& secret = "") : local(bytes, 0xEE) {
    auto n = UcxNode::Create({.listen_host = "", .tls = tls, .serve = nullptr, .secret = secret});
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

TEST_P(UcxTransportTest, AnAnswerFromUnregisteredMemoryIsRefusedByTheServingNode) {
  ServingNode server(GetParam(), 2, kObject);
  ASSERT_TRUE(server.status().ok());
  server.set_answer_unregistered(true);
  Reader reader(GetParam(), kObject);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ReadItem items[] = {{0, 0, 4096, reader.local.data()}};
  ReadAnswer answer = reader.peer->Read(items, In(20s));
  EXPECT_EQ(answer.completed_prefix, 0u);
  EXPECT_FALSE(answer.first_error.ok());
  EXPECT_EQ(reader.local[0], 0xEE);
  EXPECT_FALSE(reader.peer->broken());  // an answer, not a transport failure
}

TEST_P(UcxTransportTest, ServeSeesExactlyTheNameEachItemAsked) {
  ServingNode server(GetParam(), 4, kObject);
  ASSERT_TRUE(server.status().ok()) << server.status().ToString();
  constexpr size_t kItem = 4096;
  Reader reader(GetParam(), 8 * kItem);
  ASSERT_TRUE(reader.status.ok()) << reader.status.ToString();
  ASSERT_TRUE(reader.Connect(server.port()).ok());

  std::string longest(UcxPeer::kMaxNameBytes, ' ');
  for (size_t i = 0; i < longest.size(); ++i) longest[i] = static_cast<char>('a' + i % 26);
  longest.back() = '!';
  struct Want { uint64_t object, offset; std::string name; } want[] = {
      {0, 0, "vllm@/models/m3@8@0@00c0ffee@bfloat16"},
      {1, 100, ""},
      {2, 4096, longest},
      {3, 7, std::string("a\0b\xff", 4)},  // a name is bytes, not a C string
      {0, 8192, "vllm@/models/m3@8@1@00c0ffee@bfloat16"},
  };
  std::vector<ReadItem> items;
  std::vector<Served> expected;
  for (size_t i = 0; i < std::size(want); ++i) {
    items.push_back({want[i].object, want[i].offset, kItem, reader.local.data() + i * kItem, want[i].name});
    expected.push_back({want[i].object, want[i].name, want[i].offset, kItem});
  }
  std::sort(expected.begin(), expected.end());
  ReadAnswer answer = reader.peer->Read(items, In(20s));
  ASSERT_TRUE(answer.first_error.ok()) << answer.first_error.ToString();
  EXPECT_EQ(answer.completed_prefix, items.size());
  std::vector<Served> seen = server.served();
  ASSERT_EQ(seen.size(), expected.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].object, expected[i].object) << i;
    EXPECT_EQ(seen[i].offset, expected[i].offset) << i;
    EXPECT_EQ(seen[i].name.size(), expected[i].name.size()) << i;
    EXPECT_TRUE(seen[i].name == expected[i].name) << "item of object " << expected[i].object;
  }
  for (size_t i = 0; i < std::size(want); ++i) {
    EXPECT_EQ(reader.local[i * kItem + 5], PatternByte(want[i].object * kObject + want[i].offset + 5)) << i;
  }

  // One byte over the bound refuses the whole batch (its good first item included): nothing is
  // asked, nothing written.
  uint8_t* spare = reader.local.data() + 6 * kItem;
  ReadItem too_long[] = {{0, 0, kItem, spare, "fine"},
                         {1, 0, kItem, spare + kItem, std::string(UcxPeer::kMaxNameBytes + 1, 'x')}};
  ReadAnswer refused = reader.peer->Read(too_long, In(5s));
  EXPECT_EQ(refused.first_error.code(), StatusCode::kInvalidArgument) << refused.first_error.ToString();
  EXPECT_EQ(refused.completed_prefix, 0u);
  for (size_t b = 0; b < 2 * kItem; ++b) ASSERT_EQ(spare[b], 0xEE) << b;
  // The next read on the same endpoint is served after anything asked before it: had the
  // refused batch sent an ask, serve would have seen it by now.
  ReadItem after[] = {{1, 0, kItem, spare, "after"}};
  ASSERT_TRUE(reader.peer->Read(after, In(20s)).first_error.ok());
  EXPECT_EQ(server.serves(), std::size(want) + 1);
}

TEST_P(UcxTransportTest, AReaderWithAnotherSecretIsRefusedAndServeNeverCalled) {
  ServingNode server(GetParam(), 2, kObject, "the fleet's secret");
  ASSERT_TRUE(server.status().ok()) << server.status().ToString();
  constexpr size_t kItem = 65536;  // two items; whatever the protocol, nothing may land
  {
    Reader wrong(GetParam(), 2 * kItem, "not the fleet's secret");
    ASSERT_TRUE(wrong.status.ok());
    ASSERT_TRUE(wrong.Connect(server.port()).ok());
    ReadItem items[] = {{0, 0, kItem, wrong.local.data(), "a"}, {1, 0, kItem, wrong.local.data() + kItem, "b"}};
    ReadAnswer answer = wrong.peer->Read(items, In(20s));
    EXPECT_EQ(answer.first_error.code(), StatusCode::kFailedPrecondition) << answer.first_error.ToString();
    EXPECT_EQ(answer.completed_prefix, 0u);
    for (size_t b = 0; b < wrong.local.size(); ++b) ASSERT_EQ(wrong.local[b], 0xEE) << b;
    EXPECT_FALSE(wrong.peer->broken());  // an answer, not a transport failure
    EXPECT_TRUE(server.WaitFor([&] { return server.refused() == 2; })) << server.refused();
  }
  {
    Reader none(GetParam(), kItem);  // no secret is a wrong one too
    ASSERT_TRUE(none.status.ok());
    ASSERT_TRUE(none.Connect(server.port()).ok());
    ReadItem items[] = {{0, 0, kItem, none.local.data(), "a"}};
    ReadAnswer answer = none.peer->Read(items, In(20s));
    EXPECT_EQ(answer.first_error.code(), StatusCode::kFailedPrecondition) << answer.first_error.ToString();
    EXPECT_EQ(answer.completed_prefix, 0u);
    for (size_t b = 0; b < none.local.size(); ++b) ASSERT_EQ(none.local[b], 0xEE) << b;
    EXPECT_TRUE(server.WaitFor([&] { return server.refused() == 3; })) << server.refused();
  }
  EXPECT_EQ(server.serves(), 0u);

  // The same serving node reads fine for a reader that knows the secret.
  Reader right(GetParam(), 2 * kItem, "the fleet's secret");
  ASSERT_TRUE(right.status.ok());
  ASSERT_TRUE(right.Connect(server.port()).ok());
  ReadItem items[] = {{0, 0, kItem, right.local.data(), "a"}, {1, 0, kItem, right.local.data() + kItem, "b"}};
  ReadAnswer answer = right.peer->Read(items, In(20s));
  ASSERT_TRUE(answer.first_error.ok()) << answer.first_error.ToString();
  EXPECT_EQ(answer.completed_prefix, 2u);
  EXPECT_EQ(right.local[kItem + 9], PatternByte(kObject + 9));
  EXPECT_EQ(server.serves(), 2u);
  EXPECT_EQ(server.refused(), 3u);
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

// An ask as UcxPeer sends it, with the token of `secret` (its name is sent as its data).
AskHeader AskFor(const std::string& secret, uint64_t index, uint64_t object, uint64_t length,
                 uint64_t name_length) {
  AskHeader h{.request = 1, .index = index, .object = object, .offset = 0, .length = length,
              .name_length = name_length};
  auto token = AskToken(secret);
  std::memcpy(h.token, token.data(), sizeof(h.token));
  return h;
}

// A peer that speaks raw UCX, not through UcxPeer: sends what it likes, and keeps (never takes)
// the answers that come by rendezvous, so that the serving node's sends stay in flight.
class RawPeer {
 public:
  explicit RawPeer(int port) {
    ucp_config_t* config = nullptr;
    EXPECT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
    ucp_config_modify(config, "TLS", "tcp");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    EXPECT_EQ(ucp_init(&params, config, &context_), UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    EXPECT_EQ(ucp_worker_create(context_, &wp, &worker_), UCS_OK);
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    h.id = kAnswerId;
    h.arg = this;
    h.cb = [](void* arg, const void* header, size_t header_length, void* data, size_t,
              const ucp_am_recv_param_t* p) {
      auto* self = static_cast<RawPeer*>(arg);
      ++self->answers;
      if (header_length == sizeof(AnswerHeader)) {
        AnswerHeader a;
        std::memcpy(&a, header, sizeof(a));
        self->last_status = a.status;
      }
      if (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        self->kept_.push_back(data);
        return UCS_INPROGRESS;  // kept, never received
      }
      return UCS_OK;
    };
    EXPECT_EQ(ucp_worker_set_am_recv_handler(worker_, &h), UCS_OK);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = sizeof(addr);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) { static_cast<RawPeer*>(arg)->closed = true; };
    ep.err_handler.arg = this;
    EXPECT_EQ(ucp_ep_create(worker_, &ep, &ep_), UCS_OK);
  }
  ~RawPeer() {
    for (void* d : kept_) ucp_am_data_release(worker_, d);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(ep_, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
      ucp_request_free(r);
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  // Sends one active message (with UCP_AM_SEND_FLAG_* `flags` besides REPLY) and waits until
  // it has left.
  void Send(unsigned id, const void* header, size_t header_length, const void* data = nullptr,
            size_t length = 0, uint32_t flags = 0) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | flags;
    void* r = ucp_am_send_nbx(ep_, id, header, header_length, data, length, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) return;
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    ucp_request_free(r);
  }
  void Progress(std::chrono::milliseconds for_how_long) {
    auto until = std::chrono::steady_clock::now() + for_how_long;
    while (std::chrono::steady_clock::now() < until) ucp_worker_progress(worker_);
  }
  // Progresses until `n` answers came (up to 5 s).
  bool WaitAnswers(size_t n) {
    for (int i = 0; i < 50 && answers < n; ++i) Progress(100ms);
    return answers >= n;
  }
  size_t answers = 0;
  uint64_t last_status = ~uint64_t{0};  // of the last answer
  bool closed = false;

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  std::vector<void*> kept_;
};

// Junk and a flood from one peer cost another peer nothing: malformed messages are dropped,
// the flood is cut at UcxNode::kMaxUnanswered, the flooder loses its connection when it does
// not take its answers, and what its answers held is released.
TEST(UcxTransportTcpTest, AHostilePeerCostsAnotherPeerNothing) {
  ServingNode server("tcp", 4, kObject);
  ASSERT_TRUE(server.status().ok());
  RawPeer hostile(server.port());
  AskHeader ask = AskFor("", 0, 0, kObject, 0);  // the serving node's secret: served
  AskHeader bad_magic = ask;
  bad_magic.magic = 42;
  AnswerHeader answer{.request = 1, .index = 0, .status = 0, .length = 8};
  uint8_t junk[100] = {};
  hostile.Send(kAskId, junk, 7);                         // a header of another size
  hostile.Send(kAskId, &bad_magic, sizeof(bad_magic));   // another magic
  hostile.Send(kAskId, &ask, sizeof(ask), junk, sizeof(junk));  // data, but name_length 0
  hostile.Send(kAnswerId, &answer, sizeof(answer), junk, 8);    // an answer nobody asked for
  hostile.Send(0x6b09, junk, 16);                        // an id nobody handles
  hostile.Progress(200ms);
  EXPECT_EQ(server.serves(), 0u) << "a malformed ask reached serve";
  EXPECT_EQ(hostile.answers, 0u);

  // The flood: twice the bound of valid asks for a whole object, answers kept, never taken.
  for (size_t i = 0; i < 2 * UcxNode::kMaxUnanswered; ++i) {
    ask.index = i;
    hostile.Send(kAskId, &ask, sizeof(ask));
  }
  hostile.Progress(300ms);
  EXPECT_LE(server.max_holds(), static_cast<long>(UcxNode::kMaxUnanswered));
  // Exactly the bound was served (the answers are kept, so none completes): the rest dropped.
  EXPECT_EQ(server.serves(), UcxNode::kMaxUnanswered);

  // Meanwhile another peer is served, byte-exact.
  Reader reader("tcp", 2 * kObject);
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ReadItem items[] = {{2, 0, kObject, reader.local.data()}, {3, 0, kObject, reader.local.data() + kObject}};
  ReadAnswer ok = reader.peer->Read(items, In(20s));
  ASSERT_TRUE(ok.first_error.ok()) << ok.first_error.ToString();
  EXPECT_EQ(ok.completed_prefix, 2u);
  EXPECT_EQ(reader.local[kObject + 9], PatternByte(3 * kObject + 9));

  // The flooder does not take its answers: after the answer timeout (1 s here) it is cut off and
  // the bytes its answers held are released.
  for (int i = 0; i < 50 && !hostile.closed; ++i) hostile.Progress(100ms);
  EXPECT_TRUE(hostile.closed);
  EXPECT_TRUE(server.WaitFor([&] { return server.accepted() == 1 && server.holds() == 0; }))
      << server.accepted() << " endpoints, " << server.holds() << " holds";
}

// An ask whose name_length and data disagree, whose name is over the bound or came by
// rendezvous is dropped unanswered (serve never sees it); one with a wrong token is answered
// FailedPrecondition without serve. The node stays healthy: the same raw peer's well-formed ask
// is served, and so is a UcxPeer after it.
TEST(UcxTransportTcpTest, AnAskWhoseNameAndDataDisagreeIsDropped) {
  ServingNode server("tcp", 2, kObject, "fleet");
  ASSERT_TRUE(server.status().ok());
  RawPeer raw(server.port());
  const std::string name(2 * UcxPeer::kMaxNameBytes, 'n');
  AskHeader longer_data = AskFor("fleet", 0, 1, 64, 10);
  raw.Send(kAskId, &longer_data, sizeof(AskHeader), name.data(), 100);
  AskHeader shorter_data = AskFor("fleet", 1, 1, 64, 100);
  raw.Send(kAskId, &shorter_data, sizeof(AskHeader), name.data(), 10);
  AskHeader no_data = AskFor("fleet", 2, 1, 64, 5);
  raw.Send(kAskId, &no_data, sizeof(AskHeader));
  AskHeader over = AskFor("fleet", 3, 1, 64, UcxPeer::kMaxNameBytes + 1);
  raw.Send(kAskId, &over, sizeof(AskHeader), name.data(), UcxPeer::kMaxNameBytes + 1);
  AskHeader rendezvous = AskFor("fleet", 4, 1, 64, 100);
  raw.Send(kAskId, &rendezvous, sizeof(AskHeader), name.data(), 100, UCP_AM_SEND_FLAG_RNDV);
  raw.Progress(300ms);
  EXPECT_EQ(server.serves(), 0u) << "a malformed ask reached serve";
  EXPECT_EQ(raw.answers, 0u) << "a malformed ask was answered";
  EXPECT_EQ(server.refused(), 0u);
  EXPECT_FALSE(raw.closed);

  AskHeader no_token = AskFor("fleet", 5, 1, 64, 4);
  std::memset(no_token.token, 0, sizeof(no_token.token));
  raw.Send(kAskId, &no_token, sizeof(AskHeader), "name", 4);
  ASSERT_TRUE(raw.WaitAnswers(1));
  EXPECT_EQ(raw.last_status, static_cast<uint64_t>(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(server.WaitFor([&] { return server.refused() == 1; }));
  EXPECT_EQ(server.serves(), 0u);

  // The same peer's well-formed ask (same lengths as the dropped ones) is served: the others
  // were dropped for their lengths alone.
  AskHeader good = AskFor("fleet", 6, 1, 64, 100);
  raw.Send(kAskId, &good, sizeof(AskHeader), name.data(), 100);
  ASSERT_TRUE(raw.WaitAnswers(2));
  EXPECT_EQ(raw.last_status, static_cast<uint64_t>(StatusCode::kOk));
  ASSERT_EQ(server.serves(), 1u);
  EXPECT_EQ(server.served()[0], (Served{1, name.substr(0, 100), 0, 64}));

  Reader reader("tcp", kObject, "fleet");
  ASSERT_TRUE(reader.status.ok());
  ASSERT_TRUE(reader.Connect(server.port()).ok());
  ReadItem items[] = {{1, 0, kObject, reader.local.data(), "object one"}};
  ReadAnswer ok = reader.peer->Read(items, In(20s));
  ASSERT_TRUE(ok.first_error.ok()) << ok.first_error.ToString();
  EXPECT_EQ(reader.local[kObject - 3], PatternByte(2 * kObject - 3));
  EXPECT_EQ(server.serves(), 2u);
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

TEST(UcxTransportTest, ASecretOverItsBoundIsRefusedByCreate) {
  auto too_long = UcxNode::Create({.listen_host = "", .tls = "tcp", .serve = nullptr,
                                   .secret = std::string(UcxNode::kMaxSecretBytes + 1, 's')});
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument) << too_long.status().ToString();
  auto longest = UcxNode::Create({.listen_host = "", .tls = "tcp", .serve = nullptr,
                                  .secret = std::string(UcxNode::kMaxSecretBytes, 's')});
  EXPECT_TRUE(longest.ok()) << longest.status().ToString();
}

}  // namespace
}  // namespace kvd::p2p
