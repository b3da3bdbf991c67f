// Shared pieces of kvd's libFuzzer targets (tests/fuzz/*_fuzzer.cc) and of the replay test
// that runs their saved inputs as a unit test (tests/fuzz/replay_test.cc).
//
// Input format of the frame-level targets (request, payload): one or more ZMQ messages,
// separated by kMessageSep; each message is its frames separated by kFrameSep, exactly as a
// DEALER sends them: [uid, op, payload...]. Both separators start with 0xc1, the one byte
// msgpack never uses, so the golden frames captured from the real client never contain them
// by accident, and libFuzzer's byte-level mutations keep most of the structure intact.
// tests/fuzz/make_seeds.py writes seeds in this format.
//
// Not thread-safe; a fuzzer process runs one input at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "wire/codec.h"

namespace kvd::fuzz {

inline constexpr std::string_view kFrameSep("\xc1\xc1\xc1\xc1", 4);
inline constexpr std::string_view kMessageSep("\xc1\xc1\xc1\xc2", 4);
// Bounds so one input stays cheap: messages per input, frames per message.
inline constexpr size_t kMaxMessages = 24;
inline constexpr size_t kMaxFrames = 16;

using Message = std::vector<std::string_view>;

// Where the next `sep` starts in s (npos if none). A frame that starts with 0xc2 (msgpack
// false) after a frame separator reads c1 c1 c1 c1 c2, which holds the message separator one
// byte in: a message separator is only taken where the run of 0xc1 bytes before its 0xc2 is
// not a whole number of frame separators (0xc1 is never msgpack, so frames never end in it).
inline size_t FindSep(std::string_view s, std::string_view sep) {
  size_t p = s.find(sep);
  if (sep != kMessageSep) return p;
  for (; p != std::string_view::npos; p = s.find(sep, p + 1)) {
    size_t run = 3;  // 0xc1 bytes ending at p + 2
    while (run <= p + 2 && s[p + 2 - run] == kFrameSep[0]) ++run;
    if (run % kFrameSep.size() != 0) return p;
  }
  return p;
}

inline std::vector<std::string_view> Split(std::string_view s, std::string_view sep,
                                           size_t max_parts) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < max_parts) {
    size_t p = FindSep(s, sep);
    if (p == std::string_view::npos) break;
    out.push_back(s.substr(0, p));
    s.remove_prefix(p + sep.size());
  }
  out.push_back(s);
  return out;
}

// Messages of an input; each message's frames view into `data`.
inline std::vector<Message> ParseInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<Message> msgs;
  for (std::string_view m : Split(all, kMessageSep, kMaxMessages)) {
    msgs.push_back(Split(m, kFrameSep, kMaxFrames));
  }
  return msgs;
}

// Aborts (a crash libFuzzer reports) when `ok` is false: the fuzzers' own invariants.
void Check(bool ok, const char* what);

// True if `bytes` is exactly one well-formed msgpack document.
bool IsOneMsgpackDocument(std::string_view bytes);

// CacheBlend ops (wire/codec.h): decodes `payloads` with the decoder of `op` when it is a
// blend op, or with every blend decoder when `op` is null, and checks what a decoded request
// promises (ranges, bounds, what the handler relies on), that re-encoding the parts kvd also
// encodes gives back the same values, and that the reply encoders write one document. The
// server answers these ops as unsupported until its blend engine lands, so the request target
// reaches their decoders through this.
void CheckBlendDecoders(wire::Frames payloads, const wire::OpInfo* op);

}  // namespace kvd::fuzz
