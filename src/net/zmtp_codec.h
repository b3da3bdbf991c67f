// ZMTP 3.x wire format, as a ZMQ DEALER peer speaks it to kvd (rfc.zeromq.org/spec/23, /37):
// the 64-byte greeting, the NULL mechanism's READY command, PING/PONG heartbeats, and
// message frames. A pure decoder and encoders: no sockets, no threads (zmtp_router.h owns
// those), so every byte a client may send goes through code that can be fuzzed on its own
// (tests/fuzz/zmtp_fuzzer.cc).
//
// BOUNDS. The decoder is bounded before it allocates: a frame larger than max_frame_bytes,
// a message of more than max_frames frames or more than max_message_bytes in all, or a
// command larger than max_command_bytes is a protocol error, reported before any of its
// body is buffered. So one peer's stream holds at most kBufferBytes plus one message of at
// most max_message_bytes (the frames of the message being received), whatever it sends.
// A frame's body is allocated when its header arrives (malloc: pages are touched, and
// count in RSS, only as bytes arrive).
//
// THREADS. A decoder belongs to one connection and one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"

namespace kvd::net {

struct ZmtpLimits {
  uint64_t max_frame_bytes = 1u << 20;    // one frame's body
  uint64_t max_message_bytes = 1u << 20;  // all frames of one message
  uint32_t max_frames = 16;               // frames of one message
  uint32_t max_command_bytes = 4096;      // a command's body (READY with its properties)
};

inline constexpr size_t kGreetingBytes = 64;

// Our greeting: signature, version 3.1, mechanism NULL, as-server 0.
std::string EncodeGreeting();
// A command frame: flags, size, name length, name, data.
std::string EncodeCommand(std::string_view name, std::string_view data);
// The READY command of the NULL mechanism with these properties (name, value).
std::string EncodeReady(std::span<const std::pair<std::string_view, std::string_view>> props);
// A message frame's header: writes 2 or 9 bytes to `out`, returns how many.
size_t EncodeFrameHeader(uint64_t size, bool more, uint8_t out[9]);

// A command's metadata (READY's properties): name -> value, in order. An error when the
// bytes do not form exactly a sequence of (1-byte name length, name, 4-byte big-endian
// value length, value).
Result<std::vector<std::pair<std::string, std::string>>> ParseProperties(std::string_view data);

// What a peer's stream delivers, in order. An error returned by a callback stops the
// decoder with that error.
class ZmtpSink {
 public:
  virtual ~ZmtpSink() = default;
  // The peer's greeting (checked: signature, version >= 3, mechanism NULL).
  virtual Status OnGreeting(uint8_t major, uint8_t minor) = 0;
  virtual Status OnCommand(std::string_view name, std::string_view data) = 0;
  // One complete message: its frames in order, to be moved out (the decoder clears the
  // vector after the call and reuses it).
  virtual Status OnMessage(std::vector<zmq::message_t>& frames) = 0;
};

class ZmtpDecoder {
 public:
  // Holds headers, commands (at most max_command_bytes) and small frames; a frame that does
  // not fit what is left is read in place. Small, since every connection has one.
  static constexpr size_t kBufferBytes = 16 << 10;

  explicit ZmtpDecoder(const ZmtpLimits& limits);

  // Where the next bytes read from the peer go: the rest of a large frame's body, or the
  // decoder's buffer. Never empty while the decoder has not failed.
  std::span<uint8_t> WritableSpan();
  // `n` bytes were written to WritableSpan(); decodes what is complete, calling `sink`.
  // After an error the stream is unusable (close the connection).
  Status Commit(size_t n, ZmtpSink& sink);

  // Bytes this decoder holds now: its buffer and the frames of the message being received.
  uint64_t held_bytes() const;

 private:
  enum class State : uint8_t { kGreeting, kHeader, kBody, kFailed };
  Status Decode(ZmtpSink& sink);
  Status Deliver(ZmtpSink& sink);  // the message in frames_
  Status Fail(Status s);

  const ZmtpLimits limits_;
  State state_ = State::kGreeting;
  std::vector<uint8_t> buf_;
  size_t head_ = 0, tail_ = 0;       // unread bytes: buf_[head_, tail_)
  std::vector<zmq::message_t> frames_;  // of the message being received
  uint64_t message_bytes_ = 0;
  uint64_t body_filled_ = 0;         // kBody: bytes of frames_.back() received
  bool body_more_ = false;           // kBody: the frame has the MORE flag
};

}  // namespace kvd::net
