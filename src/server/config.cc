#include "server/config.h"

#include <sstream>

namespace kvd::server {

std::string ServerConfig::ZmqEndpoint() const {
  std::string h = host;
  // ZMQ binds to interfaces or addresses; "localhost" is not resolved by bind.
  if (h == "localhost") h = "127.0.0.1";
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
  return "tcp://" + h + ":" + std::to_string(port);
}

std::string ServerConfig::Describe() const {
  std::ostringstream os;
  os << "host=" << host << " port=" << port << " chunk_size=" << chunk_size
     << " l1_size_gb=" << l1_size_gb << " l1_align_bytes=" << l1_align_bytes
     << " l1_use_lazy=" << (l1_use_lazy ? "true" : "false")
     << " l1_init_size_gb=" << l1_init_size_gb
     << " l1_use_hugepages=" << (l1_use_hugepages ? "true" : "false")
     << " l1_populate=" << l1_populate
     << " eviction_policy=" << eviction_policy
     << " eviction_trigger_watermark=" << eviction_trigger_watermark
     << " eviction_ratio=" << eviction_ratio << " l1_read_ttl_seconds=" << l1_read_ttl_seconds
     << " l1_write_ttl_seconds=" << l1_write_ttl_seconds << " max_workers=" << max_workers
     << " hash_algorithm=" << hash_algorithm << " shm_name=" << shm_name
     << " null_block_id=" << null_block_id
     << " worker_reap_timeout_seconds=" << worker_reap_timeout_seconds
     << " worker_registration_grace_seconds=" << worker_registration_grace_seconds
     << " log_level=" << log_level;
  return os.str();
}

}  // namespace kvd::server
