// The two active messages of kvd's P2P data path (ucx_transport.h): an ask ("send me these
// bytes of this object", reader -> serving node) and its answer (serving node -> reader: a
// status, then the bytes as the message's data). Both ends are kvd of the same build; the
// layout is native-endian, fixed-size, and checked field by field by the receiver, which
// drops any message whose header has another size (or, for an ask, another magic).
#pragma once

#include <cstdint>

namespace kvd::p2p {

constexpr unsigned kAskId = 0x6b01;
constexpr unsigned kAnswerId = 0x6b02;
constexpr uint64_t kAskMagic = 0x6b76642d70327031ull;  // "kvd-p2p1"

struct AskHeader {
  uint64_t magic = kAskMagic;
  uint64_t request = 0;  // the reader's id of one Read
  uint64_t index = 0;    // the item within it
  uint64_t object = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct AnswerHeader {
  uint64_t request = 0;
  uint64_t index = 0;
  uint64_t status = 0;  // a StatusCode; kOk: exactly the asked `length` bytes follow
  uint64_t length = 0;
};

}  // namespace kvd::p2p
