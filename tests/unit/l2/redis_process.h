// RedisProcess / RedisCluster: real Debian redis-server processes on free loopback ports for
// tests, started and stopped (or killed) by the test. A cluster is three masters joined with
// `redis-cli --cluster create`. Data lives in a fresh temporary directory per process.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "l2/resp_connection.h"

namespace kvd::l2::testing {

// A free TCP port on 127.0.0.1 (and, with bus, port + 10000 free too).
int FreePort(bool bus = false);
// A socket listening on 127.0.0.1 at a free port (for fake servers): its descriptor, or -1,
// and the port in *port.
int ListenLoopback(int backlog, int* port);

class RedisProcess {
 public:
  RedisProcess() = default;
  ~RedisProcess();
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  // Starts redis-server on 127.0.0.1:port (0: pick one) and waits until it answers PING.
  // `extra` are further "--name value" arguments.
  Status Start(int port = 0, bool cluster = false, std::vector<std::string> extra = {});
  // Starts it again on the same port, directory and mode (after Kill or Stop).
  Status Restart() { return Start(port_, cluster_); }
  void Kill();        // SIGKILL, as a crashed node
  void Stop();        // SIGTERM and wait
  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  RespEndpoint endpoint() const { return {"127.0.0.1", port_}; }
  // One command on a fresh connection; the reply as text (integers as decimal).
  Result<std::string> Cli(const std::vector<std::string>& args) const;

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool cluster_ = false;
  std::vector<std::string> extra_;
  std::string dir_;
};

class RedisCluster {
 public:
  ~RedisCluster();
  // Three masters, all 16384 slots assigned, cluster_state:ok on every node.
  Status Start();
  RedisProcess& node(int i) { return nodes_[i]; }
  std::string StartupNodes() const;  // "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
  // Waits until every running node reports cluster_state:ok.
  Status WaitOk(double seconds = 30);

 private:
  RedisProcess nodes_[3];
};

// True when redis-server and redis-cli are installed (scripts/install-deps.sh installs them).
bool RedisInstalled();

}  // namespace kvd::l2::testing
