# fsdp-cpp: every target installs what is missing, configures and builds.
#   make demo   the main job: GPT-mini trained with FULL_SHARD on 2 ranks, with a report
#   make test   build and run the test suite (ctest)
#   make build  build only;  make bench  benchmarks;  make deps  Debian packages only
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
DEBS := build-essential cmake chromium libtorch-dev libgloo-dev nlohmann-json3-dev libcli11-dev \
        libgtest-dev libbenchmark-dev libopenblas0-pthread fortunes python3-torch zlib1g-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps configure build test demo tiny bench clean

deps:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing missing Debian packages: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1 --timeout 600

tiny: build
	$(BUILD)/bin/fsdp run -n 2 -- $(BUILD)/bin/tiny

demo: build
	bash examples/gpt/demo.sh $(BUILD)

bench: build
	bash bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD)
