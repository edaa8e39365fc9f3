# rl-sandbox: `make run` starts the whole service locally, `make test` runs every test.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_VERSION ?= 3.12
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
STAMP := $(VENV)/.installed
DEB_PACKAGES := libnl-3-200 libnl-route-3-200 redis-server iproute2 g++
# One venv whose installed extras grow with the targets run: `make setup` (hence `make run`)
# installs the service alone; a target that needs an extra installs it once, stamped by
# .installed-<extra> and redone when pyproject.toml changes. uv keeps a package cache
# (~/.cache/uv), so a reinstall on the same machine is seconds, even with the several-GB PyTorch
# wheel of the `rl` extra. `make setup EXTRAS=dev,rl` adds extras to the setup.
EXTRAS ?=
comma := ,
extra = $(VENV)/.installed-$(1)
DEV := $(call extra,dev)
RL := $(call extra,rl)
DEPLOY := $(call extra,deploy)

.PHONY: help setup system-packages run test test-fast test-cgroup2 lint format bench bench-executor bench-ceiling loadtest deploy-check clean demo-rl image-build image-test image-test-if-possible

help:
	@echo "make run    - set up (the service alone) and run it locally (API on http://127.0.0.1:8000)"
	@echo "make test   - set up (with the dev, rl and deploy extras) and run the full test suite"
	@echo "make test-cgroup2 - tests/cgroup2 inside a cgroup v2 guest (QEMU)"
	@echo "make image-test - build the images, run the compose stack under podman and test it"
	@echo "make lint   - ruff and mypy"

setup: system-packages $(STAMP) $(foreach e,$(subst $(comma), ,$(EXTRAS)),$(call extra,$(e)))

system-packages:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  PYBIN=$$(scripts/find-python.sh $(PYTHON_VERSION)); \
	  echo "creating $(VENV) with $$PYBIN"; \
	  $$PYBIN -m venv $(VENV); \
	fi; \
	[ -x $(UV) ] || $(PY) -m pip install -q uv; \
	$(UV) pip install -q --compile-bytecode --python $(PY) -e .; \
	scripts/make-runtime-traversable.sh $(PY); \
	touch $(STAMP)

# An extra on top of the service (pip keeps the extras installed before).
$(VENV)/.installed-%: $(STAMP) pyproject.toml
	$(UV) pip install -q --compile-bytecode --python $(PY) -e '.[$*]'
	@touch $@

run: setup
	$(VENV)/bin/rl-sandbox up

# After the suite, tests/cgroup2 again on a real cgroup v2 kernel (test-cgroup2), unless this host
# is v2 already (then the suite ran them there) or CGROUP2_GUEST=0; then the images and the
# compose stack (image-test: 1.3 min with podman's storage warm, 4.3 cold), unless IMAGE_TEST=0
# or podman cannot be had on this machine (then a line says it was skipped, and why).
CGROUP2_GUEST ?= 1
IMAGE_TEST ?= 1
test: setup $(DEV) $(RL) $(DEPLOY)
	$(VENV)/bin/pytest
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
