// RespConnection: one blocking connection to one Redis/Valkey server over Debian's hiredis:
// connect with a timeout, AUTH (username and password, or password only), SELECT, and
// commands one at a time or pipelined. Owned and used by one thread at a time (Interrupt()
// excepted).
//
// A connection that saw an I/O or protocol error is broken for good (broken() is true): the
// owner drops it and connects again later. Server error replies (-ERR, -MOVED, ...) do not
// break it.
//
// BOUNDS (issue 27, finding 6). The server controls every size in a reply; none is trusted
// before memory is committed to it. A value read into a BulkSink: at most its capacity (see
// BulkSink). Any other reply: at most kMaxReplyBytes of it are buffered before it is
// complete (a longer one breaks the connection: the call answers Unavailable), an array may
// announce at most kMaxReplyElements elements (checked before hiredis allocates them), and
// hiredis refuses nesting deeper than 7. A reply's first line is at most 64 KiB.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct redisContext;
struct redisReply;

namespace kvd::l2 {

struct RespEndpoint {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
  bool operator==(const RespEndpoint&) const = default;
};

struct RespConnectOptions {
  std::string username;
  std::string password;
  int64_t database_id = -1;          // < 0: no SELECT
  double connect_timeout_s = 10;
  double request_timeout_s = 5;
};

// A reply, freed with its owner. Type codes are hiredis's REDIS_REPLY_*.
struct ReplyDeleter {
  void operator()(redisReply* r) const;
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// One argument of a command: bytes borrowed for the call.
using RespArg = std::string_view;

// Where a command's bulk-string reply (a GET's value) goes instead of a reply object: read
// from the socket straight into `dst` when it is at most `capacity` bytes. A longer value is
// never buffered (issue 27, finding 6): too_long is set, size says how long it claimed to be,
// and no reply object comes back; when it is at most kDrainBytes longer than `capacity` it
// is read and discarded 64 KiB at a time (the connection stays usable), else the connection
// is broken (the owner drops it). Any other reply (an error, nil, another type) is returned
// as a reply object as usual.
struct BulkSink {
  uint8_t* dst = nullptr;
  uint64_t capacity = 0;
  bool filled = false;    // set by the command: the value is in dst[0, size)
  bool too_long = false;  // set by the command: a value of `size` bytes, not read
  uint64_t size = 0;
};

class RespConnection {
 public:
  // Connects and authenticates. Unavailable when the server cannot be reached, Unavailable or
  // FailedPrecondition (naming the reply) when AUTH/SELECT is refused.
  static Result<std::unique_ptr<RespConnection>> Connect(const RespEndpoint& endpoint,
                                                         const RespConnectOptions& options);
  ~RespConnection();
  RespConnection(const RespConnection&) = delete;
  RespConnection& operator=(const RespConnection&) = delete;

  // Sends one command and waits for its reply. Unavailable on I/O errors (and the
  // connection is then broken); a server error reply is returned as a reply, not a Status.
  // With a sink, a bulk-string reply that fits is read into it (sink->filled; the returned
  // reply is then null) without passing through hiredis's reader and a reply object: one
  // copy fewer of a multi-megabyte object. Not with replies still pending (pipelining).
  Result<ReplyPtr> Command(const std::vector<RespArg>& args, BulkSink* sink = nullptr);
  // Pipelining: Append queues commands, then GetReply returns their replies in order.
  // A command with an argument of kDirectArgBytes or more (a SET of an object) is written at
  // once with writev from the caller's bytes, not copied into hiredis's output buffer.
  Status Append(const std::vector<RespArg>& args);
  Result<ReplyPtr> GetReply();

  // Shuts the socket down (both ways), so that a command blocked on it fails at once: the
  // one call another thread may make, while the owner cannot close the connection (the
  // owner's lock around closing it). Used by RespTier::Close() to abandon a hung server.
  void Interrupt();

  bool broken() const { return broken_; }

  // The bounds above. Replies other than values are small (SCAN pages of 1,000 keys, slot
  // maps, integers, OK); a value may be at most kDrainBytes longer than the room for it to
  // be discarded without losing the connection.
  static constexpr uint64_t kMaxReplyBytes = 2ull << 20;
  static constexpr int kMaxReplyElements = 1 << 16;
  static constexpr uint64_t kDrainBytes = 4ull << 20;
  const RespEndpoint& endpoint() const { return endpoint_; }

 private:
  RespConnection(redisContext* c, RespEndpoint endpoint) : ctx_(c), endpoint_(std::move(endpoint)) {}
  Status IoError(const char* what);
  Status ReaderError();  // the reader failed a reply (a refused array, a protocol error)
  Status WriteDirect(const std::vector<RespArg>& args);
  Result<ReplyPtr> GetReplyInto(BulkSink& sink);
  // read(2) on the socket with EINTR retried; an error or EOF breaks the connection.
  Result<size_t> ReadSome(void* dst, size_t len);

  static constexpr size_t kDirectArgBytes = 16 * 1024;
  static constexpr size_t kScratchBytes = 64 * 1024;  // a reply's first line and what follows

  std::vector<char> scratch_;  // GetReplyInto's first read

  redisContext* ctx_ = nullptr;
  RespEndpoint endpoint_;
  bool broken_ = false;
};

// Helpers over replies.
bool IsError(const redisReply* r);
bool IsNil(const redisReply* r);
std::string_view ReplyString(const redisReply* r);  // string, status or error text
long long ReplyInteger(const redisReply* r);

}  // namespace kvd::l2
