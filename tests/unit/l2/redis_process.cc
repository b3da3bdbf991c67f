#include "redis_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace kvd::l2::testing {
namespace {

bool PortFree(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

std::string ReplyText(const redisReply* r) {
  if (!r) return "";
  switch (r->type) {
    case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
    case REDIS_REPLY_NIL: return "(nil)";
    case REDIS_REPLY_ARRAY: {
      std::string s;
      for (size_t i = 0; i < r->elements; ++i) {
        s += i ? "\n" : "";
        s += ReplyText(r->element[i]);
      }
      return s;
    }
    default: return r->str ? std::string(r->str, r->len) : "";
  }
}

int RunAndWait(const std::vector<std::string>& argv) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 1);
    ::dup2(null, 2);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

bool RedisInstalled() {
  return ::access("/usr/bin/redis-server", X_OK) == 0 && ::access("/usr/bin/redis-cli", X_OK) == 0;
}

int ListenLoopback(int backlog, int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd, backlog) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

int FreePort(bool bus) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(s);
    int port = ntohs(a.sin_port);
    if (!bus) return port;
    if (port < 55000 && PortFree(port + 10000)) return port;
  }
  return 0;
}

RedisProcess::~RedisProcess() {
  Stop();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

Status RedisProcess::Start(int port, bool cluster, std::vector<std::string> extra) {
  if (!RedisInstalled()) {
    return Status::FailedPrecondition("redis-server is not installed (run scripts/install-deps.sh)");
  }
  if (port == 0) port = port_ != 0 ? port_ : FreePort(cluster);
  port_ = port;
  cluster_ = cluster;
  if (!extra.empty()) extra_ = std::move(extra);
  if (dir_.empty()) {
    char tmpl[] = "/tmp/kvd-redis-XXXXXX";
    if (!::mkdtemp(tmpl)) return Status::Internal("mkdtemp failed");
    dir_ = tmpl;
  }
  std::vector<std::string> argv = {"/usr/bin/redis-server", "--port", std::to_string(port),
                                   "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                   "--dir", dir_, "--protected-mode", "no", "--daemonize", "no",
                                   "--loglevel", "warning", "--logfile", dir_ + "/redis.log"};
  if (cluster) {
    argv.insert(argv.end(), {"--cluster-enabled", "yes", "--cluster-config-file",
                             dir_ + "/nodes.conf", "--cluster-node-timeout", "2000",
                             "--cluster-require-full-coverage", "no"});
  }
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  pid_t pid = ::fork();
  if (pid < 0) return Status::Internal("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Internal("redis-server exited at startup (port " + std::to_string(port) + ")");
    }
    auto r = Cli({"PING"});
    if (r.ok() && *r == "PONG") return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Kill();
  return Status::Internal("redis-server did not answer PING");
}

void RedisProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void RedisProcess::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 500; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Kill();
}

Result<std::string> RedisProcess::Cli(const std::vector<std::string>& args) const {
  RespConnectOptions o;
  o.connect_timeout_s = 1;
  o.request_timeout_s = 5;
  auto c = RespConnection::Connect(endpoint(), o);
  if (!c.ok()) return c.status();
  std::vector<RespArg> a(args.begin(), args.end());
  auto r = (*c)->Command(a);
  if (!r.ok()) return r.status();
  return ReplyText(r->get());
}

RedisCluster::~RedisCluster() {
  for (auto& n : nodes_) n.Stop();
}

Status RedisCluster::Start() {
  for (auto& n : nodes_) {
    KVD_RETURN_IF_ERROR(n.Start(0, true));
  }
  std::vector<std::string> argv = {"/usr/bin/redis-cli", "--cluster", "create"};
  for (auto& n : nodes_) argv.push_back("127.0.0.1:" + std::to_string(n.port()));
  argv.insert(argv.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  if (int rc = RunAndWait(argv); rc != 0) {
    return Status::Internal("redis-cli --cluster create failed with " + std::to_string(rc));
  }
  return WaitOk();
}

Status RedisCluster::WaitOk(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    bool ok = true;
    for (auto& n : nodes_) {
      if (!n.running()) continue;
      auto r = n.Cli({"CLUSTER", "INFO"});
      ok = ok && r.ok() && r->find("cluster_state:ok") != std::string::npos;
    }
    if (ok) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Internal("cluster did not reach cluster_state:ok");
}

std::string RedisCluster::StartupNodes() const {
  std::string s;
  for (const auto& n : nodes_) {
    s += s.empty() ? "" : ",";
    s += "127.0.0.1:" + std::to_string(n.port());
  }
  return s;
}

}  // namespace kvd::l2::testing
