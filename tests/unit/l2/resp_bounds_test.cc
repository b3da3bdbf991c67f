// The RESP reader against a hostile server (issue 27, finding 6, Redis part): a fake server
// on a loopback socket answers with sizes it controls — a value far longer than the object
// asked for, a non-value reply of 128 MiB, an array of two billion elements — and streams
// bytes behind them until the client hangs up. The reader must refuse each before buffering
// it: the call fails fast (a load is a counted miss) and the process's resident memory stays
// far below what the reply announced. Resident memory is sampled every millisecond.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "l2/resp_connection.h"
#include "l2/resp_tier.h"
#include "redis_process.h"
#include "tier_test_util.h"

namespace kvd::l2 {
namespace {

using namespace testing;

constexpr uint64_t kHuge = 128ull << 20;  // what the hostile replies announce
constexpr uint64_t kRssBound = 32ull << 20;

uint64_t RssBytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Highest resident memory above the level at construction, while it lives.
class RssPeak {
 public:
  RssPeak() : base_(RssBytes()), thread_([this] {
      while (!stop_.load()) {
        const uint64_t r = RssBytes();
        if (r > peak_.load()) peak_.store(r);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }) {}
  ~RssPeak() { Stop(); }
  uint64_t Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    const uint64_t p = std::max(peak_.load(), RssBytes());
    return p > base_ ? p - base_ : 0;
  }

 private:
  const uint64_t base_;
  std::atomic<uint64_t> peak_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One-connection-at-a-time fake server: +PONG to PING; to any other command, `head`
// followed by `filler` repeated until `stream_bytes` were sent or the client hung up.
class HostileServer {
 public:
  HostileServer(std::string head, std::string filler, uint64_t stream_bytes)
      : head_(std::move(head)), filler_(std::move(filler)), stream_bytes_(stream_bytes) {
    fd_ = kvd::l2::testing::ListenLoopback(8, &port_);
    EXPECT_GE(fd_, 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~HostileServer() {
    stop_.store(true);
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  RespEndpoint endpoint() const { return {"127.0.0.1", port_}; }
  uint64_t sent() const { return sent_.load(); }

 private:
  void Serve() {
    while (!stop_.load()) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      char buf[4096];
      std::string in;
      while (!stop_.load()) {
        ssize_t n = ::read(c, buf, sizeof(buf));
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
        if (in.find("PING") != std::string::npos) {
          in.clear();
          if (!Send(c, "+PONG\r\n")) break;
          continue;
        }
        if (in.find("\r\n", in.find('$') == std::string::npos ? 0 : in.rfind('$')) ==
            std::string::npos) {
          continue;  // the command's last argument has not arrived
        }
        in.clear();
        if (!Send(c, head_)) break;
        uint64_t streamed = 0;
        while (streamed < stream_bytes_ && !stop_.load() && Send(c, filler_)) streamed += filler_.size();
        break;
      }
      ::close(c);
    }
  }
  bool Send(int c, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
      sent_ += static_cast<uint64_t>(n);
    }
    return true;
  }

  const std::string head_, filler_;
  const uint64_t stream_bytes_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread thread_;
};

RespConnectOptions FastTimeouts() {
  RespConnectOptions o;
  o.connect_timeout_s = 2;
  o.request_timeout_s = 2;
  return o;
}

// A GET whose value is announced as 128 MiB, for an object of 4 KiB: a counted miss
// (Internal) at once, without the 128 MiB (and a copy) held in memory.
TEST(RespBoundsTest, Finding6ValueLongerThanTheObjectIsNotBuffered) {
  HostileServer server("$" + std::to_string(kHuge) + "\r\n", std::string(1 << 20, 'v'), kHuge + 2);
  RespTierOptions o;
  o.seeds = {server.endpoint()};
  o.num_workers = 1;
  o.connect = FastTimeouts();
  auto t = RespTier::Create(o);
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> out;
  RssPeak rss;
  const auto t0 = std::chrono::steady_clock::now();
  ItemResult r = LoadOne(**t, Key(1), &out, 4096);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t grew = rss.Stop();
  EXPECT_EQ(r.status.code(), StatusCode::kInternal) << r.status.ToString();
  EXPECT_LT(grew, kRssBound) << "resident memory grew by " << grew << " bytes";
  EXPECT_LT(took, 2.0);
  (*t)->Close();
}

// The same through the connection: a value longer than the sink is refused (no reply object
// holding it), and the connection is not used again.
TEST(RespBoundsTest, Finding6ConnectionRefusesAValueLongerThanTheSink) {
  HostileServer server("$" + std::to_string(kHuge) + "\r\n", std::string(1 << 20, 'v'), kHuge + 2);
  auto c = RespConnection::Connect(server.endpoint(), FastTimeouts());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> dst(4096);
  BulkSink sink{dst.data(), dst.size()};
  RssPeak rss;
  auto r = (*c)->Command({"GET", "k"}, &sink);
  const uint64_t grew = rss.Stop();
  EXPECT_FALSE(sink.filled);
  EXPECT_TRUE(!r.ok() || *r == nullptr) << "the value came back as a reply object";
  EXPECT_LT(grew, kRssBound) << "resident memory grew by " << grew << " bytes";
}

// Replies to other commands (no sink: hiredis's parser) are bounded too: a 128 MiB string, an
// error line of 128 MiB, an array announcing two billion elements followed by millions of
// small ones. Each fails the call and breaks the connection before its bytes are held.
TEST(RespBoundsTest, Finding6RepliesToOtherCommandsAreBoundedBeforeAllocation) {
  struct Case {
    const char* name;
    std::string head, filler;
    uint64_t stream = kHuge;
  };
  const Case cases[] = {
      {"bulk", "$" + std::to_string(kHuge) + "\r\n", std::string(1 << 20, 'v')},
      {"error", "-ERR ", std::string(1 << 20, 'e')},
      {"array", "*2147483647\r\n", [] {
         std::string s;
         for (int i = 0; i < 65536; ++i) s += ":1\r\n";
         return s;
       }(), 16ull << 20},
      {"nested", "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n", "*1\r\n"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    HostileServer server(k.head, k.filler, k.stream);
    auto c = RespConnection::Connect(server.endpoint(), FastTimeouts());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    RssPeak rss;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*c)->Command({"EXISTS", "k"});
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t grew = rss.Stop();
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE((*c)->broken());
    EXPECT_LT(grew, kRssBound) << "resident memory grew by " << grew << " bytes";
    EXPECT_LT(took, 2.0);
    EXPECT_LT(server.sent(), k.stream / 2) << "the reply was read to its end";
  }
}

}  // namespace
}  // namespace kvd::l2
