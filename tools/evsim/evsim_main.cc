// kvd-evsim: hit ratios of the eviction policies on a request trace, beside Belady's OPT and
// an infinite cache, at capacities given as fractions of the trace's footprint. See
// tools/evsim/trace_sim.h for the model and docs/eviction.md for results.
//
//   build/kvd-evsim --trace /work/shared/data/mooncake_conversation_trace.jsonl
//       --capacities 0.05,0.1,0.2,0.4 --policies LRU,ARC,S3-FIFO --json out.json
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eviction/eviction_policy.h"
#include "tools/evsim/trace_sim.h"

int main(int argc, char** argv) {
  CLI::App app{"kvd-evsim: replays a prefix-cache trace through kvd's eviction policies"};
  std::string trace_path = "/work/shared/data/mooncake_conversation_trace.jsonl";
  std::vector<double> capacities = {0.05, 0.10, 0.20, 0.40};
  std::vector<std::string> policies;
  std::vector<uint32_t> shards = {1};
  kvd::evsim::TraceOptions trace_options;
  std::string synthetic;
  std::string json_out, md_out;
  app.add_option("--trace", trace_path, "Mooncake-format JSON-lines trace")->capture_default_str();
  app.add_option("--capacities", capacities, "Capacities as fractions of the footprint")
      ->delimiter(',')->capture_default_str();
  app.add_option("--policies", policies, "Policies (default: every policy that evicts)")
      ->delimiter(',');
  app.add_option("--shards", shards, "Policy instances (1, or the L1's 64 to see sharding)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--block-tokens", trace_options.block_tokens, "Tokens per trace block")
      ->capture_default_str();
  app.add_option("--skip-requests", trace_options.skip_requests,
                 "Drop the first N requests (replay a held-out tail; footprint of the rest)");
  app.add_option("--max-requests", trace_options.max_requests,
                 "Replay at most N requests (after the skipped ones; 0: all)");
  app.add_flag("--partial-blocks", trace_options.partial_blocks,
               "Store a request's partial last block too (kvd does not: the lmcache client "
               "stores complete chunks only)");
  app.add_option("--synthetic", synthetic,
                 "SEED:REQUESTS: replay the tests' synthetic conversations instead of --trace");
  app.add_option("--json", json_out, "Write results as JSON");
  app.add_option("--markdown", md_out, "Write the results table as Markdown");
  CLI11_PARSE(app, argc, argv);
  if (policies.empty()) {
    for (const auto& p : kvd::eviction::PolicyNames()) {
      if (p != "noop" && p != "IsolatedLRU") policies.push_back(p);  // one salt, no quotas: = LRU
    }
  }

  kvd::Result<kvd::evsim::Trace> trace = kvd::Status::InvalidArgument("no trace");
  if (!synthetic.empty()) {
    uint32_t seed = 0;
    int n = 0;
    const char* end = synthetic.data() + synthetic.size();
    auto r = std::from_chars(synthetic.data(), end, seed);
    if (r.ec == std::errc() && r.ptr != end && *r.ptr == ':') r = std::from_chars(r.ptr + 1, end, n);
    if (r.ec != std::errc() || r.ptr != end || n <= 0) {
      std::fprintf(stderr, "kvd-evsim: --synthetic wants SEED:REQUESTS, got '%s'\n",
                   synthetic.c_str());
      return 1;
    }
    trace_options.block_tokens = kvd::evsim::kSyntheticBlockTokens;
    trace = kvd::evsim::ParseTrace(kvd::evsim::SyntheticConversations(seed, n), trace_options);
    trace_path = "synthetic:" + synthetic;
  } else {
    trace = kvd::evsim::LoadTrace(trace_path, trace_options);
  }
  if (!trace.ok()) {
    std::fprintf(stderr, "kvd-evsim: %s\n", trace.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "trace %s: %zu requests, %llu unique blocks (%llu tokens of footprint), "
               "%llu input tokens\n", trace_path.c_str(), trace->requests.size(),
               static_cast<unsigned long long>(trace->unique_blocks),
               static_cast<unsigned long long>(trace->unique_blocks * trace->block_tokens),
               static_cast<unsigned long long>(trace->total_tokens));
  nlohmann::ordered_json out = {{"trace", trace_path},
                                {"requests", trace->requests.size()},
                                {"unique_blocks", trace->unique_blocks},
                                {"block_tokens", trace->block_tokens},
                                {"partial_blocks", trace_options.partial_blocks},
                                {"skip_requests", trace_options.skip_requests},
                                {"input_tokens", trace->total_tokens},
                                {"results", nlohmann::json::array()}};
  auto add = [&](const kvd::evsim::SimResult& r, double fraction) {
    out["results"].push_back({{"policy", r.policy}, {"capacity_fraction", fraction},
                              {"capacity_blocks", r.capacity_blocks}, {"shards", r.shards},
                              {"token_hit_ratio", r.token_hit_ratio},
                              {"block_hit_ratio", r.block_hit_ratio},
                              {"evictions", r.evictions}, {"not_stored", r.not_stored},
                              {"seconds", r.seconds}});
  };
  const auto inf = kvd::evsim::SimulateInfinite(*trace);
  add(inf, 1.0);
  std::string md = "| capacity | policy | shards | token hit | block hit | of OPT's tokens |\n"
                   "|---|---|---|---|---|---|\n";
  char row[256];
  for (double f : capacities) {
    const uint64_t cap = std::max<uint64_t>(1, static_cast<uint64_t>(f * trace->unique_blocks));
    const auto opt = kvd::evsim::SimulateOpt(*trace, cap);
    add(opt, f);
    std::snprintf(row, sizeof(row), "| %.0f%% | OPT | - | %.2f%% | %.2f%% | 100%% |\n", f * 100,
                  opt.token_hit_ratio * 100, opt.block_hit_ratio * 100);
    md += row;
    for (const auto& p : policies) {
      for (uint32_t s : shards) {
        auto r = kvd::evsim::SimulatePolicy(*trace, p, cap, s);
        if (!r.ok()) {
          std::fprintf(stderr, "kvd-evsim: %s\n", r.status().ToString().c_str());
          return 1;
        }
        add(*r, f);
        std::snprintf(row, sizeof(row), "| %.0f%% | %s | %u | %.2f%% | %.2f%% | %.1f%% |\n",
                      f * 100, r->policy.c_str(), s, r->token_hit_ratio * 100,
                      r->block_hit_ratio * 100,
                      opt.token_hit_ratio > 0 ? 100 * r->token_hit_ratio / opt.token_hit_ratio : 0);
        md += row;
      }
    }
  }
  std::snprintf(row, sizeof(row), "| any | infinite | - | %.2f%% | %.2f%% | |\n",
                inf.token_hit_ratio * 100, inf.block_hit_ratio * 100);
  md += row;
  std::fputs(md.c_str(), stdout);
  if (!json_out.empty()) std::ofstream(json_out) << out.dump(2) << "\n";
  if (!md_out.empty()) std::ofstream(md_out) << md;
  return 0;
}
