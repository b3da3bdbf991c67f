// kvd-blend-bench's suites: each prints one table of measured rates and the ratio to its
// floor measured in the same run (docs/benchmarks.md, "CacheBlend").
#pragma once

namespace kvd::bench::blend {

// Matcher probe rate: token positions probed per second on one core, against the rate of
// the rolling hash alone over the same tokens.
int RunMatcherSuite(int argc, char** argv);

// CPU scatter + re-RoPE into paged layouts, against a memcpy of the same bytes.
int RunScatterSuite(int argc, char** argv);

}  // namespace kvd::bench::blend
