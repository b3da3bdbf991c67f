#include "http/prometheus.h"

#include <algorithm>
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
  std::string Take() { return std::move(out_); }

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
        w.Value(d.name + "_bucket{" + labels + sep + "le=\"" + le + "\"}", static_cast<double>(cum));
      }
      const std::string suffix = labels.empty() ? "" : "{" + labels + "}";
      w.Value(d.name + "_sum" + suffix, series.sum);
      w.Value(d.name + "_count" + suffix, static_cast<double>(cum));
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

std::string RenderPrometheus(const Snapshot& s) {
  Writer w;
  RenderFamilies(w, s.families);
  return w.Take();
}

}  // namespace kvd::http
