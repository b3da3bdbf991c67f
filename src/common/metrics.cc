#include "common/metrics.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace kvd::metrics {
namespace {

bool ValidName(const std::string& n) {
  if (n.empty()) return false;
  auto first = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; };
  if (!first(n[0])) return false;
  return std::all_of(n.begin() + 1, n.end(), [&](char c) { return first(c) || (c >= '0' && c <= '9'); });
}

std::string BaselineKey(const std::string& family, const std::vector<std::string>& labels) {
  std::string k = family;
  for (const auto& l : labels) {
    k += '\x1f';
    k += l;
  }
  return k;
}

// A programming error found at startup: said on stderr (the log may not be set up yet).
[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "kvd: metrics registry: %s\n", what.c_str());
  std::abort();
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCounter: return "counter";
    case Kind::kGauge: return "gauge";
    case Kind::kHistogram: return "histogram";
  }
  return "untyped";
}

uint64_t Series::count() const {
  uint64_t n = 0;
  for (uint64_t b : buckets) n += b;
  return n;
}

void SeriesSink::Add(std::vector<std::string> label_values, double value) {
  if (label_values.size() != out_->desc.label_names.size() || out_->desc.kind == Kind::kHistogram) {
    spdlog::warn("metrics: series of {} dropped: {} label values for {} label names{}", out_->desc.name,
                 label_values.size(), out_->desc.label_names.size(),
                 out_->desc.kind == Kind::kHistogram ? " (a histogram needs AddHistogram)" : "");
    return;
  }
  Series s;
  s.label_values = std::move(label_values);
  s.value = value;
  out_->series.push_back(std::move(s));
}

void SeriesSink::AddHistogram(std::vector<std::string> label_values, std::vector<uint64_t> buckets,
                              double sum) {
  if (label_values.size() != out_->desc.label_names.size() || out_->desc.kind != Kind::kHistogram ||
      buckets.size() != out_->desc.bounds.size() + 1) {
    spdlog::warn("metrics: histogram series of {} dropped (labels {}/{}, buckets {}/{})", out_->desc.name,
                 label_values.size(), out_->desc.label_names.size(), buckets.size(),
                 out_->desc.bounds.size() + 1);
    return;
  }
  Series s;
  s.label_values = std::move(label_values);
  s.buckets = std::move(buckets);
  s.sum = sum;
  out_->series.push_back(std::move(s));
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::Buckets() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

CollectorHandle& CollectorHandle::operator=(CollectorHandle&& o) noexcept {
  if (this != &o) {
    Reset();
    registry_ = o.registry_;
    id_ = o.id_;
    o.registry_ = nullptr;
  }
  return *this;
}

void CollectorHandle::Reset() {
  if (registry_ != nullptr) registry_->Unregister(id_);
  registry_ = nullptr;
}

void Registry::Register(FamilyDesc desc, std::function<void(SeriesSink&)> collect, uint64_t* id) {
  if (!ValidName(desc.name)) Misuse("invalid family name '" + desc.name + "'");
  for (const auto& l : desc.label_names) {
    if (!ValidName(l) || l.find(':') != std::string::npos) Misuse("invalid label name '" + l + "' in " + desc.name);
  }
  if (desc.kind == Kind::kHistogram && !std::is_sorted(desc.bounds.begin(), desc.bounds.end())) {
    Misuse("histogram bounds of " + desc.name + " are not ascending");
  }
  MutexLock lock(&mu_);
  for (const auto& e : entries_) {
    if (e.desc.name == desc.name) Misuse("family " + desc.name + " registered twice");
  }
  Entry e;
  e.id = next_id_++;
  e.desc = std::move(desc);
  e.collect = std::move(collect);
  if (id != nullptr) *id = e.id;
  entries_.push_back(std::move(e));
}

void Registry::Unregister(uint64_t id) {
  MutexLock lock(&mu_);
  std::erase_if(entries_, [id](const Entry& e) { return e.id == id; });
}

Counter& Registry::AddCounter(std::string name, std::string help) {
  auto c = std::make_unique<Counter>();
  Counter* p = c.get();
  Register({std::move(name), std::move(help), Kind::kCounter, {}, {}},
           [p](SeriesSink& sink) { sink.Add(static_cast<double>(p->value())); }, nullptr);
  MutexLock lock(&mu_);
  counters_.push_back(std::move(c));
  return *p;
}

Gauge& Registry::AddGauge(std::string name, std::string help) {
  auto g = std::make_unique<Gauge>();
  Gauge* p = g.get();
  Register({std::move(name), std::move(help), Kind::kGauge, {}, {}},
           [p](SeriesSink& sink) { sink.Add(p->value()); }, nullptr);
  MutexLock lock(&mu_);
  gauges_.push_back(std::move(g));
  return *p;
}

Histogram& Registry::AddHistogram(std::string name, std::string help, std::vector<double> bounds) {
  auto h = std::make_unique<Histogram>(bounds);
  Histogram* p = h.get();
  Register({std::move(name), std::move(help), Kind::kHistogram, {}, std::move(bounds)},
           [p](SeriesSink& sink) { sink.AddHistogram({}, p->Buckets(), p->sum()); }, nullptr);
  MutexLock lock(&mu_);
  histograms_.push_back(std::move(h));
  return *p;
}

CollectorHandle Registry::AddCollected(FamilyDesc desc, std::function<void(SeriesSink&)> collect) {
  uint64_t id = 0;
  Register(std::move(desc), std::move(collect), &id);
  return CollectorHandle(this, id);
}

std::vector<FamilySnapshot> Registry::CollectRaw() const {
  std::vector<FamilySnapshot> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) {
    FamilySnapshot f;
    f.desc = e.desc;
    SeriesSink sink(&f);
    e.collect(sink);
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<FamilySnapshot> Registry::Collect() const {
  MutexLock lock(&mu_);
  std::vector<FamilySnapshot> out = CollectRaw();
  if (baselines_.empty()) return out;
  for (auto& f : out) {
    if (f.desc.kind != Kind::kCounter) continue;
    for (auto& s : f.series) {
      auto it = baselines_.find(BaselineKey(f.desc.name, s.label_values));
      if (it != baselines_.end()) s.value = s.value > it->second ? s.value - it->second : 0;
    }
  }
  return out;
}

void Registry::ResetCounters() {
  MutexLock lock(&mu_);
  const std::vector<FamilySnapshot> now = CollectRaw();
  baselines_.clear();
  for (const auto& f : now) {
    if (f.desc.kind != Kind::kCounter) continue;
    for (const auto& s : f.series) baselines_[BaselineKey(f.desc.name, s.label_values)] = s.value;
  }
}

bool Registry::Has(const std::string& name) const {
  MutexLock lock(&mu_);
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.desc.name == name; });
}

const FamilySnapshot* FindFamily(const std::vector<FamilySnapshot>& families, const std::string& name) {
  for (const auto& f : families) {
    if (f.desc.name == name) return &f;
  }
  return nullptr;
}

double ValueOf(const std::vector<FamilySnapshot>& families, const std::string& name, double fallback) {
  const FamilySnapshot* f = FindFamily(families, name);
  if (f == nullptr) return fallback;
  for (const auto& s : f->series) {
    if (s.label_values.empty()) return s.value;
  }
  return fallback;
}

const Series* FindSeries(const std::vector<FamilySnapshot>& families, const std::string& name,
                         const std::vector<std::string>& label_values) {
  const FamilySnapshot* f = FindFamily(families, name);
  if (f == nullptr) return nullptr;
  for (const auto& s : f->series) {
    if (s.label_values == label_values) return &s;
  }
  return nullptr;
}

double SumOf(const std::vector<FamilySnapshot>& families, const std::string& name) {
  const FamilySnapshot* f = FindFamily(families, name);
  double sum = 0;
  if (f == nullptr) return sum;
  for (const auto& s : f->series) sum += s.value;
  return sum;
}

}  // namespace kvd::metrics
