// Must compile under clang with -Werror=thread-safety: the same read as unguarded_read.cc,
// with the mutex held. CMakeLists.txt checks both, so a failure of the negative check means
// the analysis rejected the violation, not that the file failed for another reason.
#include "common/mutex.h"

namespace {

class Counter {
 public:
  int Read() const {
    kvd::MutexLock lock(&mu_);
    return value_;
  }

 private:
  mutable kvd::Mutex mu_;
  int value_ KVD_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() { return Counter().Read(); }
