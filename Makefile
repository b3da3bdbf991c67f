# kvd — two commands matter on a fresh Debian machine:
#   make run    install what is missing, build, start `kvd server` sized for this machine
#   make test   install what is missing, build, run every test that needs no GPU
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
VENV ?= $(CURDIR)/.venv
PORT ?= 5555

.PHONY: all deps build unit-test interop-test test run venv clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null
	@cmake --build $(BUILD_DIR) -j$(JOBS)

unit-test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

venv:
	@scripts/setup-venv.sh $(VENV)

interop-test: build venv
	@KVD_BIN=$(CURDIR)/$(BUILD_DIR)/kvd $(VENV)/bin/python -m pytest tests/integration -q

test: unit-test interop-test

run: build
	@scripts/run.sh $(BUILD_DIR)/kvd --port $(PORT)

clean:
	rm -rf $(BUILD_DIR)
