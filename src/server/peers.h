// The server's P2P side (docs/p2p.md): a p2p::PeerNode built from the --p2p-* flags. The node
// publishes what L1 completes, serves peers' reads of L1, and gives the TierSet its read-only
// peer tier (placed after the --l2-adapter tiers).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "p2p/peer_node.h"
#include "server/config.h"

namespace kvd::server {

// Null (and OK) when P2P is off. InvalidArgument for a malformed URL or an unreadable or
// malformed secret file; the UCX listener's and the directory's errors as they come
// (P2pAgent::Start): a directory that cannot be reached at startup is an error.
// `on_loaded` hears the chunks each load from a peer brought in (PeerNode::Options).
Result<std::unique_ptr<p2p::PeerNode>> StartPeerNode(
    const ServerConfig& config,
    std::function<void(std::span<const l1::ChunkKey>)> on_loaded = nullptr);

// "host:port" (IPv6 in brackets) into its parts; InvalidArgument naming `flag` otherwise.
Result<std::pair<std::string, int>> ParseHostPort(const std::string& flag, const std::string& text);

// The parts of --p2p-directory's redis://[[user]:password@]host:port[/db] (valkey:// too), or
// redis-cluster://[[user]:password@]host:port (valkey-cluster://): a seed of a Cluster.
struct DirectoryUrl {
  std::string host;
  int port = 0;
  std::string username, password;
  int64_t database_id = -1;
  bool cluster = false;
};
Result<DirectoryUrl> ParseDirectoryUrl(const std::string& text);

}  // namespace kvd::server
