// The suites of kvd-bench (bench/suite_*.cc), each returning its results as JSON.
#pragma once

#include "bench_models.h"

namespace kvd::bench {

Json RunControl(zmq::context_t& ctx, const Options& o, int64_t chunk);
Json RunData(zmq::context_t& ctx, const Options& o, int64_t chunk);
Json RunScale(zmq::context_t& ctx, const Options& o, int64_t chunk);
Json RunStartup(zmq::context_t& ctx, const Options& o);
Json RunHash(const Options& o, int64_t chunk);

}  // namespace kvd::bench
