// The `kvd server` parser over the flags table: argparse's grammar, one-line errors, the
// accepted-but-ignored list, environment variables, and the table's own consistency.
#include "cli/flags.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvd::cli {
namespace {

using ::testing::HasSubstr;

struct Env {
  std::map<std::string, std::string> vars;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

Result<ParsedCommandLine> Parse(std::vector<std::string> args, const Env& env = {}) {
  std::vector<std::string> all = {"--l1-size-gb", "1", "--eviction-policy", "LRU"};
  all.insert(all.end(), args.begin(), args.end());
  return ParseServerCommandLine(all, env.lookup());
}

std::string Error(std::vector<std::string> args, const Env& env = {}) {
  auto r = Parse(std::move(args), env);
  return r.ok() ? std::string("(parsed)") : r.status().message();
}

TEST(FlagsTable, NamesAreUniqueAndRowsConsistent) {
  std::set<std::string> seen;
  for (const auto& f : ServerFlags()) {
    for (const char* n : {f.name, f.negation, f.short_name}) {
      if (n) {
        EXPECT_TRUE(seen.insert(n).second) << "duplicate flag name " << n;
      }
    }
    EXPECT_NE(f.group, nullptr) << f.name;
    if (f.negation) {
      EXPECT_EQ(f.kind, FlagKind::kBool) << f.name;
    }
    if (f.kind == FlagKind::kChoice) {
      EXPECT_NE(f.choices, nullptr) << f.name;
    }
    if (f.serves && f.support != Support::kRefused && f.accepts == nullptr) {
      EXPECT_NE(f.refusal, nullptr) << f.name << ": values outside `serves` need a reason";
    }
    if (f.support == Support::kRefused || f.support == Support::kAccepted) {
      EXPECT_STRNE(f.note, "") << f.name << ": accepted and refused flags say why";
    }
    if (f.show) {
      EXPECT_NE(f.apply, nullptr) << f.name;
    }
  }
}

TEST(Parse, SpaceAndEqualsFormsAndTheLastOccurrenceWins) {
  auto r = Parse({"--port", "6000", "--chunk-size=512", "--port=6001"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->config.server.port, 6001);
  EXPECT_EQ(r->config.server.chunk_size, 512);
}

TEST(Parse, NegativeNumbersAreValues) {
  auto r = Parse({"--null-block-id", "-1"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->config.server.null_block_id, -1);
}

TEST(Parse, BadValuesNameFlagAndValue) {
  EXPECT_EQ(Error({"--port", "abc"}), "--port abc: not an integer");
  EXPECT_EQ(Error({"--port", "70000"}), "--port 70000: out of range [1, 65535]");
  EXPECT_EQ(Error({"--eviction-ratio", "1e400"}), "--eviction-ratio 1e400: not a number");
  EXPECT_EQ(Error({"--transport", "udp"}), "--transport udp: not one of zmq, grpc");
  EXPECT_EQ(Error({"--l2-adapter", "{\"type\":"}), "--l2-adapter '{\"type\":': not valid JSON");
  EXPECT_EQ(Error({"--runtime-plugin-config", "[1]"}), "--runtime-plugin-config [1]: not a JSON object");
  EXPECT_EQ(Error({"--host", "a b", "--port", ""}), "--port '': not an integer");
  EXPECT_EQ(Error({"--port"}), "--port: expected a value");
  EXPECT_EQ(Error({"--disable-metrics=yes"}), "--disable-metrics yes: takes no value");
  EXPECT_THAT(Error({"positional"}), HasSubstr("unexpected argument positional"));
}

TEST(Parse, RefusalsSayWhy) {
  EXPECT_THAT(Error({"--transport", "grpc"}),
              HasSubstr("--transport grpc: not supported by kvd (the gRPC transport"));
  // --l2-adapter is implemented: the table only checks it is a JSON object (l2 checks the rest).
  EXPECT_EQ(Error({"--l2-adapter", "{}"}), "(parsed)");
  EXPECT_EQ(Error({"--no-isolated-ipc"}), "(parsed)");
}

// lmcache's Kubernetes operator starts the server with --isolated-ipc (issue 26 item 5): kvd
// starts, and lists the flag as accepted with no effect, since it follows each worker's mode.
TEST(Parse, IsolatedIpcIsAcceptedBecauseKvdFollowsEachWorker) {
  auto r = Parse({"--isolated-ipc"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->ignored.size(), 1u);
  EXPECT_EQ(r->ignored[0].flag, "--isolated-ipc");
  EXPECT_THAT(r->ignored[0].why, HasSubstr("follows each GPU worker's own mode"));
  auto plain = Parse({"--no-isolated-ipc"});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->ignored.empty());
}

TEST(Parse, ListFlagsTakeWordsUpToTheNextFlag) {
  auto r = Parse({"--script-allowed-imports", "numpy", "pandas", "--port", "6000"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->config.server.port, 6000);
  ASSERT_EQ(r->ignored.size(), 1u);
  EXPECT_EQ(r->ignored[0].flag, "--script-allowed-imports");
  EXPECT_EQ(r->ignored[0].value, "numpy pandas");
  EXPECT_EQ(Error({"--enable"}), "(parsed)");  // an empty list: nothing enabled
  EXPECT_THAT(Error({"--enable", "transfer_query"}), HasSubstr("not supported by kvd"));
}

TEST(Parse, AcceptedFlagsAreListedOnceWithTheirReason) {
  auto r = Parse({"--prometheus-port", "9090", "--no-gds-l1-use-direct-io", "--prometheus-port", "9091",
                  "--coordinator-l2-event-reporting"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->ignored.size(), 3u);
  EXPECT_EQ(r->ignored[0].flag, "--prometheus-port");
  EXPECT_EQ(r->ignored[0].value, "9091");
  EXPECT_THAT(r->ignored[0].why, HasSubstr("never opens it"));
  EXPECT_EQ(r->ignored[1].flag, "--no-gds-l1-use-direct-io");
  EXPECT_EQ(r->ignored[2].flag, "--coordinator-l2-event-reporting");
  auto plain = Parse({"--l1-use-lazy", "--port", "5555"});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->ignored.empty()) << "implemented flags are not 'ignored'";
}

TEST(Parse, UnambiguousPrefixesWorkAsInArgparse) {
  auto r = Parse({"--chunk-si", "512"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->config.server.chunk_size, 512);
  EXPECT_THAT(Error({"--l1-use"}), HasSubstr("ambiguous"));
  EXPECT_THAT(Error({"--nonsense"}), HasSubstr("--nonsense: not a flag"));
}

TEST(Parse, RequiredFlagsAndCrossChecks) {
  EXPECT_THAT(ParseServerCommandLine(std::vector<std::string>{"--eviction-policy", "LRU"},
                                     Env{}.lookup()).status().message(),
              HasSubstr("--l1-size-gb: required"));
  EXPECT_THAT(Error({"--worker-reap-timeout-seconds", "10"}), HasSubstr("at least 30"));
  EXPECT_THAT(Error({"--worker-reap-timeout-seconds", "4000"}),
              HasSubstr("--worker-registration-grace-seconds"));
  EXPECT_EQ(Error({"--worker-reap-timeout-seconds", "0"}), "(parsed)");
}

TEST(Parse, WorkerPoolFlags) {
  auto r = Parse({"--max-gpu-workers", "6", "--max-cpu-workers", "3"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.server.max_workers, 6);
  r = Parse({"--max-gpu-workers", "6", "--max-workers", "2"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.server.max_workers, 2);
}

TEST(Parse, TransferModeAndObservability) {
  auto r = Parse({"--supported-transfer-mode", "engine_driven"});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->config.server.lmcache_driven_enabled());
  EXPECT_TRUE(r->config.server.engine_driven_enabled());
  r = Parse({});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.server.supported_transfer_mode, "auto");
  EXPECT_TRUE(r->config.http.metrics_enabled);
  r = Parse({"--disable-observability"});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->config.http.metrics_enabled);
  EXPECT_EQ(r->config.server.kv_event_log_size, 0);
}

TEST(Parse, EngineTypeBlendAndItsSwitches) {
  auto r = Parse({});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.server.engine_type, "default");
  EXPECT_FALSE(r->config.server.blend());
  r = Parse({"--engine-type", "blend", "--enable-dedup-content", "--enable-blend-reorder",
             "--enable-segmented-prefix", "--blend-lmcache-parity"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->config.server.blend());
  EXPECT_TRUE(r->config.server.enable_dedup_content);
  EXPECT_TRUE(r->config.server.enable_blend_reorder);
  EXPECT_TRUE(r->config.server.enable_segmented_prefix);
  EXPECT_TRUE(r->config.server.blend_lmcache_parity);
  EXPECT_TRUE(Parse({"--engine-type", "blend", "--supported-transfer-mode", "lmcache_driven"}).ok());
  EXPECT_THAT(Error({"--engine-type", "blend", "--supported-transfer-mode", "engine_driven"}),
              HasSubstr("--engine-type blend: needs --supported-transfer-mode lmcache_driven or auto"));
}

TEST(Parse, EnvironmentLogLevelAndTheFlagThatOverridesIt) {
  Env env{{{"LMCACHE_LOG_LEVEL", "warning"}}};
  auto r = Parse({}, env);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->config.log_level, "warning");
  r = Parse({"--log-level", "debug"}, env);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.log_level, "debug");
  EXPECT_EQ(r->config.log_level_source, "--log-level");
  EXPECT_EQ(Error({}, Env{{{"LMCACHE_LOG_LEVEL", "chatty"}}}),
            "LMCACHE_LOG_LEVEL chatty: not one of DEBUG, INFO, WARNING, ERROR, CRITICAL");
  EXPECT_THAT(Error({}, Env{{{"LMCACHE_COORDINATOR_URL", "http://c:9300"}}}),
              HasSubstr("LMCACHE_COORDINATOR_URL http://c:9300: not supported by kvd"));
  EXPECT_EQ(Error({}, Env{{{"LMCACHE_COORDINATOR_URL", ""}}}), "(parsed)");
}

TEST(Render, HelpHidesWhatLmcacheHidesAndSummaryIsGrouped) {
  const std::string help = ServerHelp();
  EXPECT_THAT(help, HasSubstr("\nMP Server:\n"));
  EXPECT_THAT(help, HasSubstr("--supported-transfer-mode {lmcache_driven,engine_driven,auto}"));
  EXPECT_EQ(help.find("--coordinator-l2-event-reporting"), std::string::npos);
  auto r = Parse({"--port", "6000"});
  ASSERT_TRUE(r.ok());
  auto lines = StartupSummary(r->config);
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines[0], HasSubstr("MP Server: host=localhost port=6000 chunk_size=256"));
}

TEST(ServerFlags, L1AlignBytesIsAPowerOfTwoThatReachesTheServerConfig) {
  auto r = Parse({"--l1-align-bytes", "65536"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.server.l1_align_bytes, 65536u);
  EXPECT_EQ(Parse({})->config.server.l1_align_bytes, 4096u);
  EXPECT_EQ(Parse({"--l1-align-bytes", "1"})->config.server.l1_align_bytes, 1u);
  EXPECT_EQ(Error({"--l1-align-bytes", "3000"}), "--l1-align-bytes 3000: must be a power of two");
  EXPECT_THAT(Error({"--l1-align-bytes", "0"}), HasSubstr("--l1-align-bytes 0: out of range"));
  EXPECT_THAT(Error({"--l1-align-bytes", "-4096"}), HasSubstr("out of range"));
  // At most the L1 size (Parse gives --l1-size-gb 1).
  EXPECT_EQ(Error({"--l1-align-bytes", "1073741824"}), "(parsed)");
  EXPECT_THAT(Error({"--l1-size-gb", "0.5", "--l1-align-bytes", "1073741824"}),
              HasSubstr("--l1-align-bytes 1073741824: larger than --l1-size-gb"));
}

TEST(ServerFlags, L1LazyAndInitSizeReachTheServerConfig) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->config.server.l1_use_lazy);
  EXPECT_EQ(d->config.server.l1_init_size_gb, 20);
  // lmcache's default initial size (20 GiB) is capped at a smaller L1 silently.
  EXPECT_EQ(d->config.server.l1_init_bytes(), uint64_t{1} << 30);
  EXPECT_TRUE(d->ignored.empty());
  auto r = Parse({"--l1-size-gb", "8", "--l1-init-size-gb", "2"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.server.l1_init_bytes(), uint64_t{2} << 30);
  auto eager = Parse({"--l1-size-gb", "8", "--l1-init-size-gb", "2", "--no-l1-use-lazy"});
  ASSERT_TRUE(eager.ok());
  EXPECT_FALSE(eager->config.server.l1_use_lazy);
  EXPECT_EQ(eager->config.server.l1_init_bytes(), uint64_t{8} << 30);
  EXPECT_TRUE(eager->ignored.empty()) << "--no-l1-use-lazy is implemented";
  EXPECT_EQ(Parse({"--l1-init-size-gb", "0"})->config.server.l1_init_bytes(), 0u);
  // Larger than L1, given or not: capped at the L1 size, as lmcache does (and accepts).
  auto capped = Parse({"--l1-size-gb", "4", "--l1-init-size-gb", "5"});
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_EQ(capped->config.server.l1_init_bytes(), uint64_t{4} << 30);
  EXPECT_THAT(Error({"--l1-init-size-gb", "-1"}), HasSubstr("--l1-init-size-gb -1: out of range"));
  EXPECT_THAT(Error({"--l1-init-size-gb", "1.5"}), HasSubstr("not an integer"));
}

// --l1-use-hugepages (lmcache's semantics): L1 in private memory, so lazy allocation and
// engine-driven transfers go off (each said in one startup note), and a shared pool or
// engine-driven-only transfers are refused with one line.
TEST(ServerFlags, HugePagesMakeL1PrivateAndSaySo) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->config.server.l1_use_hugepages);
  EXPECT_TRUE(d->notes.empty());
  EXPECT_EQ(d->config.server.supported_transfer_mode, "auto");

  auto h = Parse({"--l1-use-hugepages"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->config.server.l1_use_hugepages);
  EXPECT_FALSE(h->config.server.l1_use_lazy);
  EXPECT_EQ(h->config.server.l1_init_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(h->config.server.supported_transfer_mode, "lmcache_driven");
  EXPECT_TRUE(h->config.server.shm_name.empty());
  ASSERT_EQ(h->notes.size(), 2u);
  EXPECT_THAT(h->notes[0], HasSubstr("engine-driven transfers are off"));
  EXPECT_THAT(h->notes[1], HasSubstr("lazy allocation is off"));
  EXPECT_TRUE(h->ignored.empty()) << "--l1-use-hugepages is implemented";

  auto quiet = Parse({"--l1-use-hugepages", "--no-l1-use-lazy", "--supported-transfer-mode",
                      "lmcache_driven"});
  ASSERT_TRUE(quiet.ok());
  EXPECT_TRUE(quiet->notes.empty()) << "nothing was changed behind the operator's back";
  EXPECT_FALSE(Parse({"--no-l1-use-hugepages"})->config.server.l1_use_hugepages);

  EXPECT_THAT(Error({"--l1-use-hugepages", "--shm-name", "pool"}),
              HasSubstr("--l1-use-hugepages: incompatible with a shared L1 pool"));
  EXPECT_THAT(Error({"--l1-use-hugepages", "--supported-transfer-mode", "engine_driven"}),
              HasSubstr("need L1 in shared memory"));
  EXPECT_TRUE(Parse({"--l1-use-hugepages", "--shm-name", ""}).ok());
}

TEST(ServerFlags, L1PopulateChoices) {
  EXPECT_EQ(Parse({})->config.server.l1_populate, "all");
  for (const char* m : {"all", "ahead", "off"}) {
    auto r = Parse({"--l1-populate", m});
    ASSERT_TRUE(r.ok()) << m;
    EXPECT_EQ(r->config.server.l1_populate, m);
  }
  EXPECT_THAT(Error({"--l1-populate", "some"}), HasSubstr("--l1-populate"));
}

TEST(ServerFlags, EveryEvictionPolicyIsAccepted) {
  for (const char* p : {"LRU", "ARC", "IsolatedLRU", "noop", "S3-FIFO", "LHD"}) {
    std::vector<std::string> args = {"--l1-size-gb", "1", "--eviction-policy", p};
    auto r = ParseServerCommandLine(args, Env{}.lookup());
    ASSERT_TRUE(r.ok()) << p << ": " << r.status().ToString();
    EXPECT_EQ(r->config.server.eviction_policy, p);
  }
}

}  // namespace
}  // namespace kvd::cli
