# fsdp-cpp: every target installs what is missing, configures and builds.
#   make demo   the main job: GPT-mini trained with FULL_SHARD on 2 ranks, with a report
#   make test   build and run the test suite (ctest), then list the skipped tests
#   make build  build only;  make bench  benchmarks;  make deps  Debian packages and torch
#   make scale  a model no rank can hold: GPT d=768 L=12 T=256 (85.7 M) on 8 ranks, tensors under 320 MiB and the process under 512 MiB each, --ac block (~50 s)
#   make docs   the API reference of include/fsdp (Doxygen) in build/docs/html
#   make install PREFIX=DIR   headers, libraries, the fsdp command and the CMake package
#   make fuzz   libFuzzer over the checkpoint parsers (clang, build-fuzz/, FUZZ_SECONDS each)
#   make test-asan  the test suite with address+undefined sanitizers (build-asan/)
#   make sim SEEDS=N [FROM=S]  the replica groups' simulator over N seeds (default 100000), on every core
#   make test-gpu   on a machine with an NVIDIA GPU: build with FSDP_CUDA, the GPU tests, parity and
#                   the speed table against PyTorch FSDP2 into one results file (docs/GPU.md)
#   make gpu-bundle the build packages as one folder, for a GPU machine without them or a network
#   make rehearse-gpu  test-gpu as that machine runs it, on the CPU, against its torch (2.11) (docs/GPU.md)
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
# What compiling needs; what the tests and the demo need beyond it (a headless
# browser, PyTorch for the cross-checks, text for GPT-mini, Doxygen for the
# test Docs.EveryPublicNameHasABrief, Open MPI's mpirun for the tests
# ClusterLaunch.RealMpirun*, Slurm and munge for the tests RealSlurm.*, which
# start a one-host cluster of their own); the API reference; the fuzz targets.
BUILD_DEBS := build-essential cmake python3-venv nlohmann-json3-dev libcli11-dev \
        libgtest-dev libbenchmark-dev zlib1g-dev ccache ninja-build
TEST_DEBS := chromium fortunes doxygen openmpi-bin slurmctld slurmd slurm-client munge
DOCS_DEBS := doxygen
FUZZ_DEBS := clang-14 libclang-rt-14-dev
DEBS ?= $(BUILD_DEBS) $(TEST_DEBS)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# libtorch: the torch wheel from PyPI, in a virtual environment outside the
# tree (a fresh clone on the same machine reuses it), made only when missing.
# The one place the version is pinned; CMake finds Torch through it
# (torch.utils.cmake_prefix_path), and the Python cross-checks and the FSDP2
# peers run its interpreter.
TORCH_VERSION := 2.15.0
TORCH_ENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fsdp-cpp/torch-$(TORCH_VERSION)
TORCH_PYTHON := $(TORCH_ENV)/bin/python
TORCH_PIP := torch==$(TORCH_VERSION) numpy safetensors
# Test-only: transformers builds the random Llama checkpoints the Hugging
# Face tests load and reads back what we export (tests/python/hf_llama.py).
# Installed into the same environment by `make test` (its own marker, so an
# environment made before it was added gets it without being remade).
TEST_PIP := transformers==5.25.0
TEST_PIP_MARK := $(TORCH_ENV)/.test-$(subst =,-,$(TEST_PIP))

.PHONY: deps debs deps-build torch test-pydeps configure build test demo scale tiny bench clean fuzz test-asan test-asan-ci sim \
        docs install test-gpu gpu-bundle torch-gpu rehearse-gpu

# The one place that installs Debian packages: those of $(DEBS) that are
# missing (nothing, not even apt-get update, when all are there). Other
# targets call it with their own list.
debs:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing missing Debian packages: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Everything the build, the tests and the demo need: the Debian packages,
# then the torch wheel's environment when it is missing.
deps: debs torch

deps-build:
	@$(MAKE) --no-print-directory debs DEBS="$(BUILD_DEBS)"
	@$(MAKE) --no-print-directory torch

# Made in place and marked complete last: an interrupted install is redone.
torch: $(TORCH_ENV)/.complete
$(TORCH_ENV)/.complete:
	@echo "installing $(TORCH_PIP) into $(TORCH_ENV) (a few GiB from PyPI; about 2 minutes)"
	rm -rf $(TORCH_ENV) && mkdir -p $(dir $(TORCH_ENV))
	python3 -m venv $(TORCH_ENV)
	$(TORCH_ENV)/bin/pip install -q --disable-pip-version-check $(TORCH_PIP)
	$(TORCH_PYTHON) -c 'import torch; assert torch.__version__.split("+")[0] == "$(TORCH_VERSION)", torch.__version__'
	touch $@

test-pydeps: $(TEST_PIP_MARK)
$(TEST_PIP_MARK): | $(TORCH_ENV)/.complete
	@echo "installing $(TEST_PIP) (test-only) into $(TORCH_ENV)"
	$(TORCH_ENV)/bin/pip install -q --disable-pip-version-check $(TEST_PIP)
	$(TORCH_PYTHON) -c 'import transformers'
	touch $@

# ccache (Debian's), with its cache beside the torch environment: a rebuild
# of the same tree (make clean, a CI rerun in the same folder) compiles
# nothing it compiled before. The shared precompiled header needs the
# sloppiness below and -fpch-preprocess (cmake/build_speed.cmake adds it).
# CCACHE_BASEDIR and CCACHE_NOHASHDIR let another checkout of the tree on the
# same machine (a fresh clone, a worktree) hit what this one compiled; the
# debug information of such a hit names the first checkout's paths.
# CCACHE= (empty) builds without it.
CCACHE ?= $(shell command -v ccache 2>/dev/null)
CCACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fsdp-cpp/ccache
comma := ,
CCACHE_SLOPPINESS := pch_defines$(comma)time_macros$(comma)include_file_mtime$(comma)include_file_ctime
CCACHE_LAUNCHER = $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER='/usr/bin/env;CCACHE_DIR=$(CCACHE_DIR);CCACHE_SLOPPINESS=$(CCACHE_SLOPPINESS);CCACHE_BASEDIR=$(CURDIR);CCACHE_NOHASHDIR=1;$(CCACHE)')

# Ninja where it is installed (`make deps` installs it): unlike CMake's
# Makefiles, it compiles a target's files while the libraries below it are
# still being compiled, so both cores stay busy from the precompiled header
# on. A build folder keeps the generator it was made with.
NINJA ?= $(shell command -v ninja 2>/dev/null)
GENERATOR = $(if $(NINJA),-G Ninja)

$(BUILD)/CMakeCache.txt: | deps-build
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDP_PYTHON=$(TORCH_PYTHON) $(CCACHE_LAUNCHER)

configure: $(BUILD)/CMakeCache.txt

build: deps-build configure
	cmake --build $(BUILD) -j $(JOBS)

# After ctest: how many tests were skipped (GTEST_SKIP, e.g. where the host
# forbids process_vm_readv; ctest's SKIP_REGULAR_EXPRESSION matched) and
# which, read from ctest's log of the run (Testing/Temporary/LastTest.log).
# Prints "skipped: 0 tests" when none; never changes the exit status.
SKIPPED_REPORT = awk '/^[0-9]+\/[0-9]+ Test: / { sub(/^[0-9]+\/[0-9]+ Test: /, ""); name = $$0 } \
    /^Skip regular expression found in output/ { if (!(name in seen)) { seen[name] = 1; skipped[n++] = name } } \
    END { printf "skipped: %d test%s\n", n, n == 1 ? "" : "s"; for (i = 0; i < n; i++) print "skipped test: " skipped[i] }'

# Then which tests passed only on their retry (--repeat until-pass:2), each
# with the end of its failed first run (tests/ci/retried.awk): a retry is a
# finding, never a silent pass.
test: deps test-pydeps build
	cd $(BUILD) && { rc=0; ctest --output-on-failure -j 1 --timeout 600 --repeat until-pass:2 || rc=$$?; \
	  $(SKIPPED_REPORT) Testing/Temporary/LastTest.log 2>/dev/null || echo "skipped: unknown (no ctest log)"; \
	  awk -f $(CURDIR)/tests/ci/retried.awk Testing/Temporary/LastTest.log 2>/dev/null || \
	    echo "needed a retry: unknown (no ctest log)"; \
	  exit $$rc; }

tiny: build
	$(BUILD)/bin/fsdp run -n 2 -- $(BUILD)/bin/tiny

# DEMO_ARGS: extra gpt flags, e.g. make demo DEMO_ARGS="--dtype bf16"
DEMO_ARGS ?=
demo: deps build
	bash examples/gpt/demo.sh $(BUILD) $(DEMO_ARGS)

# SCALE_N, SCALE_BUDGET, SCALE_STEPS: see examples/gpt/scale.sh
scale: deps build
	bash examples/gpt/scale.sh $(BUILD)

bench: deps build
	bash bench/run.sh $(BUILD)

# The replica groups' simulator (tests/sim) over SEEDS schedules from FROM,
# split over the cores; the suite runs 2000 of them.
SEEDS ?= 100000
FROM ?= 1
sim: deps-build build
	bash tests/sim/run.sh $(BUILD) $(SEEDS) $(FROM) $(JOBS)

# Warnings fail it, an undocumented public name among them (docs/Doxyfile,
# docs/check_docs.sh, which the test Docs.EveryPublicNameHasABrief runs too);
# the output is not committed.
docs:
	@$(MAKE) --no-print-directory debs DEBS="$(DOCS_DEBS)"
	bash docs/check_docs.sh build/docs

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)

# libFuzzer targets over the safetensors header and metadata.json parsers
# (docs/RELIABILITY.md). Seeds: fuzz/corpus/ (kept) + files our writer makes;
# what the fuzzer finds grows build-fuzz/corpus-*. Any crash, leak or
# sanitizer report fails the target and leaves the input in build-fuzz/.
FUZZ_SECONDS ?= 60
FUZZ_BUILD ?= build-fuzz
fuzz:
	@$(MAKE) --no-print-directory deps DEBS="$(BUILD_DEBS) $(FUZZ_DEBS)"
	cmake -S fuzz -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDP_PYTHON=$(TORCH_PYTHON)
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	$(FUZZ_BUILD)/make_seed_corpus $(FUZZ_BUILD)/seeds
	@set -eo pipefail; for t in safetensors metadata; do \
	  mkdir -p $(FUZZ_BUILD)/corpus-$$t; \
	  echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	  (cd $(FUZZ_BUILD) && ./fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 \
	     -print_final_stats=1 corpus-$$t ../fuzz/corpus/$$t seeds/$$t 2>&1 | tail -25); \
	done

# The suite with -fsanitize=address,undefined (docs/RELIABILITY.md).
# libtorch, gloo and the system libraries are not instrumented:
#  - detect_container_overflow=0: std::vector/string annotations need every
#    library that touches a container instrumented; libtorch is not, so
#    ASan would report false container overflows on vectors it resizes.
#  - LSan runs with tests/asan/lsan.supp: libtorch's and gloo's static
#    singletons (registries, thread pools) are never freed by design.
#  - UBSan halts on the first report; tests/asan/ubsan.supp lists what is
#    suppressed inside those libraries (each entry says why).
# Built niced (a shared machine builds other things first); only the binaries
# the suite runs. Slow: see docs/RELIABILITY.md for the times.
ASAN_BUILD ?= build-asan
ASAN_TARGETS := fsdp_tests fsdp_rank_programs
ASAN_ENV := ASAN_OPTIONS=detect_container_overflow=0:abort_on_error=1:strict_init_order=1:detect_leaks=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/asan/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=suppressions=$(CURDIR)/tests/asan/ubsan.supp:print_stacktrace=1:halt_on_error=1
# ASAN_QUICK=1: build only the programs the tests run (fsdp_rank_programs:
# the ranks' binaries, bench_train and the CUDA plugin; not fsdp_tests, the
# costliest part) and run the plain build's fsdp_tests with them as the ranks
# (FSDP_TEST_BIN_DIR); in-process tests then run uninstrumented.
# ASAN_FILTER: the tests the quick run takes (a gtest filter; default all).
# ASAN_SKIP: tests that cannot hold under the sanitizers, skipped there by
# name; the run prints how many and which:
#  - ProcessMemory.EveryRanksPeakIsBrokenIntoItsPartsAndThePlannersBudgetHolds
#    holds every rank's VmHWM to 256 MiB; ASan's shadow memory and
#    quarantine alone take more (the planner, instrumented, finds its own
#    resident size over the budget).
ASAN_QUICK ?=
ASAN_FILTER ?= *
ASAN_SKIP ?= ProcessMemory.EveryRanksPeakIsBrokenIntoItsPartsAndThePlannersBudgetHolds
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(if $(wildcard $(ASAN_BUILD)/CMakeCache.txt),,$(GENERATOR)) -DFSDP_PYTHON=$(TORCH_PYTHON) \
	  -DFSDP_SANITIZE=ON -DFSDP_BUILD_BENCH=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
ifeq ($(ASAN_QUICK),1)
	nice -n 15 cmake --build $(ASAN_BUILD) -j $(JOBS) --target fsdp_rank_programs fsdp_replica_sim
	$(MAKE) build
	@echo "test-asan: the replica groups' simulator under the sanitizers (its coroutines and the real protocol code): 300 seeds"
	$(ASAN_ENV) $(ASAN_BUILD)/bin/fsdp_replica_sim --seeds 300
	@echo "test-asan: skipped under the sanitizers (timing or memory bounds they cannot hold; see ASAN_SKIP): $(words $(subst :, ,$(ASAN_SKIP))) test(s)$(if $(ASAN_SKIP),: $(ASAN_SKIP))"
	$(ASAN_ENV) FSDP_TEST_BIN_DIR=$(CURDIR)/$(ASAN_BUILD)/bin $(BUILD)/bin/fsdp_tests --gtest_filter='$(ASAN_FILTER)$(if $(ASAN_SKIP),-$(ASAN_SKIP))'
else
	nice -n 15 cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(ASAN_TARGETS)
	cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -j 1 --timeout 1200
endif

# What every submission touching src/ runs before it stops (README; it does
# not fit in CI's time beside make test): the quick build (the rank binaries
# instrumented at -O0; about 11 minutes on 2 cores) and this subset of the suite (about 3 minutes): parity
# at every world size, checkpoints across processes and from the 1.13 build,
# the watchdog's stopped and killed ranks, construction, the transports,
# the process-wide state, the report and the planner (`fsdp report`, `fsdp plan`).
ASAN_CI_FILTER := WorldSizes/CommCollectives*:Grid/CoreParity*:CheckpointCompat*:CheckpointProcesses*:ProcessState*:CommTransport*:Construct*:ReliabilityStore*:Watchdog.ASigstopped*:Watchdog.ASigkilled*:Report.*:Plan.*:HybridPlan.*:StateDict/BackgroundSnapshot.*:StateDict.AChangeBeforeTheSnapshot*:StateDict.BackgroundSaves*:StateDict.AKill*:UnitLayout.*:*HostShared*:ReplicaGroups.*:Quant*:HybridCompressed*:CkptResiduals*:PlanCompress*:CommTiers.FlatRing*
test-asan-ci:
	$(MAKE) test-asan ASAN_QUICK=1 ASAN_FILTER='$(ASAN_CI_FILTER)'

# On a machine with an NVIDIA GPU (docs/GPU.md): one script, tests/gpu/run.sh,
# about 8 minutes on an H200. It installs nothing (such a machine may have no
# network): it builds against the torch of PYTHON with FSDP_CUDA=ON, then runs
# the GPU tests, GPT-mini's parity with plain libtorch at N = 1 and 2 and the
# speed table against PyTorch FSDP2, and writes OUT/test-gpu.md.
#   OUT     results folder (runs/test-gpu; taken from make's command line only, not from the
#           environment): test-gpu.md, test-gpu-logs.tar.gz, logs/, parity/, speed/
#   PYTHON  interpreter whose torch gives libtorch and runs FSDP2 (python3)
#   BUILD   build folder (build-gpu here, unless given on the command line)
#   JOBS    parallel compile jobs (nproc)
# More knobs (DEVICE=cpu for a dry run on a CPU, SKIP_BUILD, SPEED_SHAPE, the
# rounds and steps, TIME_BUDGET) are listed at the top of tests/gpu/run.sh.
GPU_OUT ?= runs/test-gpu
test-gpu:
	OUT=$(if $(filter command line,$(origin OUT)),$(OUT),$(GPU_OUT)) PYTHON=$(or $(PYTHON),python3) JOBS=$(JOBS) \
	  BUILD=$(if $(filter command line environment,$(origin BUILD)),$(BUILD),build-gpu) bash tests/gpu/run.sh

# The machine lent for the GPU run (docs/GPU.md, "The device machine") has
# torch 2.11 in python3, CMake, a compiler, no network and none of the
# Debian build packages. What travels there with the tree:
#   make gpu-bundle   $(GPU_BUNDLE)/: the headers and CMake files of the build
#                     packages and GoogleTest's sources, from the Debian packages
#                     (downloaded and unpacked, nothing installed; tests/gpu/bundle.sh)
# and what proves the run here first:
#   make torch-gpu    that machine's torch ($(GPU_TORCH_VERSION)) in a venv of its own
#   make rehearse-gpu tests/gpu/run.sh's two calls as made there (BUILD_ONLY=1,
#                     then SKIP_BUILD=1), DEVICE=cpu, against torch $(GPU_TORCH_VERSION),
#                     with the packages below hidden and no network (tests/gpu/rehearse.sh;
#                     root: it makes its own mount and network namespaces).
#                     Results: runs/rehearse-gpu/ (OUT on make's command line).
GPU_TORCH_VERSION := 2.11.0
GPU_TORCH_ENV := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fsdp-cpp/torch-$(GPU_TORCH_VERSION)
GPU_BUNDLE ?= gpu-bundle
GPU_BUNDLE_DEBS := nlohmann-json3-dev libcli11-dev googletest
# Hidden in the rehearsal: the build packages that machine lacks (BUILD_DEBS
# less the compiler, CMake and venv) and GoogleTest's sources.
GPU_HIDE_DEBS := nlohmann-json3-dev libcli11-dev libgtest-dev googletest libbenchmark-dev zlib1g-dev
REHEARSE_OUT ?= runs/rehearse-gpu

gpu-bundle: $(GPU_BUNDLE)/MANIFEST
$(GPU_BUNDLE)/MANIFEST:
	bash tests/gpu/bundle.sh $(GPU_BUNDLE) $(GPU_BUNDLE_DEBS)

torch-gpu:
	@$(MAKE) --no-print-directory torch TORCH_VERSION=$(GPU_TORCH_VERSION)

rehearse-gpu: gpu-bundle torch-gpu
	OUT=$(if $(filter command line,$(origin OUT)),$(OUT),$(REHEARSE_OUT)) PYTHON=$(GPU_TORCH_ENV)/bin/python \
	  JOBS=$(JOBS) BUNDLE=$(GPU_BUNDLE) HIDE_DEBS="$(GPU_HIDE_DEBS)" \
	  BUILD=$(if $(filter command line environment,$(origin BUILD)),$(BUILD),build-rehearse) bash tests/gpu/rehearse.sh
