// Must NOT compile under clang with -Werror=thread-safety: it reads a KVD_GUARDED_BY field
// without holding its mutex. CMakeLists.txt compiles it at configure time (try_compile) and
// stops when it compiles, so a build that claims to check the lock annotations really does.
#include "common/mutex.h"

namespace {

class Counter {
 public:
  int Read() const { return value_; }  // the violation: mu_ is not held

 private:
  mutable kvd::Mutex mu_;
  int value_ KVD_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() { return Counter().Read(); }
