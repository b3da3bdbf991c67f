// Prometheus text exposition (format 0.0.4) of a Snapshot's registry families, whatever
// their owners registered, in registration order. Pure functions: no state, no threads.
// The owners name their families after LMCache's `lmcache_mp_*` where LMCache 0.5.6 exports
// a counterpart (so existing dashboards keep working); kvd-only series are `kvd_*`.
// docs/metrics.md lists every series.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "http/stats_source.h"

namespace kvd::http {

std::string RenderPrometheus(const Snapshot& s);

// A label value as the text format (0.0.4) needs it: backslash, double quote and line feed
// escaped (\\, \", \n); bytes that are not well-formed UTF-8 replaced by U+FFFD.
std::string EscapeLabelValue(std::string_view v);

// Approximate quantile q (0..1) of a histogram with the given upper bounds and
// per-bucket (not cumulative) counts, interpolating linearly inside the bucket. 0 when
// empty; the last finite bound when the quantile falls in the +Inf bucket.
double HistogramQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& buckets,
                         double q);

}  // namespace kvd::http
