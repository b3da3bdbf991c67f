#include "http/request_framer.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace kvd::http {
namespace {

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// RFC 9110 token characters (header names).
bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool EndsWithCrlf(std::string_view line) {
  return line.size() >= 2 && line[line.size() - 2] == '\r' && line.back() == '\n';
}

}  // namespace

void RequestFramer::Reset() { *this = RequestFramer(limits_); }

RequestFramer::State RequestFramer::Fail(int status, std::string reason) {
  error_status_ = status;
  error_reason_ = std::move(reason);
  return state_ = State::kError;
}

RequestFramer::State RequestFramer::Scan(std::string_view bytes) {
  while (state_ == State::kNeedMore) {
    switch (phase_) {
      case Phase::kRequestLine:
      case Phase::kHeaders:
      case Phase::kChunkLine:
      case Phase::kLastCrlf: {
        const size_t nl = bytes.find('\n', pos_);
        const size_t have = (nl == std::string_view::npos ? bytes.size() : nl + 1) - pos_;
        // Bounds first, on what has arrived, so that a line without end is refused early.
        if (phase_ == Phase::kRequestLine && have > limits_.max_request_line) {
          return Fail(414, "request line longer than " + std::to_string(limits_.max_request_line) + " bytes");
        }
        if (phase_ == Phase::kHeaders) {
          if (have > limits_.max_header_line) {
            return Fail(431, "a header line longer than " + std::to_string(limits_.max_header_line) + " bytes");
          }
          if (pos_ + have > limits_.max_head_bytes) {
            return Fail(431, "request head larger than " + std::to_string(limits_.max_head_bytes) + " bytes");
          }
        }
        if ((phase_ == Phase::kChunkLine || phase_ == Phase::kLastCrlf) && have > limits_.max_chunk_line) {
          return Fail(400, "chunk-size line longer than " + std::to_string(limits_.max_chunk_line) + " bytes");
        }
        if (nl == std::string_view::npos) return state_;
        const std::string_view line = bytes.substr(pos_, nl + 1 - pos_);
        pos_ = nl + 1;
        State s = State::kNeedMore;
        if (phase_ == Phase::kRequestLine) {
          s = OnRequestLine(line);
        } else if (phase_ == Phase::kHeaders) {
          s = line == "\r\n" ? OnHeadEnd(pos_) : OnHeaderLine(line);
        } else if (phase_ == Phase::kChunkLine) {
          s = OnChunkLine(line);
        } else {  // kLastCrlf: httplib takes no trailer fields
          if (line != "\r\n") return Fail(400, "trailer fields after the last chunk are not accepted");
          phase_ = Phase::kDone;
        }
        if (s == State::kError) return s;
        break;
      }
      case Phase::kBody: {
        if (bytes.size() - head_size_ < content_length_) return state_;
        pos_ = head_size_ + static_cast<size_t>(content_length_);
        phase_ = Phase::kDone;
        break;
      }
      case Phase::kChunkData: {
        const uint64_t have = bytes.size() - pos_;
        if (have < chunk_left_) {
          chunk_left_ -= have;
          pos_ = bytes.size();
          return state_;
        }
        pos_ += static_cast<size_t>(chunk_left_);
        chunk_left_ = 0;
        phase_ = Phase::kChunkDataEnd;
        break;
      }
      case Phase::kChunkDataEnd: {
        if (bytes.size() - pos_ < 2) return state_;
        if (bytes.substr(pos_, 2) != "\r\n") return Fail(400, "chunk data not followed by CRLF");
        pos_ += 2;
        phase_ = Phase::kChunkLine;
        break;
      }
      case Phase::kDone:
        request_size_ = pos_;
        return state_ = State::kComplete;
    }
    // The body as sent (chunk framing included) is bounded too: many tiny chunks with long
    // extensions must not be buffered without end.
    if (chunked_ && head_complete()) {
      const uint64_t sent = pos_ - head_size_;
      if (sent > limits_.max_body_bytes + limits_.max_body_bytes / 8 + 65536) {
        return Fail(413, "chunked body larger than " + std::to_string(limits_.max_body_bytes) + " bytes");
      }
    }
  }
  return state_;
}

RequestFramer::State RequestFramer::OnRequestLine(std::string_view line) {
  if (!EndsWithCrlf(line)) return Fail(400, "the request line must end with CRLF");
  const std::string_view text = line.substr(0, line.size() - 2);
  const size_t sp = text.find(' ');
  if (sp == 0 || sp == std::string_view::npos ||
      !std::all_of(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(sp), IsTokenChar)) {
    return Fail(400, "malformed request line");
  }
  phase_ = Phase::kHeaders;
  return state_;
}

RequestFramer::State RequestFramer::OnHeaderLine(std::string_view line) {
  if (!EndsWithCrlf(line)) return Fail(400, "header lines must end with CRLF");
  if (++header_count_ > limits_.max_header_count) {
    return Fail(431, "more than " + std::to_string(limits_.max_header_count) + " header lines");
  }
  if (line.front() == ' ' || line.front() == '\t') return Fail(400, "obsolete header line folding");
  const std::string_view text = line.substr(0, line.size() - 2);
  const size_t colon = text.find(':');
  if (colon == 0 || colon == std::string_view::npos ||
      !std::all_of(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(colon), IsTokenChar)) {
    return Fail(400, "malformed header line");
  }
  const std::string_view name = text.substr(0, colon);
  const std::string_view value = Trim(text.substr(colon + 1));
  if (IEquals(name, "Content-Length")) {
    uint64_t n = 0;
    if (value.empty() || !std::all_of(value.begin(), value.end(),
                                      [](char c) { return c >= '0' && c <= '9'; })) {
      return Fail(400, "Content-Length must be decimal digits");
    }
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || n > limits_.max_body_bytes) {
      return Fail(413, "request body larger than " + std::to_string(limits_.max_body_bytes) + " bytes");
    }
    if (have_length_ && n != content_length_) return Fail(400, "conflicting Content-Length headers");
    have_length_ = true;
    content_length_ = n;
  } else if (IEquals(name, "Transfer-Encoding")) {
    if (chunked_) return Fail(400, "more than one Transfer-Encoding header");
    if (!IEquals(value, "chunked")) {
      return Fail(501, "Transfer-Encoding other than chunked is not implemented");
    }
    chunked_ = true;
  } else if (IEquals(name, "Expect")) {
    expect_continue_ = IEquals(value, "100-continue");
  }
  return state_;
}

RequestFramer::State RequestFramer::OnHeadEnd(size_t end) {
  head_size_ = end;
  if (chunked_ && have_length_) return Fail(400, "both Content-Length and Transfer-Encoding");
  if (chunked_) {
    phase_ = Phase::kChunkLine;
  } else if (content_length_ > 0) {
    phase_ = Phase::kBody;
  } else {
    phase_ = Phase::kDone;
  }
  return state_;
}

RequestFramer::State RequestFramer::OnChunkLine(std::string_view line) {
  if (!EndsWithCrlf(line)) return Fail(400, "chunk-size lines must end with CRLF");
  std::string_view text = line.substr(0, line.size() - 2);
  const size_t ext = text.find(';');
  const std::string_view digits = text.substr(0, ext);
  if (digits.empty() || digits.size() > 16 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
    return Fail(400, "malformed chunk size");
  }
  uint64_t n = 0;
  std::from_chars(digits.data(), digits.data() + digits.size(), n, 16);
  if (n > limits_.max_body_bytes - body_decoded_) {
    return Fail(413, "request body larger than " + std::to_string(limits_.max_body_bytes) + " bytes");
  }
  body_decoded_ += n;
  if (n == 0) {
    phase_ = Phase::kLastCrlf;
  } else {
    chunk_left_ = n;
    phase_ = Phase::kChunkData;
  }
  return state_;
}

}  // namespace kvd::http
