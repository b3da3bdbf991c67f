// The ZMTP decoder and encoders: greetings, commands, frames, fragmentation, and every bound
// enforced before anything is buffered.
#include "net/zmtp_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace kvd::net {
namespace {

struct Recorder : ZmtpSink {
  std::vector<std::pair<int, int>> greetings;
  std::vector<std::pair<std::string, std::string>> commands;
  std::vector<std::vector<std::string>> messages;
  Status OnGreeting(uint8_t major, uint8_t minor) override {
    greetings.emplace_back(major, minor);
    return Status::Ok();
  }
  Status OnCommand(std::string_view name, std::string_view data) override {
    commands.emplace_back(std::string(name), std::string(data));
    return Status::Ok();
  }
  Status OnMessage(std::vector<zmq::message_t>& frames) override {
    std::vector<std::string> m;
    for (auto& f : frames) m.emplace_back(static_cast<const char*>(f.data()), f.size());
    messages.push_back(std::move(m));
    return Status::Ok();
  }
};

std::string Frame(std::string_view body, bool more) {
  uint8_t hdr[9];
  const size_t n = EncodeFrameHeader(body.size(), more, hdr);
  return std::string(reinterpret_cast<char*>(hdr), n) + std::string(body);
}

// Feeds `bytes` in pieces of at most `piece` bytes, as reads would deliver them.
Status Feed(ZmtpDecoder& d, Recorder& r, std::string_view bytes, size_t piece = 1 << 20) {
  while (!bytes.empty()) {
    auto span = d.WritableSpan();
    const size_t n = std::min({span.size(), piece, bytes.size()});
    std::memcpy(span.data(), bytes.data(), n);
    bytes.remove_prefix(n);
    if (Status s = d.Commit(n, r); !s.ok()) return s;
  }
  return Status::Ok();
}

ZmtpLimits Limits() {
  ZmtpLimits l;
  l.max_frame_bytes = 100000;
  l.max_message_bytes = 150000;
  l.max_frames = 4;
  l.max_command_bytes = 512;
  return l;
}

TEST(ZmtpCodec, OurGreetingIsAValidZmtp31NullGreeting) {
  const std::string g = EncodeGreeting();
  ASSERT_EQ(g.size(), kGreetingBytes);
  EXPECT_EQ(static_cast<uint8_t>(g[0]), 0xff);
  EXPECT_EQ(g[9], 0x7f);
  EXPECT_EQ(g[10], 3);
  EXPECT_EQ(g[11], 1);
  EXPECT_EQ(g.substr(12, 20), std::string("NULL") + std::string(16, '\0'));
  ZmtpDecoder d(Limits());
  Recorder r;
  ASSERT_TRUE(Feed(d, r, g).ok());
  EXPECT_EQ(r.greetings, (std::vector<std::pair<int, int>>{{3, 1}}));
}

TEST(ZmtpCodec, GreetingsOfOtherPeersAreRefusedByName) {
  std::string v2 = EncodeGreeting();
  v2[10] = 2;
  std::string plain = EncodeGreeting();
  std::memcpy(plain.data() + 12, "PLAIN", 5);
  std::string bad = EncodeGreeting();
  bad[0] = 'G';  // "GET / HTTP/1.1..." to the ZMQ port
  std::string v1 = EncodeGreeting();
  v1[9] = 0x00;
  for (const auto& [g, what] : std::vector<std::pair<std::string, std::string>>{
           {v2, "ZMTP version 2"}, {plain, "'PLAIN'"}, {bad, "signature"}, {v1, "signature"}}) {
    ZmtpDecoder d(Limits());
    Recorder r;
    Status s = Feed(d, r, g);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_TRUE(r.greetings.empty());
  }
}

TEST(ZmtpCodec, ReadyPropertiesRoundTrip) {
  const std::pair<std::string_view, std::string_view> props[] = {{"Socket-Type", "DEALER"},
                                                                 {"Identity", ""}};
  ZmtpDecoder d(Limits());
  Recorder r;
  ASSERT_TRUE(Feed(d, r, EncodeGreeting() + EncodeReady(props)).ok());
  ASSERT_EQ(r.commands.size(), 1u);
  EXPECT_EQ(r.commands[0].first, "READY");
  auto parsed = ParseProperties(r.commands[0].second);
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0], (std::pair<std::string, std::string>{"Socket-Type", "DEALER"}));
  EXPECT_EQ((*parsed)[1], (std::pair<std::string, std::string>{"Identity", ""}));
}

TEST(ZmtpCodec, MalformedPropertiesAreErrors) {
  EXPECT_FALSE(ParseProperties(std::string("\x05Ident", 6)).ok());                 // no length
  EXPECT_FALSE(ParseProperties(std::string("\x01X\x00\x00\x00\x09" "abc", 9)).ok());  // value cut
  EXPECT_FALSE(ParseProperties(std::string("\x00\x00\x00\x00\x00", 5)).ok());      // empty name
  EXPECT_TRUE(ParseProperties("").ok());
}

TEST(ZmtpCodec, MultipartMessagesArriveWholeWhateverTheReadSizes) {
  const std::string big(70000, 'b');  // a long frame (8-byte size)
  const std::string stream = EncodeGreeting() + Frame("uid", true) + Frame("op", true) +
                             Frame(big, false) + Frame("", false) + Frame("x", true) +
                             Frame("y", false);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
    ZmtpDecoder d(Limits());
    Recorder r;
    ASSERT_TRUE(Feed(d, r, stream, piece).ok()) << piece;
    ASSERT_EQ(r.messages.size(), 3u) << piece;
    EXPECT_EQ(r.messages[0], (std::vector<std::string>{"uid", "op", big}));
    EXPECT_EQ(r.messages[1], (std::vector<std::string>{""}));
    EXPECT_EQ(r.messages[2], (std::vector<std::string>{"x", "y"}));
  }
}

TEST(ZmtpCodec, ALargeFrameIsReadInPlace) {
  ZmtpDecoder d(Limits());
  Recorder r;
  const std::string body(90000, 'z');
  ASSERT_TRUE(Feed(d, r, EncodeGreeting() + Frame(body, false).substr(0, 9 + 10)).ok());
  // The rest of the body is asked for as one span: the frame's own memory.
  auto span = d.WritableSpan();
  EXPECT_EQ(span.size(), body.size() - 10);
  EXPECT_GE(d.held_bytes(), body.size());
  std::memset(span.data(), 'z', span.size());
  ASSERT_TRUE(d.Commit(span.size(), r).ok());
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0][0], body);
  EXPECT_EQ(d.held_bytes(), ZmtpDecoder::kBufferBytes);
}

TEST(ZmtpCodec, EveryBoundIsEnforcedBeforeTheBodyIsBuffered) {
  struct Case {
    std::string bytes;
    std::string what;
  };
  uint8_t hdr[9];
  EncodeFrameHeader(100001, false, hdr);  // one byte over max_frame_bytes
  const std::string too_big(reinterpret_cast<char*>(hdr), 9);
  std::string too_long_msg = Frame(std::string(80000, 'a'), true);
  EncodeFrameHeader(80000, false, hdr);
  too_long_msg += std::string(reinterpret_cast<char*>(hdr), 9);  // 160000 > 150000 in all
  std::string five_frames;
  for (int i = 0; i < 5; ++i) five_frames += Frame("f", i < 4);
  std::string big_command = "\x06";  // command, long
  big_command += std::string("\x00\x00\x00\x00\x00\x00\x02\x01", 8);  // 513 bytes
  const std::vector<Case> cases = {
      {too_big, "a frame of 100001 bytes"},
      {too_long_msg, "a message of more than 150000 bytes"},
      {five_frames, "more than 4 frames"},
      {big_command, "a command of 513 bytes"},
      {std::string("\x08\x01x", 3), "reserved bits"},
      {std::string("\x05\x01\x01", 3), "command frame with MORE"},
      {std::string("\x04\x03\x09" "PI", 5), "without a valid name"},
  };
  for (const auto& c : cases) {
    ZmtpDecoder d(Limits());
    Recorder r;
    Status s = Feed(d, r, EncodeGreeting() + c.bytes);
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.message().find(c.what), std::string::npos) << s.message();
    EXPECT_TRUE(r.messages.empty()) << c.what;
    EXPECT_LE(d.held_bytes(), ZmtpDecoder::kBufferBytes) << c.what;  // nothing kept after failing
    EXPECT_FALSE(d.Commit(0, r).ok()) << "a failed stream stays failed";
  }
}

TEST(ZmtpCodec, CommandsAreDecodedWithNameAndData) {
  ZmtpDecoder d(Limits());
  Recorder r;
  ASSERT_TRUE(Feed(d, r, EncodeGreeting() + EncodeCommand("PING", std::string("\x00\x0a", 2) + "ctx") +
                             EncodeCommand("X", std::string(300, 'c')))
                  .ok());
  ASSERT_EQ(r.commands.size(), 2u);
  EXPECT_EQ(r.commands[0], (std::pair<std::string, std::string>{"PING", std::string("\x00\x0a", 2) + "ctx"}));
  EXPECT_EQ(r.commands[1].second, std::string(300, 'c'));
}

}  // namespace
}  // namespace kvd::net
