// Test helper: runs out of file descriptors on purpose, for the tests of what a listener does
// at the limit (accept failing with EMFILE). Header-only.
//
// ExhaustDescriptors lowers this process's soft RLIMIT_NOFILE to a few descriptors above the
// lowest free one and fills every descriptor below it with dup(0), leaving `leave_free` of
// them free; the destructor closes the fillers and restores the limit. The limit is
// process-wide: every thread of the test (a server under test included) is short of
// descriptors while one lives. Descriptors a test needs later (a socket to connect) must be
// opened before.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <vector>

namespace kvd::testing_util {

class ExhaustDescriptors {
 public:
  explicit ExhaustDescriptors(int leave_free = 0) {
    ok_ = getrlimit(RLIMIT_NOFILE, &old_) == 0;
    if (!ok_) return;
    const int probe = dup(0);  // the lowest free descriptor
    close(probe);
    rlimit low = old_;
    low.rlim_cur = static_cast<rlim_t>(probe + 8);
    ok_ = setrlimit(RLIMIT_NOFILE, &low) == 0;
    if (!ok_) return;
    for (int fd; (fd = dup(0)) >= 0;) fillers_.push_back(fd);
    for (int i = 0; i < leave_free && !fillers_.empty(); ++i) {
      close(fillers_.back());
      fillers_.pop_back();
    }
  }
  ~ExhaustDescriptors() {
    for (int fd : fillers_) close(fd);
    if (ok_) setrlimit(RLIMIT_NOFILE, &old_);
  }
  ExhaustDescriptors(const ExhaustDescriptors&) = delete;
  ExhaustDescriptors& operator=(const ExhaustDescriptors&) = delete;

  // False when the limit could not be read or lowered (nothing was changed then).
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
  std::vector<int> fillers_;
};

}  // namespace kvd::testing_util
