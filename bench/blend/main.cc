// kvd-blend-bench: `kvd-blend-bench matcher [...]`, `kvd-blend-bench scatter [...]`, or both
// with no suite named. Each suite's own flags follow its name (--help lists them).
#include <cstdio>
#include <cstring>

#include "suites.h"

int main(int argc, char** argv) {
  using namespace kvd::bench::blend;
  if (argc < 2) {
    const int rc = RunMatcherSuite(0, nullptr);
    return rc != 0 ? rc : RunScatterSuite(0, nullptr);
  }
  if (std::strcmp(argv[1], "matcher") == 0) return RunMatcherSuite(argc - 1, argv + 1);
  if (std::strcmp(argv[1], "scatter") == 0) return RunScatterSuite(argc - 1, argv + 1);
  std::fprintf(stderr, "usage: kvd-blend-bench [matcher|scatter] [suite flags]\n");
  return 2;
}
