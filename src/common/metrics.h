// metrics::Registry: the one place where kvd's counters, gauges and histograms are declared.
// Each owner (a module: the request loop, the KV-event log, the blend module, ...) registers
// its own families (name, help, kind, label names) and keeps them up to date; the HTTP side
// renders whatever is registered (Prometheus text, /status, the dashboard) and
// /metrics/reset rebases every counter, without knowing any family by name. Adding a
// metric is a change in the module that owns it and nowhere else.
//
// Two ways to own a family:
//  - Counter / Gauge / Histogram objects the registry allocates and the owner updates on its
//    hot path (relaxed atomics: no lock, no allocation);
//  - a collected family: the owner hands a function that reads the state it already keeps
//    (its own atomics, a table size) and adds the series, with labels, when a reader collects.
//
// THREADS. Every method may be called from any thread. Updates to Counter/Gauge/Histogram are
// lock-free. Collect, ResetCounters and (un)registration take the registry's mutex; Collect
// calls the collectors with it held, so a collector must not register, unregister or collect,
// and must not take a lock its owner holds while unregistering.
//
// OWNERSHIP AND LIFETIME. The registry owns the Counter/Gauge/Histogram objects: a reference
// returned by Add* stays valid for the registry's lifetime (the owner must not outlive the
// registry). A collected family is registered through a CollectorHandle (move-only, RAII):
// the family is removed when the handle is destroyed, so the collector never runs after its
// owner has gone.
//
// INVARIANTS. Family names are unique and valid Prometheus names ([a-zA-Z_:][a-zA-Z0-9_:]*);
// registering an invalid or duplicate name is a programming error and aborts at startup.
// Families are collected in registration order. Counter values are monotonic between
// resets; Collect reports each counter series net of its value at the last ResetCounters
// (never below 0). Gauges and histograms are not rebased.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvd::metrics {

enum class Kind { kCounter, kGauge, kHistogram };
const char* KindName(Kind kind);  // "counter", "gauge", "histogram"

// What a family is: the same for every series of it.
struct FamilyDesc {
  std::string name;                       // e.g. "lmcache_blend_lookup_requests_total"
  std::string help;                       // one line
  Kind kind = Kind::kCounter;
  std::vector<std::string> label_names;   // empty: a single unlabelled series
  std::vector<double> bounds;             // histograms: bucket upper bounds, ascending; +Inf implied
  // Histograms: write each bound with one decimal ("5.0"), as lmcache's exporter does for
  // the families kvd shares with it; otherwise the shortest form ("5", "0.001").
  bool one_decimal_bounds = false;
};

// One series as collected.
struct Series {
  std::vector<std::string> label_values;  // one per label name, in the family's order
  double value = 0;                       // counters and gauges
  std::vector<uint64_t> buckets;          // histograms: per bucket, NOT cumulative; bounds+1
  double sum = 0;                         // histograms: sum of observed values
  uint64_t count() const;                 // histograms: observations
};

struct FamilySnapshot {
  FamilyDesc desc;
  std::vector<Series> series;
};

// Where a collector puts its family's series. Label values must match the family's label
// names in number (a mismatch is dropped and logged once per collection).
class SeriesSink {
 public:
  void Add(std::vector<std::string> label_values, double value);
  void Add(double value) { Add({}, value); }
  void AddHistogram(std::vector<std::string> label_values, std::vector<uint64_t> buckets, double sum);

 private:
  friend class Registry;
  explicit SeriesSink(FamilySnapshot* out) : out_(out) {}
  FamilySnapshot* out_;
};

class Counter {
 public:
  void Add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Add(double d) { v_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Fixed buckets; Observe is lock-free (one bucket increment and one sum update).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  std::vector<uint64_t> Buckets() const;  // per bucket, not cumulative; bounds + 1
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

class Registry;

// Keeps one collected family registered; destroying (or Reset()) removes it.
class [[nodiscard]] CollectorHandle {
 public:
  CollectorHandle() = default;
  CollectorHandle(CollectorHandle&& o) noexcept : registry_(o.registry_), id_(o.id_) { o.registry_ = nullptr; }
  CollectorHandle& operator=(CollectorHandle&& o) noexcept;
  CollectorHandle(const CollectorHandle&) = delete;
  CollectorHandle& operator=(const CollectorHandle&) = delete;
  ~CollectorHandle() { Reset(); }
  void Reset();
  bool registered() const { return registry_ != nullptr; }

 private:
  friend class Registry;
  CollectorHandle(Registry* registry, uint64_t id) : registry_(registry), id_(id) {}
  Registry* registry_ = nullptr;
  uint64_t id_ = 0;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Unlabelled metrics the owner updates directly.
  Counter& AddCounter(std::string name, std::string help);
  Gauge& AddGauge(std::string name, std::string help);
  Histogram& AddHistogram(std::string name, std::string help, std::vector<double> bounds);

  // A family whose series `collect` adds from its owner's state at each collection.
  CollectorHandle AddCollected(FamilyDesc desc, std::function<void(SeriesSink&)> collect);

  // Every registered family with its series, in registration order; counters net of the
  // last ResetCounters. Families that collected no series are included with none.
  std::vector<FamilySnapshot> Collect() const;

  // POST /metrics/reset: later collections report counters from zero again.
  void ResetCounters();

  bool Has(const std::string& name) const;

 private:
  friend class CollectorHandle;
  struct Entry {
    uint64_t id = 0;
    FamilyDesc desc;
    std::function<void(SeriesSink&)> collect;
  };
  void Register(FamilyDesc desc, std::function<void(SeriesSink&)> collect, uint64_t* id)
      KVD_EXCLUDES(mu_);
  void Unregister(uint64_t id) KVD_EXCLUDES(mu_);
  std::vector<FamilySnapshot> CollectRaw() const KVD_REQUIRES(mu_);

  mutable Mutex mu_;
  // Registered families in registration order.
  std::vector<Entry> entries_ KVD_GUARDED_BY(mu_);
  uint64_t next_id_ KVD_GUARDED_BY(mu_) = 1;
  // Counter values at the last ResetCounters, by family name + '\x1f' + label values.
  std::map<std::string, double> baselines_ KVD_GUARDED_BY(mu_);
  // Storage of the directly updated metrics (stable addresses).
  std::vector<std::unique_ptr<Counter>> counters_ KVD_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Gauge>> gauges_ KVD_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Histogram>> histograms_ KVD_GUARDED_BY(mu_);
};

// Looks a collected family up by name (nullptr when absent), and the value of its unlabelled
// series (or `fallback`): for renderers that place a known family somewhere specific (an
// lmcache-shaped /status key).
const FamilySnapshot* FindFamily(const std::vector<FamilySnapshot>& families, const std::string& name);
double ValueOf(const std::vector<FamilySnapshot>& families, const std::string& name, double fallback = 0);
// The sum of every series of counter or gauge family `name` (0 when absent): a total over
// label sets.
double SumOf(const std::vector<FamilySnapshot>& families, const std::string& name);
// The series of family `name` whose label values are exactly `label_values` (nullptr when
// there is none).
const Series* FindSeries(const std::vector<FamilySnapshot>& families, const std::string& name,
                         const std::vector<std::string>& label_values);

// One unlabelled family read from a snapshot of its owner's stats (`Stats`), for owners that
// describe their families as a table (server/kv_events.cc, p2p/peer_node.cc).
template <typename Stats>
struct StatsFamily {
  const char* name;
  Kind kind;
  const char* help;
  double (*read)(const Stats&);
};

// Registers every family of `table`; each collection calls `snapshot` once per family. The
// handles unregister them: keep them as the owner's last member.
template <typename Stats, size_t N, typename Snapshot>
std::vector<CollectorHandle> AddStatsFamilies(Registry& registry, const StatsFamily<Stats> (&table)[N],
                                              Snapshot snapshot) {
  std::vector<CollectorHandle> handles;
  handles.reserve(N);
  for (const StatsFamily<Stats>& f : table) {
    handles.push_back(registry.AddCollected(
        {f.name, f.help, f.kind, {}, {}},
        [snapshot, read = f.read](SeriesSink& sink) { sink.Add(read(snapshot())); }));
  }
  return handles;
}

}  // namespace kvd::metrics
