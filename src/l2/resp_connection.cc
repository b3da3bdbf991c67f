#include "l2/resp_connection.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

namespace kvd::l2 {
namespace {
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

Status RespConnection::IoError(const char* what) {
  broken_ = true;
  return Status::Unavailable(endpoint_.ToString() + ": " + what + ": " +
                             (ctx_ && ctx_->err ? ctx_->errstr : "connection lost"));
}

Status RespConnection::Append(const std::vector<RespArg>& args) {
  if (broken_) return Status::Unavailable(endpoint_.ToString() + ": connection is broken");
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

Result<ReplyPtr> RespConnection::GetReply() {
  if (broken_) return Status::Unavailable(endpoint_.ToString() + ": connection is broken");
  void* reply = nullptr;
  if (redisGetReply(ctx_, &reply) != REDIS_OK || reply == nullptr) return IoError("reply");
  return ReplyPtr(static_cast<redisReply*>(reply));
}

Result<ReplyPtr> RespConnection::Command(const std::vector<RespArg>& args) {
  if (Status st = Append(args); !st.ok()) return st;
  return GetReply();
}

}  // namespace kvd::l2
