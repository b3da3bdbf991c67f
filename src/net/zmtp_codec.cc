#include "net/zmtp_codec.h"

#include <algorithm>
#include <cstring>

namespace kvd::net {
namespace {

constexpr uint8_t kMore = 0x01;
constexpr uint8_t kLong = 0x02;
constexpr uint8_t kCommand = 0x04;
constexpr size_t kMechanismBytes = 20;

uint64_t ReadBigEndian(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

void PutBigEndian(uint64_t v, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) out[n - 1 - i] = static_cast<uint8_t>(v >> (8 * i));
}

std::string Printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && p[i] != 0; ++i) s += (p[i] >= 0x20 && p[i] < 0x7f) ? char(p[i]) : '?';
  return s;
}

}  // namespace

std::string EncodeGreeting() {
  std::string g(kGreetingBytes, '\0');
  g[0] = static_cast<char>(0xff);
  g[9] = 0x7f;
  g[10] = 3;  // ZMTP 3.1: PING/PONG
  g[11] = 1;
  std::memcpy(g.data() + 12, "NULL", 4);
  return g;
}

std::string EncodeCommand(std::string_view name, std::string_view data) {
  const uint64_t body = 1 + name.size() + data.size();
  std::string out;
  uint8_t hdr[9];
  if (body <= 255) {
    hdr[0] = kCommand;
    hdr[1] = static_cast<uint8_t>(body);
    out.append(reinterpret_cast<const char*>(hdr), 2);
  } else {
    hdr[0] = kCommand | kLong;
    PutBigEndian(body, 8, hdr + 1);
    out.append(reinterpret_cast<const char*>(hdr), 9);
  }
  out += static_cast<char>(name.size());
  out += name;
  out += data;
  return out;
}

std::string EncodeReady(std::span<const std::pair<std::string_view, std::string_view>> props) {
  std::string data;
  for (const auto& [name, value] : props) {
    data += static_cast<char>(name.size());
    data += name;
    uint8_t len[4];
    PutBigEndian(value.size(), 4, len);
    data.append(reinterpret_cast<const char*>(len), 4);
    data += value;
  }
  return EncodeCommand("READY", data);
}

size_t EncodeFrameHeader(uint64_t size, bool more, uint8_t out[9]) {
  const uint8_t flags = more ? kMore : 0;
  if (size <= 255) {
    out[0] = flags;
    out[1] = static_cast<uint8_t>(size);
    return 2;
  }
  out[0] = flags | kLong;
  PutBigEndian(size, 8, out + 1);
  return 9;
}

Result<std::vector<std::pair<std::string, std::string>>> ParseProperties(std::string_view data) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t name_len = p[pos++];
    if (name_len == 0 || data.size() - pos < name_len + 4) {
      return Status::InvalidArgument("malformed command metadata (a property is cut short)");
    }
    std::string name(data.substr(pos, name_len));
    pos += name_len;
    const uint64_t value_len = ReadBigEndian(p + pos, 4);
    pos += 4;
    if (data.size() - pos < value_len) {
      return Status::InvalidArgument("malformed command metadata (property '" + name +
                                     "' is longer than the command)");
    }
    out.emplace_back(std::move(name), std::string(data.substr(pos, value_len)));
    pos += value_len;
  }
  return out;
}

ZmtpDecoder::ZmtpDecoder(const ZmtpLimits& limits) : limits_(limits), buf_(kBufferBytes) {}

uint64_t ZmtpDecoder::held_bytes() const { return buf_.size() + message_bytes_; }

std::span<uint8_t> ZmtpDecoder::WritableSpan() {
  if (state_ == State::kBody) {
    zmq::message_t& f = frames_.back();
    return {static_cast<uint8_t*>(f.data()) + body_filled_, f.size() - body_filled_};
  }
  if (head_ == tail_) {
    head_ = tail_ = 0;
  } else if (head_ > 0 && (tail_ == buf_.size() || head_ >= buf_.size() / 2)) {
    std::memmove(buf_.data(), buf_.data() + head_, tail_ - head_);
    tail_ -= head_;
    head_ = 0;
  }
  return {buf_.data() + tail_, buf_.size() - tail_};
}

Status ZmtpDecoder::Deliver(ZmtpSink& sink) {
  Status s = sink.OnMessage(frames_);  // the sink moves the frames out
  frames_.clear();                     // keeps its capacity: no allocation per message
  message_bytes_ = 0;
  return s;
}

Status ZmtpDecoder::Fail(Status s) {
  state_ = State::kFailed;
  frames_.clear();
  message_bytes_ = 0;
  return s;
}

Status ZmtpDecoder::Commit(size_t n, ZmtpSink& sink) {
  if (state_ == State::kFailed) return Status::FailedPrecondition("the stream already failed");
  if (state_ == State::kBody) {
    body_filled_ += n;
    if (body_filled_ < frames_.back().size()) return Status::Ok();
    state_ = State::kHeader;
    if (!body_more_) {
      if (Status s = Deliver(sink); !s.ok()) return Fail(std::move(s));
    }
    return Status::Ok();  // nothing is buffered while a body is read in place
  }
  tail_ += n;
  return Decode(sink);
}

Status ZmtpDecoder::Decode(ZmtpSink& sink) {
  while (true) {
    const uint8_t* p = buf_.data() + head_;
    const size_t avail = tail_ - head_;
    if (state_ == State::kGreeting) {
      if (avail < kGreetingBytes) return Status::Ok();
      if (p[0] != 0xff || (p[9] & 0x01) == 0) {
        return Fail(Status::InvalidArgument("not a ZMTP 3 peer (bad greeting signature)"));
      }
      const uint8_t major = p[10], minor = p[11];
      if (major < 3) {
        return Fail(Status::InvalidArgument("ZMTP version " + std::to_string(major) +
                                            " is not supported (3.x is)"));
      }
      static const uint8_t kNull[kMechanismBytes] = {'N', 'U', 'L', 'L'};
      if (std::memcmp(p + 12, kNull, kMechanismBytes) != 0) {
        return Fail(Status::InvalidArgument("security mechanism '" + Printable(p + 12, kMechanismBytes) +
                                            "' is not supported (NULL is)"));
      }
      head_ += kGreetingBytes;
      state_ = State::kHeader;
      if (Status s = sink.OnGreeting(major, minor); !s.ok()) return Fail(std::move(s));
      continue;
    }
    if (state_ != State::kHeader) return Status::Ok();
    if (avail < 1) return Status::Ok();
    const uint8_t flags = p[0];
    if (flags & ~(kMore | kLong | kCommand)) {
      return Fail(Status::InvalidArgument("frame flags with reserved bits set"));
    }
    const size_t header = (flags & kLong) ? 9 : 2;
    if (avail < header) return Status::Ok();
    const uint64_t size = (flags & kLong) ? ReadBigEndian(p + 1, 8) : p[1];
    if (flags & kCommand) {
      if (flags & kMore) return Fail(Status::InvalidArgument("a command frame with MORE set"));
      if (size > limits_.max_command_bytes) {
        return Fail(Status::InvalidArgument("a command of " + std::to_string(size) +
                                            " bytes (at most " +
                                            std::to_string(limits_.max_command_bytes) + ")"));
      }
      if (avail < header + size) return Status::Ok();
      const auto* body = reinterpret_cast<const char*>(p + header);
      if (size < 1 || body[0] == 0 || static_cast<uint64_t>(static_cast<uint8_t>(body[0])) + 1 > size) {
        return Fail(Status::InvalidArgument("a command frame without a valid name"));
      }
      const size_t name_len = static_cast<uint8_t>(body[0]);
      const std::string_view name(body + 1, name_len);
      const std::string_view data(body + 1 + name_len, size - 1 - name_len);
      head_ += header + size;
      if (Status s = sink.OnCommand(name, data); !s.ok()) return Fail(std::move(s));
      continue;
    }
    if (frames_.size() >= limits_.max_frames) {
      return Fail(Status::InvalidArgument("a message of more than " +
                                          std::to_string(limits_.max_frames) + " frames"));
    }
    if (size > limits_.max_frame_bytes) {
      return Fail(Status::InvalidArgument("a frame of " + std::to_string(size) + " bytes (at most " +
                                          std::to_string(limits_.max_frame_bytes) + ")"));
    }
    if (size > limits_.max_message_bytes - message_bytes_) {
      return Fail(Status::InvalidArgument("a message of more than " +
                                          std::to_string(limits_.max_message_bytes) + " bytes"));
    }
    head_ += header;
    frames_.emplace_back(static_cast<size_t>(size));
    message_bytes_ += size;
    const size_t copy = static_cast<size_t>(std::min<uint64_t>(size, avail - header));
    if (copy > 0) std::memcpy(frames_.back().data(), p + header, copy);
    head_ += copy;
    if (copy < size) {  // the rest of the body is read in place
      state_ = State::kBody;
      body_filled_ = copy;
      body_more_ = (flags & kMore) != 0;
      return Status::Ok();
    }
    if (!(flags & kMore)) {
      if (Status s = Deliver(sink); !s.ok()) return Fail(std::move(s));
    }
  }
}

}  // namespace kvd::net
