// Fuzz target "zmtp": the ZMTP decoder every byte a client sends goes through
// (net/zmtp_codec.h), on arbitrary streams.
//
// Input: one control byte, then the stream. Bit 0 of the control byte puts a valid greeting
// in front of the stream (so most inputs reach frames and commands); bits 1-7 choose the
// size of the reads the stream is cut into (1 to 128 bytes). The same stream is also decoded
// in one piece. Invariants: both decodings deliver the same greetings, commands and
// messages and end with the same status; no message exceeds the frame, byte or frame-count
// limits; the decoder never holds more than its buffer plus one maximum message.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "net/zmtp_codec.h"

namespace {

using kvd::Status;
using kvd::net::ZmtpDecoder;
using kvd::net::ZmtpLimits;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

ZmtpLimits Limits() {
  ZmtpLimits l;
  l.max_frame_bytes = 4096;
  l.max_message_bytes = 6000;
  l.max_frames = 6;
  l.max_command_bytes = 300;
  return l;
}

struct Log : kvd::net::ZmtpSink {
  std::vector<std::string> events;
  Status OnGreeting(uint8_t major, uint8_t minor) override {
    events.push_back("G" + std::to_string(major) + "." + std::to_string(minor));
    return Status::Ok();
  }
  Status OnCommand(std::string_view name, std::string_view data) override {
    events.push_back("C" + std::string(name) + ":" + std::string(data));
    return Status::Ok();
  }
  Status OnMessage(std::vector<zmq::message_t>& frames) override {
    const ZmtpLimits l = Limits();
    Check(!frames.empty() && frames.size() <= l.max_frames, "frames per message");
    uint64_t total = 0;
    std::string e = "M";
    for (const auto& f : frames) {
      Check(f.size() <= l.max_frame_bytes, "frame size");
      total += f.size();
      e += std::to_string(f.size()) + ":" + std::string(static_cast<const char*>(f.data()), f.size()) + "|";
    }
    Check(total <= l.max_message_bytes, "message size");
    events.push_back(std::move(e));
    return Status::Ok();
  }
};

Status Decode(std::string_view stream, size_t piece, Log& log) {
  ZmtpDecoder d(Limits());
  const uint64_t bound = ZmtpDecoder::kBufferBytes + Limits().max_message_bytes;
  while (!stream.empty()) {
    auto span = d.WritableSpan();
    Check(!span.empty(), "writable span is empty");
    const size_t n = std::min({span.size(), piece, stream.size()});
    std::memcpy(span.data(), stream.data(), n);
    stream.remove_prefix(n);
    Status s = d.Commit(n, log);
    Check(d.held_bytes() <= bound, "decoder holds more than its bound");
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  std::string stream;
  if (control & 1) stream = kvd::net::EncodeGreeting();
  stream.append(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t piece = 1 + (control >> 1);
  Log a, b;
  const Status sa = Decode(stream, piece, a);
  const Status sb = Decode(stream, stream.size() + 1, b);
  Check(sa.ok() == sb.ok() && sa.message() == sb.message(), "status depends on read sizes");
  Check(a.events == b.events, "events depend on read sizes");
  return 0;
}
