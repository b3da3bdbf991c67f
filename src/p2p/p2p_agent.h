// P2pAgent: one kvd's P2P side, run by two threads of its own, so that the request path only
// queues work: the UCX thread owns the UcxNode (it serves peers' asks and runs this node's
// reads), and the directory thread owns the talk with the FleetDirectory (heartbeats, and the
// publishes and withdrawals the request path queued, sent in batches).
//
// THREADS. Every public method may be called from any thread. `serve` (Options) runs on the
// UCX thread. Read blocks its caller until the UCX thread has run the read (or the deadline
// passed); Lookup runs on the caller's thread (FleetDirectory is thread-safe). Destruction
// stops both threads: reads still queued answer Unavailable, queued publishes are dropped.
//
// OWNERSHIP. The agent owns both threads, the UcxNode, its regions and peers (one UcxPeer per
// peer address, made on first use and replaced when broken) and the FleetDirectory.
//
// FAILURES. The directory being down never blocks the request path: Publish/Withdraw only
// queue (at most Options::max_queued_updates; more are dropped and counted), a failed flush
// keeps its batch for the next one (in order), and Lookup answers Unavailable (the caller
// treats it as "no peer has it"). A peer that fails or times out costs one read.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "p2p/fleet_directory.h"
#include "p2p/ucx_transport.h"

namespace kvd::p2p {

class P2pAgent {
 public:
  struct Options {
    UcxNode::Options ucx;                // listen address, transports, serve, secret, timeouts
    FleetDirectory::Options directory;
    FleetDirectory::Self self;           // self.url: where peers reach ucx (host:port)
    double flush_interval_s = 0.05;      // how often queued updates go to the directory
    size_t max_queued_updates = 1 << 20;
  };
  struct Stats {
    uint64_t updates_queued = 0;
    uint64_t updates_sent = 0;
    uint64_t updates_dropped = 0;      // the queue was full
    uint64_t directory_failures = 0;   // heartbeats and flushes that failed
    uint64_t reads = 0;
    uint64_t read_failures = 0;        // reads that did not complete every item
    uint64_t bytes_read = 0;
    uint64_t refused_asks = 0;         // peers' asks without the fleet's secret (UcxNode)
    uint64_t accepted_peers = 0;       // connections peers hold to this node now
  };

  // Starts the UCX node (listening as options.ucx says) and connects the directory. When
  // self.url is empty it becomes "<listen host>:<the port bound>". Errors: as UcxNode::Create
  // and FleetDirectory::Connect.
  static Result<std::unique_ptr<P2pAgent>> Start(Options options);
  ~P2pAgent();
  P2pAgent(const P2pAgent&) = delete;
  P2pAgent& operator=(const P2pAgent&) = delete;

  const FleetDirectory::Self& self() const { return self_; }

  // Registers memory (kvd's L1 pool) with the UCX node: a destination of reads, and memory
  // `serve` answers from. Call before the first read or answer that uses it.
  Status RegisterMemory(void* base, size_t length);
  // Queued for the directory thread (see FAILURES).
  void Publish(std::vector<std::string> keys);
  void Withdraw(std::vector<std::string> keys);
  // The directory's live owners of each key (FleetDirectory::Lookup).
  Result<std::vector<std::vector<FleetDirectory::Owner>>> Lookup(const std::vector<std::string>& keys);
  // A clean shutdown's last word to the directory: stops the directory thread (no heartbeat
  // or update is sent after this; queued ones are dropped), then FleetDirectory::Leave on the
  // caller's thread, so this node's entries die at once instead of with its heartbeat. Reads
  // and serving go on until the agent is destroyed. Call once, not from the directory thread.
  Status Leave();
  // FleetDirectory::Forget, on the caller's thread: `owner` no longer holds `key`.
  Status Forget(const std::string& key, const FleetDirectory::Owner& owner);
  // Reads `items` from the peer at `url` ("host:port") on the UCX thread (UcxPeer::Read).
  ReadAnswer Read(const std::string& url, std::vector<ReadItem> items, Deadline deadline);
  // Sends what is queued now and waits until the directory thread has tried (tests, shutdown).
  Status Flush();

  Stats stats() const;

 private:
  struct Update {
    bool publish;
    std::string key;
  };
  explicit P2pAgent(Options options);
  // Publish and Withdraw: appends to updates_ in order, up to max_queued_updates.
  void Queue(bool publish, std::vector<std::string> keys);
  // Runs `job` on the UCX thread and waits for it (Unavailable when the agent is stopping).
  Status OnUcxThread(std::function<void()> job);
  void RunUcx(std::promise<Status>* started);
  void RunDirectory();
  // Sends `batch` in order (runs of publishes, runs of withdrawals); how many were sent.
  size_t SendUpdates(const std::vector<Update>& batch, Status& status);

  Options options_;
  FleetDirectory::Self self_;
  std::unique_ptr<FleetDirectory> directory_;  // thread-safe itself

  // The UCX thread's own (touched by no other thread).
  std::unique_ptr<UcxNode> node_;
  std::vector<std::unique_ptr<UcxRegion>> regions_;
  std::unordered_map<std::string, std::unique_ptr<UcxPeer>> peers_;  // by url
  uint64_t stats_refused_ = 0, stats_accepted_ = 0;  // what stats_ last heard of node_

  mutable Mutex mu_;
  CondVar ucx_wake_;        // a job was queued, or stop
  CondVar directory_wake_;  // a flush was asked for, or stop
  CondVar done_;            // a job finished, or a flush did
  bool stop_ KVD_GUARDED_BY(mu_) = false;
  bool left_ KVD_GUARDED_BY(mu_) = false;  // Leave() ran: the directory thread is done
  std::deque<std::pair<uint64_t, std::function<void()>>> jobs_ KVD_GUARDED_BY(mu_);  // id, job
  uint64_t next_job_ KVD_GUARDED_BY(mu_) = 0;
  std::vector<Update> updates_ KVD_GUARDED_BY(mu_);
  uint64_t flush_asked_ KVD_GUARDED_BY(mu_) = 0;
  uint64_t flush_done_ KVD_GUARDED_BY(mu_) = 0;
  Status last_flush_ KVD_GUARDED_BY(mu_);
  Stats stats_ KVD_GUARDED_BY(mu_);

  std::thread ucx_thread_;
  std::thread directory_thread_;
};

}  // namespace kvd::p2p
