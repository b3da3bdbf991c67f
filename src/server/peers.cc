#include "server/peers.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <fstream>
#include <random>

namespace kvd::server {
namespace {

Result<int64_t> ParseNumber(const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < lo || v > hi) {
    return Status::InvalidArgument("'" + text + "' is not a number in " + std::to_string(lo) +
                                   ".." + std::to_string(hi));
  }
  return v;
}

Result<std::string> ReadSecret(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Status::InvalidArgument("--p2p-secret-file " + path + ": cannot be read");
  std::string line;
  std::getline(f, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty() || line.size() > 4096) {
    return Status::InvalidArgument("--p2p-secret-file " + path +
                                   ": its first line must hold 1 to 4096 bytes");
  }
  return line;
}

// A random non-zero incarnation: a restarted node is never taken for its earlier life.
uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

}  // namespace

Result<std::pair<std::string, int>> ParseHostPort(const std::string& flag, const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument(flag + " " + text + ": not host:port");
  }
  std::string host = text.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) return Status::InvalidArgument(flag + " " + text + ": no host");
  auto port = ParseNumber(text.substr(colon + 1), 1, 65535);
  if (!port.ok()) return Status::InvalidArgument(flag + " " + text + ": port " + port.status().message());
  return std::make_pair(host, static_cast<int>(*port));
}

Result<DirectoryUrl> ParseDirectoryUrl(const std::string& text) {
  const std::string flag = "--p2p-directory";
  std::string rest;
  DirectoryUrl url;
  for (const char* scheme : {"redis://", "valkey://", "redis-cluster://", "valkey-cluster://"}) {
    if (text.rfind(scheme, 0) == 0) {
      rest = text.substr(std::string(scheme).size());
      url.cluster = std::string(scheme).find("-cluster") != std::string::npos;
    }
  }
  if (rest.empty()) {
    return Status::InvalidArgument(flag + ": expected redis://[[user]:password@]host:port[/db] "
                                   "(redis-cluster://host:port for a Cluster)");
  }
  if (const size_t at = rest.rfind('@'); at != std::string::npos) {
    const std::string auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = auth.find(':');
    if (colon == std::string::npos) {
      url.password = auth;
    } else {
      url.username = auth.substr(0, colon);
      url.password = auth.substr(colon + 1);
    }
  }
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    if (url.cluster) return Status::InvalidArgument(flag + ": a Cluster has no database number");
    auto db = ParseNumber(rest.substr(slash + 1), 0, 1 << 20);
    if (!db.ok()) return Status::InvalidArgument(flag + ": database " + db.status().message());
    url.database_id = *db;
    rest = rest.substr(0, slash);
  }
  auto hp = ParseHostPort(flag, rest);
  if (!hp.ok()) return Status::InvalidArgument(flag + ": expected host:port after the scheme");
  url.host = hp->first;
  url.port = hp->second;
  return url;
}

Result<std::unique_ptr<p2p::PeerNode>> StartPeerNode(
    const ServerConfig& config, std::function<void(std::span<const l1::ChunkKey>)> on_loaded) {
  if (!config.p2p()) return std::unique_ptr<p2p::PeerNode>();
  if (config.p2p_transfer_engine != "ucx") {
    return Status::InvalidArgument("--p2p-transfer-engine " + config.p2p_transfer_engine +
                                   ": kvd moves P2P data with ucx only");
  }
  auto advertise = ParseHostPort("--p2p-advertise-url", config.p2p_advertise_url);
  if (!advertise.ok()) return advertise.status();
  auto listen = ParseHostPort("--p2p-listen-url", config.p2p_listen_url.empty()
                                                      ? config.p2p_advertise_url
                                                      : config.p2p_listen_url);
  if (!listen.ok()) return listen.status();
  auto directory = ParseDirectoryUrl(config.p2p_directory);
  if (!directory.ok()) return directory.status();
  auto secret = ReadSecret(config.p2p_secret_file);
  if (!secret.ok()) return secret.status();

  p2p::PeerNode::Options o;
  o.lookup_timeout_s = config.p2p_lookup_timeout_seconds;
  o.load_timeout_s = config.p2p_load_timeout_seconds;
  o.on_loaded = std::move(on_loaded);
  o.agent.ucx.listen_host = listen->first;
  o.agent.ucx.listen_port = listen->second;
  o.agent.ucx.tls = config.p2p_ucx_tls;
  o.agent.ucx.secret = std::move(secret).value();
  o.agent.directory.endpoint = {directory->host, directory->port};
  o.agent.directory.connect.username = directory->username;
  o.agent.directory.connect.password = directory->password;
  o.agent.directory.connect.database_id = directory->database_id;
  o.agent.directory.cluster = directory->cluster;
  o.agent.directory.connect.request_timeout_s = config.p2p_lookup_timeout_seconds;
  o.agent.directory.connect.connect_timeout_s = std::min(config.p2p_lookup_timeout_seconds, 10.0);
  o.agent.self.node = config.p2p_advertise_url;  // unique in the fleet: where peers reach it
  o.agent.self.incarnation = NewIncarnation();
  o.agent.self.url = config.p2p_advertise_url;
  auto node = p2p::PeerNode::Start(std::move(o));
  if (!node.ok()) {
    return Status::Unavailable("P2P could not start (directory " + directory->host + ":" +
                               std::to_string(directory->port) + ", listener " + listen->first +
                               ":" + std::to_string(listen->second) + "): " +
                               node.status().message());
  }
  spdlog::info("p2p: node {} (incarnation {:x}) listening on {}:{}, directory {}{}:{}{}",
               config.p2p_advertise_url, (*node)->self().incarnation, listen->first, listen->second,
               directory->cluster ? "Cluster seed " : "", directory->host, directory->port,
               config.p2p_ucx_tls.empty() ? "" : ", UCX_TLS " + config.p2p_ucx_tls);
  return node;
}

}  // namespace kvd::server
