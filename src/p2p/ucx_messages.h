// The two active messages of kvd's P2P data path (ucx_transport.h): an ask ("send me these
// bytes of the object of this name", reader -> serving node: the header below, then the name's
// `name_length` bytes as the message's data, sent eagerly) and its answer (serving node ->
// reader: a status, then the bytes as the message's data). Both ends are kvd of the same build;
// the layout is native-endian, fixed-size, and checked field by field by the receiver, which
// drops any message whose header has another size (or, for an ask, another magic, a name
// longer than UcxPeer::kMaxNameBytes, data of another length than `name_length`, or data that
// came by rendezvous).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvd::p2p {

constexpr unsigned kAskId = 0x6b01;
constexpr unsigned kAnswerId = 0x6b02;
constexpr uint64_t kAskMagic = 0x6b76642d70327032ull;  // "kvd-p2p2" (asks with a name and a token)
constexpr size_t kTokenBytes = 32;

struct AskHeader {
  uint64_t magic = kAskMagic;
  uint64_t request = 0;  // the reader's id of one Read
  uint64_t index = 0;    // the item within it
  uint64_t object = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t name_length = 0;  // the bytes of the name that follow as the message's data
  uint8_t token[kTokenBytes] = {};  // derived from the reader's shared secret (AskToken)
};
static_assert(sizeof(AskHeader) == 88 && alignof(AskHeader) == 8, "AskHeader is fixed-size");

// The token in the asks of a node whose shared secret is `secret`: BLAKE3 in key derivation
// mode, with a context of kvd's own, over the secret (ucx_transport.h, SECURITY).
std::array<uint8_t, kTokenBytes> AskToken(std::string_view secret);

struct AnswerHeader {
  uint64_t request = 0;
  uint64_t index = 0;
  uint64_t status = 0;  // a StatusCode; kOk: exactly the asked `length` bytes follow
  uint64_t length = 0;
};
static_assert(sizeof(AnswerHeader) == 32, "AnswerHeader is fixed-size");

}  // namespace kvd::p2p
