#include "http/prometheus.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace kvd::http {
namespace {

class Writer {
 public:
  void Header(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void Value(const std::string& name_and_labels, uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), " %" PRIu64 "\n", v);
    out_ += name_and_labels;
    out_ += buf;
  }
  void Value(const std::string& name_and_labels, double v) {
    char buf[48];
    if (std::isnan(v)) {
      std::snprintf(buf, sizeof(buf), " NaN\n");
    } else if (std::isinf(v)) {
      std::snprintf(buf, sizeof(buf), v > 0 ? " +Inf\n" : " -Inf\n");
    } else {
      std::snprintf(buf, sizeof(buf), " %.17g\n", v);
    }
    out_ += name_and_labels;
    out_ += buf;
  }
  // One metric without labels.
  void Counter(const char* name, const char* help, uint64_t v) {
    Header(name, "counter", help);
    Value(name, v);
  }
  void Gauge(const char* name, const char* help, double v) {
    Header(name, "gauge", help);
    Value(name, v);
  }
  void Gauge(const char* name, const char* help, uint64_t v) {
    Header(name, "gauge", help);
    Value(name, v);
  }
  std::string Take() { return std::move(out_); }
  static std::string EscapeLabel(const std::string& v) { return EscapeLabelValue(v); }

 private:
  std::string out_;
};

std::string Escape(const std::string& v) { return EscapeLabelValue(v); }

std::string Bound(double b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", b);
  return buf;
}

std::string OneDecimal(double b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", b);
  return buf;
}

// The metrics registry's families (common/metrics.h), whatever their owner registered.
void RenderFamilies(Writer& w, const std::vector<metrics::FamilySnapshot>& families) {
  for (const auto& f : families) {
    const metrics::FamilyDesc& d = f.desc;
    w.Header(d.name.c_str(), metrics::KindName(d.kind), d.help.c_str());
    for (const auto& series : f.series) {
      std::string labels;
      for (size_t i = 0; i < d.label_names.size() && i < series.label_values.size(); ++i) {
        labels += labels.empty() ? "" : ",";
        labels += d.label_names[i] + "=\"" + Escape(series.label_values[i]) + "\"";
      }
      if (d.kind != metrics::Kind::kHistogram) {
        w.Value(labels.empty() ? d.name : d.name + "{" + labels + "}", series.value);
        continue;
      }
      const std::string sep = labels.empty() ? "" : ",";
      uint64_t cum = 0;
      for (size_t i = 0; i < series.buckets.size(); ++i) {
        cum += series.buckets[i];
        const std::string le = i >= d.bounds.size() ? "+Inf"
                               : d.one_decimal_bounds ? OneDecimal(d.bounds[i])
                                                      : Bound(d.bounds[i]);
        w.Value(d.name + "_bucket{" + labels + sep + "le=\"" + le + "\"}", cum);
      }
      const std::string suffix = labels.empty() ? "" : "{" + labels + "}";
      w.Value(d.name + "_sum" + suffix, series.sum);
      w.Value(d.name + "_count" + suffix, cum);
    }
  }
}

}  // namespace

std::string EscapeLabelValue(std::string_view v) {
  std::string o;
  o.reserve(v.size());
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  const size_t n = v.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c == '\\' || c == '"') {
        o += '\\';
        o += static_cast<char>(c);
      } else if (c == '\n') {
        o += "\\n";
      } else {
        o += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence is copied; anything else becomes U+FFFD, one byte at a
    // time (the exposition format requires UTF-8 label values).
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // no overlong forms
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;  // nothing past U+10FFFF
    }
    bool ok = len > 0 && i + len <= n && p[i + 1] >= lo && p[i + 1] <= hi;
    for (size_t k = 2; ok && k < len; ++k) ok = p[i + k] >= 0x80 && p[i + k] <= 0xbf;
    if (ok) {
      o.append(v.substr(i, len));
      i += len;
    } else {
      o += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return o;
}

double HistogramQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& buckets,
                         double q) {
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;
  if (total == 0 || bounds.empty()) return 0;
  const double rank = q * static_cast<double>(total);
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] == 0) continue;
    if (static_cast<double>(seen + buckets[i]) >= rank) {
      if (i >= bounds.size()) return bounds.back();
      const double lo = i == 0 ? 0.0 : bounds[i - 1];
      const double hi = bounds[i];
      const double frac = (rank - static_cast<double>(seen)) / static_cast<double>(buckets[i]);
      return lo + (hi - lo) * std::clamp(frac, 0.0, 1.0);
    }
    seen += buckets[i];
  }
  return bounds.back();
}

std::string RenderPrometheus(const Snapshot& s, const std::string& version) {
  Writer w;
  const CacheCounters& c = s.counters;

  // --- LMCache counterparts (lmcache 0.5.6 `lmcache server` names and labels) ---
  w.Counter("lmcache_mp_l1_write_chunks_total", "Chunk objects written into L1.",
            c.stored_chunks);
  w.Counter("lmcache_mp_l1_read_chunks_total", "Chunk objects read from L1.", c.retrieved_chunks);
  w.Counter("lmcache_mp_l1_evicted_chunks_total", "Chunk entries evicted from L1.",
            s.l1.evictions);
  w.Gauge("lmcache_mp_l1_memory_usage_bytes", "Bytes of L1 in use.", s.l1.used_bytes);
  w.Gauge("lmcache_mp_l1_usage_ratio", "Fraction of L1 in use.",
          s.l1.capacity_bytes ? static_cast<double>(s.l1.used_bytes) /
                                    static_cast<double>(s.l1.capacity_bytes)
                              : 0.0);

  // --- kvd series ---
  w.Header("kvd_build_info", "gauge", "kvd version (value is always 1).");
  w.Value("kvd_build_info{version=\"" + Escape(version) + "\",lmcache_protocol=\"0.5.6\"}",
          uint64_t{1});
  w.Gauge("kvd_uptime_seconds", "Seconds since kvd started.", s.uptime_seconds);
  w.Counter("kvd_stored_bytes_total", "Bytes written into L1 by stores.", c.stored_bytes);
  w.Counter("kvd_retrieved_bytes_total", "Bytes read from L1 by retrieves.", c.retrieved_bytes);
  w.Counter("kvd_store_failures_total", "Store requests that failed.", c.store_failures);
  w.Counter("kvd_retrieve_failures_total", "Retrieve requests that failed.",
            c.retrieve_failures);
  w.Gauge("kvd_l1_capacity_bytes", "L1 capacity in bytes.", s.l1.capacity_bytes);
  w.Gauge("kvd_l1_entries", "Chunk entries in L1.", s.l1.entries);
  w.Gauge("kvd_l1_locked_entries", "L1 entries that cannot be evicted now (locked or pinned).",
          s.l1.locked_entries);
  w.Gauge("kvd_l1_pinned_objects", "L1 objects pinned by in-flight copies.",
          s.l1.pinned_objects);
  w.Counter("kvd_l1_evicted_bytes_total", "Bytes freed by L1 eviction.", s.l1.evicted_bytes);
  w.Gauge("kvd_l1_lookup_locks", "Lookup requests holding read locks on L1 chunks.",
          s.l1.lookup_locks);
  w.Counter("kvd_l1_lookup_locks_shed_total",
            "Lookup read locks released before their TTL because the read-lock bound was "
            "reached (the oldest first).",
            s.l1.shed_lookup_locks);
  w.Gauge("kvd_l1_populated_bytes",
          "L1 bytes whose pages are populated ahead of use (--l1-populate).",
          s.l1.populated_bytes);
  w.Gauge("kvd_registered_instances", "Registered worker instances.",
          static_cast<uint64_t>(s.instances.size()));
  w.Gauge("kvd_active_sessions", "Live request sessions.", s.sessions);
  w.Gauge("kvd_session_bytes", "Bytes the live request sessions hold (token ids, hashes).",
          s.session_bytes);
  w.Counter("kvd_sessions_evicted_total",
            "Request sessions dropped to stay within --max-sessions / --max-session-memory-mb.",
            s.sessions_evicted);
  w.Counter("kvd_unknown_op_requests_total", "Requests whose op kvd does not know.",
            s.unknown_ops);
  w.Counter("kvd_chunk_key_memo_hits_total",
            "Chunk keys found in the memo of recently hashed chunks (not hashed again).",
            s.chunk_key_memo_hits);
  w.Counter("kvd_chunk_key_memo_misses_total", "Chunk keys hashed (and remembered).",
            s.chunk_key_memo_misses);
  w.Gauge("kvd_chunk_key_memo_bytes", "Memory of the chunk-key memo (--chunk-key-memo-mb).",
          s.chunk_key_memo_bytes);

  w.Header("kvd_requests_total", "counter", "Requests completed, per operation.");
  for (const auto& o : s.ops) {
    w.Value("kvd_requests_total{op=\"" + Escape(o.name) + "\"}", o.requests);
  }
  w.Header("kvd_requests_in_flight", "gauge", "Requests received and not yet answered.");
  for (const auto& o : s.ops) {
    w.Value("kvd_requests_in_flight{op=\"" + Escape(o.name) + "\"}", o.in_flight);
  }
  w.Header("kvd_request_duration_seconds", "histogram",
           "Time from receiving a request to its reply being ready, per operation.");
  for (const auto& o : s.ops) {
    const std::string op = Escape(o.name);
    uint64_t cum = 0;
    for (size_t i = 0; i < o.buckets.size(); ++i) {
      cum += o.buckets[i];
      const std::string le = i < s.latency_bounds.size() ? Bound(s.latency_bounds[i]) : "+Inf";
      w.Value("kvd_request_duration_seconds_bucket{op=\"" + op + "\",le=\"" + le + "\"}", cum);
    }
    w.Value("kvd_request_duration_seconds_sum{op=\"" + op + "\"}", o.latency_sum_seconds);
    w.Value("kvd_request_duration_seconds_count{op=\"" + op + "\"}", cum);
  }
  w.Header("kvd_request_phase_seconds", "histogram",
           "Server time per request in each phase (queue, decode, hash, index, copy, reply), per "
           "operation.");
  for (const auto& o : s.ops) {
    const std::string op = Escape(o.name);
    for (const auto& ph : o.phases) {
      const std::string labels = "op=\"" + op + "\",phase=\"" + Escape(ph.name) + "\"";
      uint64_t cum = 0;
      for (size_t i = 0; i < ph.buckets.size(); ++i) {
        cum += ph.buckets[i];
        const std::string le = i < s.latency_bounds.size() ? Bound(s.latency_bounds[i]) : "+Inf";
        w.Value("kvd_request_phase_seconds_bucket{" + labels + ",le=\"" + le + "\"}", cum);
      }
      w.Value("kvd_request_phase_seconds_sum{" + labels + "}", ph.sum_seconds);
      w.Value("kvd_request_phase_seconds_count{" + labels + "}", cum);
    }
  }
  w.Header("kvd_requests_refused_total", "counter",
           "Requests answered with a failure without running: their connection had too many "
           "bytes of requests queued.");
  for (const auto& o : s.ops) {
    w.Value("kvd_requests_refused_total{op=\"" + Escape(o.name) + "\"}", o.refused);
  }
  w.Header("kvd_request_loop_wakeup_seconds", "histogram",
           "Wall time of one wake-up of the request loop's thread (reading, inline requests, "
           "sending replies): how long it kept every client waiting.");
  {
    uint64_t cum = 0;
    for (size_t i = 0; i < s.loop.buckets.size(); ++i) {
      cum += s.loop.buckets[i];
      const std::string le = i < s.latency_bounds.size() ? Bound(s.latency_bounds[i]) : "+Inf";
      w.Value("kvd_request_loop_wakeup_seconds_bucket{le=\"" + le + "\"}", cum);
    }
    w.Value("kvd_request_loop_wakeup_seconds_sum", s.loop.sum_seconds);
    w.Value("kvd_request_loop_wakeup_seconds_count", cum);
  }
  w.Gauge("kvd_request_loop_longest_wakeup_seconds",
          "Longest wake-up of the request loop's thread since start (wall clock).",
          s.loop.longest_seconds);
  w.Header("kvd_request_loop_longest_inline_seconds", "gauge",
           "Longest single request the request loop's thread ran itself since start (every other "
           "client waited that long; wall clock), and its operation.");
  w.Value("kvd_request_loop_longest_inline_seconds{op=\"" + Escape(s.loop.longest_inline_op) + "\"}",
          s.loop.longest_inline_seconds);
  RenderFamilies(w, s.families);
  return w.Take();
}

}  // namespace kvd::http
