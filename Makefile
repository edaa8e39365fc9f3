# rl-sandbox: `make run` starts the whole service locally, `make test` runs every test.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_VERSION ?= 3.12
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
STAMP := $(VENV)/.installed
DEB_PACKAGES := libnl-3-200 libnl-route-3-200 redis-server iproute2 g++ nodejs \
  openjdk-17-jdk-headless libjavatuples-java
# One venv whose installed extras grow with the targets run: `make setup` (hence `make run`)
# installs the service alone; a target that needs an extra installs it once, stamped by
# .installed-<extra> and redone when pyproject.toml changes. uv keeps a package cache
# (~/.cache/uv), so a reinstall on the same machine is seconds, even with the several-GB PyTorch
# wheel of the `rl` extra. `make setup EXTRAS=dev,rl` adds extras to the setup.
EXTRAS ?=
# Every install is constrained by a committed lock (`make lock` moves it): locks/dev.txt holds
# the service and the dev, rl, deploy and mcp extras (the newest torch and transformers);
# locks/rl-pinned.txt the same service with the dev and rl extras on the pinned GPU stack
# (locks/gpu-stack.in: the vllm extra's torch and transformers); locks/vllm.txt the rl and vllm
# extras for CUDA GPU hosts. uv itself is pinned here.
LOCK := locks/dev.txt
UV_VERSION := 0.13.9
COMPILE := $(UV) pip compile -q --python-version 3.12 --python-platform x86_64-unknown-linux-gnu
comma := ,
extra = $(VENV)/.installed-$(1)
DEV := $(call extra,dev)
RL := $(call extra,rl)
DEPLOY := $(call extra,deploy)

.PHONY: help setup system-packages run gpu-bundle lock test-rl-pinned test test-fast test-cgroup2 lint format bench bench-executor bench-ceiling loadtest deploy-check clean demo-rl image-build image-test image-test-if-possible

help:
	@echo "make run    - set up (the service alone) and run it locally (API on http://127.0.0.1:8000)"
	@echo "make test   - set up (with the dev, rl and deploy extras) and run the full test suite"
	@echo "make test-cgroup2 - tests/cgroup2 inside a cgroup v2 guest (QEMU)"
	@echo "make image-test - build the images, run the compose stack under podman and test it"
	@echo "make lint   - ruff and mypy"
	@echo "make lock   - move the locks (locks/*.txt) to the newest versions pyproject.toml allows"
	@echo "make test-rl-pinned - tests/rl on the pinned GPU stack (torch 2.8.0, transformers 4.x)"

setup: system-packages $(STAMP) $(foreach e,$(subst $(comma), ,$(EXTRAS)),$(call extra,$(e)))

system-packages:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing (apt; a minute or two the first time, for the JDK)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml $(LOCK)
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  PYBIN=$$(scripts/find-python.sh $(PYTHON_VERSION)); \
	  echo "creating $(VENV) with $$PYBIN"; \
	  $$PYBIN -m venv $(VENV); \
	fi; \
	[ "$$($(UV) --version 2>/dev/null)" = "uv $(UV_VERSION)" ] || $(PY) -m pip install -q uv==$(UV_VERSION); \
	echo "installing rl-sandbox and its dependencies (numpy, scipy, sympy, matplotlib...) into $(VENV)"; \
	echo "  with uv: about a minute the first time on a 2-core machine, seconds from uv's cache"; \
	$(UV) pip install -q --compile-bytecode --python $(PY) -c $(LOCK) -e .; \
	scripts/make-runtime-traversable.sh $(PY); \
	touch $(STAMP)

# An extra on top of the service (pip keeps the extras installed before), at the lock's versions.
$(VENV)/.installed-%: $(STAMP) pyproject.toml $(LOCK)
	@echo "installing the $* extra into $(VENV) (uv; the rl extra's PyTorch takes minutes the first time)"
	$(UV) pip install -q --compile-bytecode --python $(PY) -c $(LOCK) -e '.[$*]'
	@touch $@

# Move the locks to the newest versions pyproject.toml allows (then `make setup` installs them).
lock: $(STAMP)
	$(COMPILE) --upgrade pyproject.toml --extra dev --extra rl --extra deploy --extra mcp -o locks/dev.txt
	$(COMPILE) --upgrade pyproject.toml --extra dev --extra rl -c locks/gpu-stack.in -o locks/rl-pinned.txt
	$(COMPILE) --upgrade pyproject.toml --extra rl --extra vllm -o locks/vllm.txt

# tests/rl on the pinned GPU stack (torch 2.8.0 and transformers 4.x of locks/rl-pinned.txt;
# PyPI's torch, a CUDA build that runs on the CPU), in a venv cached under ~/.cache/rl-sandbox
# keyed by the lock (first build ~1.5 min with a warm network), beside the suite's newest stack.
PINNED_ENV = $(HOME)/.cache/rl-sandbox/rl-pinned-env-$(shell sha256sum locks/rl-pinned.txt | cut -c1-12)
# make test runs the files whose code calls torch's or transformers' APIs that moved between
# the two stacks (FSDP2, DTensor, collectives, the weight push, the engines); PINNED_TESTS=tests/rl
# runs all of them.
PINNED_TESTS ?= tests/rl/test_rl_fsdp.py tests/rl/test_rl_vllm_sync.py \
  tests/rl/test_rl_vllm_boundary.py tests/rl/test_rl_vllm_fake.py tests/rl/test_rl_engine_hf.py \
  tests/rl/test_rl_update.py
test-rl-pinned: setup
	@if [ ! -f $(PINNED_ENV)/.complete ]; then \
	  rm -rf $(PINNED_ENV) && \
	  $(UV) venv -q --python "$$(scripts/find-python.sh $(PYTHON_VERSION))" $(PINNED_ENV) && \
	  $(UV) pip install -q --python $(PINNED_ENV)/bin/python -r locks/rl-pinned.txt && \
	  $(UV) pip install -q --python $(PINNED_ENV)/bin/python --no-deps -e . && \
	  scripts/make-runtime-traversable.sh $(PINNED_ENV)/bin/python && \
	  touch $(PINNED_ENV)/.complete; \
	fi
	$(PINNED_ENV)/bin/pytest -p no:cacheprovider $(PINNED_TESTS)

run: setup
	$(VENV)/bin/rl-sandbox up

# After the suite, the trainer's version-sensitive tests on the pinned GPU stack
# (test-rl-pinned, unless PINNED_STACK=0), then tests/cgroup2 again on a real cgroup v2 kernel
# (test-cgroup2), unless this host is v2 already (then the suite ran them there) or
# CGROUP2_GUEST=0; then the images and the compose stack (image-test: 1.3 min with podman's
# storage warm, 4.3 cold), unless IMAGE_TEST=0 or podman cannot be had on this machine (then a
# line says it was skipped, and why).
CGROUP2_GUEST ?= 1
IMAGE_TEST ?= 1
PINNED_STACK ?= 1
test: setup $(DEV) $(RL) $(DEPLOY)
	$(VENV)/bin/pytest
	@if [ "$(PINNED_STACK)" = 0 ]; then echo "test-rl-pinned skipped (PINNED_STACK=0)"; \
	else $(MAKE) --no-print-directory test-rl-pinned; fi
	@if [ "$(CGROUP2_GUEST)" = 0 ]; then echo "test-cgroup2 skipped (CGROUP2_GUEST=0)"; \
	elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo "cgroup v2 host: tests/cgroup2 ran natively"; \
	else $(MAKE) --no-print-directory test-cgroup2; fi
	@$(MAKE) --no-print-directory image-test-if-possible

test-fast: setup $(DEV) $(RL) $(DEPLOY)
	$(VENV)/bin/pytest -m "not slow"

# tests/cgroup2 (the jail's limits and an `rl-sandbox up` round trip) on a real cgroup v2 kernel:
# a Debian 12 guest under QEMU (software emulation), built from the package registries into
# ~/.cache/rl-sandbox/cgroup2-guest and kept there (a rebuild only redoes what changed).
# GUEST_TIMEOUT_S is the backstop on the whole guest run. See docs/deploy.md, "cgroup v2".
# The guest is 10-70x slower than the host: it runs the set that needs v2 to be proven, not the
# slot-cgroup checks that the jail's tests already cover (those run on the host in `make test`).
# A warm zygote's preload (numpy, sympy, scipy, matplotlib) takes ~100 s there: hence the
# longer jail start timeout.
GUEST_TIMEOUT_S ?= 900
CGROUP2_TESTS ?= tests/cgroup2/test_jail_limits.py tests/cgroup2/test_service_round_trip.py \
  tests/cgroup2/test_worker_entrypoint.py \
  tests/cgroup2/test_slot_cgroups.py::test_the_parent_delegates_memory_pids_and_cpu \
  tests/cgroup2/test_slot_cgroups.py::test_a_parent_that_holds_processes_is_refused_with_the_fix
test-cgroup2: setup $(DEV)
	scripts/cgroup2_guest/build.sh "$$(scripts/find-python.sh $(PYTHON_VERSION))"
	TIMEOUT=$(GUEST_TIMEOUT_S) scripts/cgroup2_guest/run.sh \
	  'RL_SANDBOX_JAIL_START_TIMEOUT_S=600 python -m pytest $(CGROUP2_TESTS) -q -rA -p no:cacheprovider -o timeout=900 --durations=0'

lint: setup $(DEV) $(RL)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --python-version 3.10 -p trainer_client  # the client installs into 3.10

format: setup $(DEV)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache reports

# Offline static validation of deploy/: the compose file, the Dockerfile, every kustomize
# rendering, against the schemas and tools pinned in the `deploy` extra (no network at check time).
# tests/deploy runs the same checks in `make test` wherever the `deploy` extra is installed.
deploy-check: setup $(DEPLOY)
	$(PY) deploy/check.py

# The CPU end-to-end GRPO-RoC recipe: tiny model and tokenizer built locally, SFT then RL against
# a private rl-sandbox that the run starts and stops. Writes runs/demo-rl/{metrics.jsonl,metrics.png}.
demo-rl: setup $(RL)
	$(VENV)/bin/rl-sandbox train --config configs/demo-rl.toml

# What a lent GPU host without a package registry needs carried beside the working tree
# (.gpu-bundle/, git-ignored, at most 64 MiB): part (b)'s tiny Qwen2 model directory and a
# manifest. Prints its size and the one command to send (docs/rl.md, "The GPU check").
gpu-bundle: setup $(RL)
	$(PY) scripts/gpu_check.py --bundle

# Locust, headless and bounded (LOADTEST_TIME), against a private service on 127.0.0.1 that it
# starts and stops: RL tool-call mix and session episodes, every status checked (LOADTEST_SESSIONS=
# with no value leaves the session users out).
# Writes reports/loadtest/{locust_stats.csv,locust_stats_history.csv,locust_failures.csv,locust.html,run.json}.
LOADTEST_USERS ?= 40
LOADTEST_TIME ?= 60s
LOADTEST_SESSIONS ?= 1
LOADTEST_OUT ?= reports/loadtest
loadtest: setup $(DEV)
	$(PY) loadtests/run_local.py --users $(LOADTEST_USERS) --run-time $(LOADTEST_TIME) \
	  $(if $(LOADTEST_SESSIONS),,--no-sessions) --out $(LOADTEST_OUT)

# Concurrency sweep of print and sympy against a private service on loopback, next to the fair
# baselines (a fresh interpreter per call from a plain venv with the same sympy/numpy, made once
# under ~/.cache/rl-sandbox, and `python -I -S -c`) in the same run (a few minutes).
# Writes reports/bench/{bench.json,bench.md,bench.png}.
BENCH_ARGS ?=
bench: setup
	$(VENV)/bin/rl-sandbox bench --out reports/bench $(BENCH_ARGS)

# The jail alone: latency, 2-core throughput and CPU per call, warm and cold, next to the same
# fair baselines, with alternating warm/baseline rounds.
BENCH_EXECUTOR_ARGS ?=
bench-executor: setup
	$(PY) scripts/bench_executor.py $(BENCH_EXECUTOR_ARGS)

# The ceiling of the design: the service's path with no program, and with only a fork of the
# zygote's heap per call, against the fair baseline in alternating rounds.
BENCH_CEILING_ARGS ?=
bench-ceiling: setup
	$(PY) scripts/design_ceiling.py $(BENCH_CEILING_ARGS)

# The images built and the compose stack run for real, with podman (Debian's, rootful, runc and
# cgroupfs: scripts/image/containers.conf): a local Debian base image (no registry; cached in
# podman's storage, keyed by its inputs, so clean clones on the same machine reuse it), the api
# and worker images of deploy/Dockerfile, deploy/compose.yaml under podman-compose, then the API
# contract, hostile programs, the images' quality, the worker's privileges, scaling and a worker
# lost under load. Tears everything down, also on failure or interrupt, and checks nothing of it
# is left. image-build alone builds (CPU-heavy, no container runs); reports/image/build.json
# has the images' sizes and build seconds.
IMAGE_DEB_PACKAGES := podman runc debootstrap patchelf uidmap netavark aardvark-dns iptables
image-build: setup $(DEV) $(DEPLOY)
	@$(MAKE) --no-print-directory system-packages DEB_PACKAGES="$(IMAGE_DEB_PACKAGES)"
	scripts/image/build.sh

# make test's step: image-test where podman is installed or installable (Debian's apt, as root).
IMAGE_TOOLS := podman runc debootstrap patchelf
image-test-if-possible:
	@if [ "$(IMAGE_TEST)" = 0 ]; then echo "image-test skipped (IMAGE_TEST=0)"; exit 0; fi; \
	$(MAKE) --no-print-directory system-packages DEB_PACKAGES="$(IMAGE_DEB_PACKAGES)" >&2 || true; \
	missing=""; for t in $(IMAGE_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  echo "image-test skipped: no$$missing on this machine, and apt could not install them" \
	    "(they need Debian's packages, installed as root; docs/deploy.md, 'Try it with podman or Docker')"; \
	  exit 0; \
	fi; \
	$(MAKE) --no-print-directory image-test

image-test: image-build
	RL_SANDBOX_IMAGE_TEST=1 IMAGE_TEST_PREBUILT=1 $(VENV)/bin/pytest tests/image -p no:cacheprovider --durations=5
