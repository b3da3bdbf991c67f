// RequestFramer: where a request ends, and what it refuses before buffering more (issue 27,
// finding 8: header lines without end grew kvd's memory).
#include "http/request_framer.h"

#include <gtest/gtest.h>

#include <string>

namespace kvd::http {
namespace {

using State = RequestFramer::State;

FramingLimits Small() {
  FramingLimits l;
  l.max_request_line = 64;
  l.max_header_line = 64;
  l.max_header_count = 4;
  l.max_head_bytes = 200;
  l.max_body_bytes = 100;
  l.max_chunk_line = 32;
  return l;
}

// Scans `bytes` in one piece and, separately, one byte at a time: both must agree.
struct Framed {
  State state;
  size_t size = 0;
  int status = 0;
};
Framed Frame(const std::string& bytes, FramingLimits limits = Small()) {
  RequestFramer whole(limits);
  const State a = whole.Scan(bytes);
  RequestFramer bytewise(limits);
  State b = State::kNeedMore;
  for (size_t i = 1; i <= bytes.size() && b == State::kNeedMore; ++i) {
    b = bytewise.Scan(std::string_view(bytes).substr(0, i));
  }
  EXPECT_EQ(a, b) << bytes;
  if (a == State::kComplete && b == State::kComplete) {
    EXPECT_EQ(whole.request_size(), bytewise.request_size()) << bytes;
  }
  if (a == State::kError && b == State::kError) {
    EXPECT_EQ(whole.error_status(), bytewise.error_status()) << bytes;
  }
  return {a, a == State::kComplete ? whole.request_size() : 0, a == State::kError ? whole.error_status() : 0};
}

TEST(RequestFramer, ARequestWithoutBodyEndsAtTheBlankLine) {
  const std::string req = "GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n";
  auto f = Frame(req + "GET /next");  // pipelined bytes are the next request's
  EXPECT_EQ(f.state, State::kComplete);
  EXPECT_EQ(f.size, req.size());
  EXPECT_EQ(Frame("GET / HTTP/1.1\r\nHost: x\r\n").state, State::kNeedMore);
}

TEST(RequestFramer, ContentLengthFramesTheBody) {
  const std::string req = "POST /x HTTP/1.1\r\ncontent-length: 5\r\n\r\nhello";
  auto f = Frame(req + "extra");
  EXPECT_EQ(f.state, State::kComplete);
  EXPECT_EQ(f.size, req.size());
  EXPECT_EQ(Frame("POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhell").state, State::kNeedMore);
  // A body sent with GET is framed the same way (httplib does not read it; the next request
  // still starts after it).
  const std::string get = "GET /x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
  EXPECT_EQ(Frame(get + "GET /").size, get.size());
  // The same length twice is one length; two lengths are refused.
  EXPECT_EQ(Frame("POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}").state, State::kComplete);
  EXPECT_EQ(Frame("POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}").status, 400);
  for (const char* bad : {"-1", "+2", "0x10", "2 2", "", "1e3"}) {
    EXPECT_EQ(Frame(std::string("POST /x HTTP/1.1\r\nContent-Length: ") + bad + "\r\n\r\n").status, 400) << bad;
  }
}

TEST(RequestFramer, ChunkedBodiesAreFramedAsHttplibReadsThem) {
  const std::string req =
      "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\na\r\n0123456789\r\n0\r\n\r\n";
  auto f = Frame(req + "GET");
  EXPECT_EQ(f.state, State::kComplete);
  EXPECT_EQ(f.size, req.size());
  const std::string head = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  EXPECT_EQ(Frame(head + "5\r\nhelloXY").status, 400) << "data not followed by CRLF";
  EXPECT_EQ(Frame(head + "0x5\r\nhello\r\n0\r\n\r\n").status, 400) << "hex digits only";
  EXPECT_EQ(Frame(head + " 5\r\nhello\r\n0\r\n\r\n").status, 400);
  EXPECT_EQ(Frame(head + "0\r\nTrailer: x\r\n\r\n").status, 400) << "httplib takes no trailers";
  EXPECT_EQ(Frame(head + "65\r\n").status, 413) << "101 bytes > 100";
  EXPECT_EQ(Frame(head + "32\r\n" + std::string(50, 'a') + "\r\n33\r\n").status, 413) << "in total";
  EXPECT_EQ(Frame(head + "1;" + std::string(40, 'e') + "\r\n").status, 400) << "long extensions";
  EXPECT_EQ(Frame("POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").status, 501);
  EXPECT_EQ(Frame("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n").status, 400);
}

TEST(RequestFramer, Finding8HeadBoundsAreCheckedBeforeTheHeadEnds) {
  // A request line without end: 414 once it is longer than the bound.
  EXPECT_EQ(Frame("GET /" + std::string(100, 'a')).status, 414);
  // Header lines: the fifth is refused (431) without waiting for the end of the head.
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 5; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(Frame(many).status, 431);
  // One long header line, ended or not.
  EXPECT_EQ(Frame("GET / HTTP/1.1\r\nX: " + std::string(80, 'v')).status, 431);
  // The whole head: 3 lines of 60 bytes and the request line pass the line bounds, not the
  // head bound.
  std::string big = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 4; ++i) big += "X" + std::to_string(i) + ": " + std::string(54, 'v') + "\r\n";
  EXPECT_EQ(Frame(big).status, 431);
  // Content-Length past the body bound: 413 at once, before any body byte.
  EXPECT_EQ(Frame("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n").status, 413);
  EXPECT_EQ(Frame("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n").status, 413);
}

TEST(RequestFramer, LinesHttplibWouldReadDifferentlyAreRefused) {
  EXPECT_EQ(Frame("GET / HTTP/1.1\nHost: x\r\n\r\n").status, 400) << "bare LF request line";
  EXPECT_EQ(Frame("GET / HTTP/1.1\r\nHost: x\n\r\n").status, 400) << "bare LF header line";
  EXPECT_EQ(Frame("GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n").status, 400);
  EXPECT_EQ(Frame("GET / HTTP/1.1\r\nno colon\r\n\r\n").status, 400);
  EXPECT_EQ(Frame("GET / HTTP/1.1\r\nContent-Length : 2\r\n\r\n{}").status, 400) << "blank before colon";
  EXPECT_EQ(Frame(" GET / HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Frame("\r\n").status, 400);
}

TEST(RequestFramer, ExpectContinueIsReportedOnceTheHeadIsComplete) {
  RequestFramer f(Small());
  const std::string head = "POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\n";
  EXPECT_EQ(f.Scan(head), State::kNeedMore);
  EXPECT_TRUE(f.head_complete());
  EXPECT_TRUE(f.expects_continue());
  EXPECT_TRUE(f.has_body());
  EXPECT_EQ(f.head_size(), head.size());
  EXPECT_EQ(f.Scan(head + "{}"), State::kComplete);
  f.Reset();
  EXPECT_FALSE(f.head_complete());
  EXPECT_EQ(f.Scan("GET / HTTP/1.1\r\n\r\n"), State::kComplete);
  EXPECT_FALSE(f.expects_continue());
}

}  // namespace
}  // namespace kvd::http
