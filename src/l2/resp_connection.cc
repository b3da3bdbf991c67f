#include "l2/resp_connection.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <string>

namespace kvd::l2 {
namespace {
// hiredis's reply builders, with arrays bounded: an array header announcing more than
// kMaxReplyElements elements is refused before hiredis allocates its element table (the
// reader then fails the reply). Installed on every connection's reader.
const redisReplyObjectFunctions* g_hiredis_fns = nullptr;
redisReplyObjectFunctions g_bounded_fns;
std::once_flag g_fns_once;
thread_local long long t_refused_elements = -1;

void* BoundedCreateArray(const redisReadTask* task, int elements) {
  if (elements > RespConnection::kMaxReplyElements) {
    t_refused_elements = elements;
    return nullptr;
  }
  return g_hiredis_fns->createArray(task, elements);
}

void InstallBoundedFns(redisContext* c) {
  std::call_once(g_fns_once, [c] {
    g_hiredis_fns = c->reader->fn;
    g_bounded_fns = *g_hiredis_fns;
    g_bounded_fns.createArray = BoundedCreateArray;
  });
  if (c->reader->fn == g_hiredis_fns) c->reader->fn = &g_bounded_fns;
}

timeval ToTimeval(double s) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}
}  // namespace

void ReplyDeleter::operator()(redisReply* r) const {
  if (r) freeReplyObject(r);
}

bool IsError(const redisReply* r) { return r && r->type == REDIS_REPLY_ERROR; }
bool IsNil(const redisReply* r) { return !r || r->type == REDIS_REPLY_NIL; }
std::string_view ReplyString(const redisReply* r) {
  if (!r || !r->str) return {};
  return std::string_view(r->str, r->len);
}
long long ReplyInteger(const redisReply* r) { return r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0; }

Result<std::unique_ptr<RespConnection>> RespConnection::Connect(const RespEndpoint& endpoint,
                                                                const RespConnectOptions& options) {
  redisContext* c = redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port,
                                            ToTimeval(options.connect_timeout_s));
  if (c == nullptr) return Status::Unavailable(endpoint.ToString() + ": out of memory connecting");
  if (c->err) {
    std::string msg = endpoint.ToString() + ": " + c->errstr;
    redisFree(c);
    return Status::Unavailable(msg);
  }
  redisSetTimeout(c, ToTimeval(options.request_timeout_s));
  InstallBoundedFns(c);
  std::unique_ptr<RespConnection> conn(new RespConnection(c, endpoint));
  if (!options.password.empty()) {
    std::vector<RespArg> auth = {"AUTH"};
    if (!options.username.empty()) auth.push_back(options.username);
    auth.push_back(options.password);
    auto r = conn->Command(auth);
    if (!r.ok()) return r.status();
    if (IsError(r->get())) {
      return Status::FailedPrecondition(endpoint.ToString() + ": AUTH refused: " +
                                        std::string(ReplyString(r->get())));
    }
  }
  if (options.database_id >= 0) {
    const std::string db = std::to_string(options.database_id);
    auto r = conn->Command({"SELECT", db});
    if (!r.ok()) return r.status();
    if (IsError(r->get())) {
      return Status::FailedPrecondition(endpoint.ToString() + ": SELECT " + db + " refused: " +
                                        std::string(ReplyString(r->get())));
    }
  }
  return conn;
}

RespConnection::~RespConnection() {
  if (ctx_) redisFree(ctx_);
}

void RespConnection::Interrupt() {
  if (ctx_ && ctx_->fd >= 0) ::shutdown(ctx_->fd, SHUT_RDWR);
}

Status RespConnection::IoError(const char* what) {
  broken_ = true;
  return Status::Unavailable(endpoint_.ToString() + ": " + what + ": " +
                             (ctx_ && ctx_->err ? ctx_->errstr : "connection lost"));
}

Status RespConnection::Append(const std::vector<RespArg>& args) {
  if (broken_) return Status::Unavailable(endpoint_.ToString() + ": connection is broken");
  for (const auto& a : args) {
    if (a.size() >= kDirectArgBytes) return WriteDirect(args);
  }
  std::vector<const char*> argv(args.size());
  std::vector<size_t> lens(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    argv[i] = args[i].data();
    lens[i] = args[i].size();
  }
  if (redisAppendCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data()) != REDIS_OK) {
    return IoError("append");
  }
  return Status::Ok();
}

Status RespConnection::WriteDirect(const std::vector<RespArg>& args) {
  // Whatever hiredis still holds goes first, so the commands stay in order.
  int done = 0;
  while (!done) {
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) return IoError("write");
  }
  // The RESP framing of every argument in one buffer; large arguments are sent from the
  // caller's bytes by the same writev.
  std::string frame = "*" + std::to_string(args.size()) + "\r\n";
  struct Piece {
    size_t frame_end;  // frame bytes up to here precede the argument
    const RespArg* large;
  };
  std::vector<Piece> pieces;
  for (const auto& a : args) {
    frame += "$" + std::to_string(a.size()) + "\r\n";
    if (a.size() >= kDirectArgBytes) {
      pieces.push_back({frame.size(), &a});
    } else {
      frame.append(a.data(), a.size());
    }
    frame += "\r\n";
  }
  std::vector<iovec> iov;
  size_t from = 0;
  for (const auto& p : pieces) {
    iov.push_back({frame.data() + from, p.frame_end - from});
    iov.push_back({const_cast<char*>(p.large->data()), p.large->size()});
    from = p.frame_end;
  }
  iov.push_back({frame.data() + from, frame.size() - from});
  size_t i = 0;
  while (i < iov.size()) {
    ssize_t n = ::writev(ctx_->fd, iov.data() + i, static_cast<int>(iov.size() - i));
    if (n < 0) {
      if (errno == EINTR) continue;
      broken_ = true;
      const char* why = (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out" : std::strerror(errno);
      return Status::Unavailable(endpoint_.ToString() + ": write: " + why);
    }
    // Skip what was written: whole pieces, then part of the next one.
    auto left = static_cast<size_t>(n);
    while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
    if (left > 0) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return Status::Ok();
}

Result<ReplyPtr> RespConnection::GetReply() {
  if (broken_) return Status::Unavailable(endpoint_.ToString() + ": connection is broken");
  // hiredis's redisGetReply, with the bytes fed to the reader counted: a reply not complete
  // after kMaxReplyBytes is refused rather than buffered further.
  void* reply = nullptr;
  t_refused_elements = -1;
  if (redisGetReplyFromReader(ctx_, &reply) != REDIS_OK) return ReaderError();
  if (reply != nullptr) return ReplyPtr(static_cast<redisReply*>(reply));
  int done = 0;
  while (!done) {
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) return IoError("write");
  }
  scratch_.resize(kScratchBytes);
  uint64_t fed = 0;
  while (reply == nullptr) {
    if (fed > kMaxReplyBytes) {
      broken_ = true;
      return Status::Unavailable(endpoint_.ToString() + ": reply: more than " +
                                 std::to_string(kMaxReplyBytes) + " bytes (refused)");
    }
    auto n = ReadSome(scratch_.data(), scratch_.size());
    if (!n.ok()) return n.status();
    fed += *n;
    if (redisReaderFeed(ctx_->reader, scratch_.data(), *n) != REDIS_OK) return IoError("reply");
    if (redisGetReplyFromReader(ctx_, &reply) != REDIS_OK) return ReaderError();
  }
  return ReplyPtr(static_cast<redisReply*>(reply));
}

Status RespConnection::ReaderError() {
  if (t_refused_elements >= 0) {
    broken_ = true;
    return Status::Unavailable(endpoint_.ToString() + ": reply: an array of " +
                               std::to_string(t_refused_elements) + " elements, more than " +
                               std::to_string(kMaxReplyElements) + " (refused)");
  }
  return IoError("reply");
}

Result<ReplyPtr> RespConnection::Command(const std::vector<RespArg>& args, BulkSink* sink) {
  if (Status st = Append(args); !st.ok()) return st;
  if (sink == nullptr) return GetReply();
  return GetReplyInto(*sink);
}

Result<size_t> RespConnection::ReadSome(void* dst, size_t len) {
  while (true) {
    const ssize_t n = ::read(ctx_->fd, dst, len);
    if (n > 0) return static_cast<size_t>(n);
    if (n < 0 && errno == EINTR) continue;
    broken_ = true;
    const char* why = n == 0                                        ? "connection closed"
                      : (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out"
                                                                  : std::strerror(errno);
    return Status::Unavailable(endpoint_.ToString() + ": reply: " + why);
  }
}

Result<ReplyPtr> RespConnection::GetReplyInto(BulkSink& sink) {
  sink.filled = false;
  sink.too_long = false;
  sink.size = 0;
  if (broken_) return Status::Unavailable(endpoint_.ToString() + ": connection is broken");
  redisReader* reader = ctx_->reader;
  // Bytes hiredis already read belong to a reply before this one: let it parse them all.
  if (reader->len > reader->pos || reader->ridx != -1) return GetReply();
  int done = 0;
  while (!done) {
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) return IoError("write");
  }
  // The reply's first line ("$<length>\r\n" for a value), and whatever arrived with it.
  scratch_.resize(kScratchBytes);
  size_t have = 0, line_end = 0;
  bool line = false;
  while (!line) {
    if (have == scratch_.size()) break;  // no first line is that long: hiredis will say why
    auto n = ReadSome(scratch_.data() + have, scratch_.size() - have);
    if (!n.ok()) return n.status();
    const size_t from = have > 0 ? have - 1 : 0;
    have += *n;
    for (size_t i = from; i + 1 < have; ++i) {
      if (scratch_[i] == '\r' && scratch_[i + 1] == '\n') {
        line = true;
        line_end = i;
        break;
      }
    }
  }
  // A value: "$" and its length, digits only (no sign: "$-1" is RESP2's nil).
  uint64_t len = 0;
  bool value = line && scratch_[0] == '$';
  if (value) {
    const char* end = scratch_.data() + line_end;
    const auto [ptr, ec] = std::from_chars(scratch_.data() + 1, end, len);
    value = ec == std::errc() && ptr == end;
  }
  if (!value) {
    // Everything else goes through hiredis's parser, from the bytes read so far.
    if (redisReaderFeed(reader, scratch_.data(), have) != REDIS_OK) return IoError("reply");
    return GetReply();
  }
  const size_t body = line_end + 2;
  const size_t buffered = have - body;
  if (len > sink.capacity) {
    // Longer than the room for it: never buffered (issue 27, finding 6).
    sink.too_long = true;
    sink.size = len;
    if (len - sink.capacity > kDrainBytes) {
      broken_ = true;  // not worth reading: the owner drops the connection
      return ReplyPtr();
    }
    const uint64_t need = len + 2;  // the value and its CRLF, read and discarded
    if (buffered > need) {
      if (redisReaderFeed(reader, scratch_.data() + body + need, buffered - need) != REDIS_OK) {
        return IoError("reply");
      }
      return ReplyPtr();
    }
    for (uint64_t got = buffered; got < need;) {
      auto n = ReadSome(scratch_.data(), static_cast<size_t>(std::min<uint64_t>(need - got, scratch_.size())));
      if (!n.ok()) return n.status();
      got += *n;
    }
    return ReplyPtr();
  }
  const size_t first = static_cast<size_t>(std::min<uint64_t>(buffered, len));
  if (first > 0) std::memcpy(sink.dst, scratch_.data() + body, first);
  uint64_t got = first;
  while (got < len) {
    auto n = ReadSome(sink.dst + got, static_cast<size_t>(len - got));
    if (!n.ok()) return n.status();
    got += *n;
  }
  // The value's closing CRLF; bytes after it (none while commands go one at a time) are
  // handed to hiredis so that the next reply starts where it should.
  const char* tail = scratch_.data() + body + first;
  const size_t tail_len = buffered - first;
  char crlf[2];
  size_t crlf_have = std::min<size_t>(tail_len, 2);
  std::memcpy(crlf, tail, crlf_have);
  while (crlf_have < 2) {
    auto n = ReadSome(crlf + crlf_have, 2 - crlf_have);
    if (!n.ok()) return n.status();
    crlf_have += *n;
  }
  if (crlf[0] != '\r' || crlf[1] != '\n') {
    broken_ = true;
    return Status::Unavailable(endpoint_.ToString() + ": reply: a value of " +
                               std::to_string(len) + " bytes does not end in CRLF");
  }
  if (tail_len > 2 && redisReaderFeed(reader, tail + 2, tail_len - 2) != REDIS_OK) {
    return IoError("reply");
  }
  sink.filled = true;
  sink.size = len;
  return ReplyPtr();
}

}  // namespace kvd::l2
