// ReclaimDeadKvdSegments: at startup, removes the L1 segments that kvd processes which are
// gone left in /dev/shm (issue 27, finding 10: after kill -9 or an OOM kill the default-named
// segment kvd_l1_pool_<pid> stayed, up to the whole L1, and a restarted kvd may not find room
// for its own).
//
// A segment is removed only when all of these hold, so a segment in use is never touched:
//   - its name is kvd_l1_pool_<pid> (kvd's default name; a named --shm-name segment is
//     handled by the startup check that replaces or refuses it);
//   - it is a regular file owned by the uid kvd runs as (lstat: links are not followed);
//   - no process <pid> exists, or the one that does is not kvd (the pid was reused);
//   - no process maps it (every /proc/<pid>/maps this user can read is searched: an
//     engine-driven worker may still map a dead kvd's pool; then it stays).
// Returns the number of segments and bytes removed; logs one line when any were.
// Reads /proc and /dev/shm only; called once, before the L1 pool is created.
#pragma once

#include <cstdint>
#include <string>

namespace kvd::cli {

struct Reclaimed {
  uint64_t segments = 0;
  uint64_t bytes = 0;
};

// `shm_dir` and `proc_dir` are parameters for tests ("/dev/shm" and "/proc" in kvd).
Reclaimed ReclaimDeadKvdSegments(const std::string& shm_dir = "/dev/shm",
                                 const std::string& proc_dir = "/proc");

}  // namespace kvd::cli
