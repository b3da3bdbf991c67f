// RequestFramer: finds where one HTTP/1.1 request ends in the bytes a connection has sent,
// and refuses a request whose head or body goes past the bounds as soon as the bytes show it,
// so that no more of it is buffered. It frames; it does not interpret: httplib parses the
// request it delimits (ConnectionLoop), and every request the framer accepts is framed by
// httplib exactly as here (same end of head, same body length), because the framer refuses
// what the two could read differently:
//   - a line ending in a bare LF (httplib skips such header lines), obsolete line folding, a
//     header line without a colon or with blanks before it: 400;
//   - Content-Length that is not decimal digits, several that differ, or Content-Length with
//     Transfer-Encoding: 400; Transfer-Encoding other than "chunked": 501;
//   - chunk sizes other than hex digits (with optional ";extensions"), data not followed by
//     CRLF, or trailer fields after the last chunk (httplib takes none): 400.
// Bounds (FramingLimits): request line (414), one header line, the number of header lines and
// the whole head (431), the body, decoded and as sent (413).
//
// Usage: Scan(bytes) with the bytes received so far for this request, from its first byte,
// after every read (the same prefix, grown: scanning resumes where it stopped); kComplete
// gives request_size() (bytes beyond it belong to the next request); Reset() before the next.
// Not thread-safe; one per connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvd::http {

struct FramingLimits {
  size_t max_request_line = 8 << 10;   // bytes of the request line with its CRLF: 414 beyond
  size_t max_header_line = 8 << 10;    // bytes of one header line with its CRLF: 431 beyond
  size_t max_header_count = 100;       // header lines: 431 beyond
  size_t max_head_bytes = 64 << 10;    // request line + header lines + blank line: 431 beyond
  uint64_t max_body_bytes = 64 << 20;  // the body (chunked: decoded): 413 beyond
  size_t max_chunk_line = 1024;        // a chunk-size line with its extensions: 400 beyond
};

class RequestFramer {
 public:
  enum class State { kNeedMore, kComplete, kError };

  explicit RequestFramer(const FramingLimits& limits) : limits_(limits) {}

  // Scans what `bytes` adds to the bytes of the previous calls (since Reset).
  State Scan(std::string_view bytes);
  void Reset();

  State state() const { return state_; }
  bool head_complete() const { return phase_ > Phase::kHeaders; }
  // Valid once the head is complete: the size of the head (blank line included), whether a
  // body follows, and whether the client waits for "100 Continue" before sending it.
  size_t head_size() const { return head_size_; }
  bool has_body() const { return chunked_ || content_length_ > 0; }
  bool expects_continue() const { return expect_continue_; }
  // kComplete: the bytes of the whole request (head and body as sent).
  size_t request_size() const { return request_size_; }
  // kError: the status to answer (400, 413, 414, 431, 501) and why, for the client.
  int error_status() const { return error_status_; }
  const std::string& error_reason() const { return error_reason_; }

 private:
  enum class Phase { kRequestLine, kHeaders, kBody, kChunkLine, kChunkData, kChunkDataEnd, kLastCrlf, kDone };

  State Fail(int status, std::string reason);
  // One complete line, its CRLF included; OnHeadEnd gets the offset just past the blank line.
  State OnRequestLine(std::string_view line);
  State OnHeaderLine(std::string_view line);
  State OnHeadEnd(size_t end);
  State OnChunkLine(std::string_view line);

  FramingLimits limits_;
  State state_ = State::kNeedMore;
  Phase phase_ = Phase::kRequestLine;
  size_t pos_ = 0;               // bytes consumed so far
  size_t header_count_ = 0;
  size_t head_size_ = 0;
  bool have_length_ = false;
  uint64_t content_length_ = 0;
  bool chunked_ = false;
  bool expect_continue_ = false;
  uint64_t chunk_left_ = 0;      // data bytes of the current chunk still to come
  uint64_t body_decoded_ = 0;    // chunked: payload bytes so far
  size_t request_size_ = 0;
  int error_status_ = 0;
  std::string error_reason_;
};

}  // namespace kvd::http
