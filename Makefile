# Two entry points: `make test` (everything CI runs) and `make demo` (provision the sandbox).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV        := .venv
VENV_STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements/dev.lock | sha256sum | cut -c1-12)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

TEST_BUNDLE := $(CURDIR)/build/bundles/test
SCENARIOS   ?= airgap host_tuning gpu artifacts datastores control_node stack scaleout

# What molecule, the sandbox inventory and the tests read.
export LABCTL_BUNDLE = $(TEST_BUNDLE)
export LABCTL_TEST_IMAGE = $(shell scripts/build-base-image.sh --print-tag)
export LABCTL_BUNDLE_FINGERPRINT = $(shell [ -f $(TEST_BUNDLE)/manifest.json ] && jq -r .signing_key.fingerprint $(TEST_BUNDLE)/manifest.json)
export ANSIBLE_FORCE_COLOR ?= 0
export PY_COLORS ?= 0

.PHONY: help venv host-tools image bundle-test lint unit molecule test demo demo-down clean

help:
	@echo "make test   - lint, unit tests and the molecule scenarios (what CI runs)"
	@echo "make demo   - provision the network-less sandbox container with site.yml"

venv: $(VENV_STAMP)
$(VENV_STAMP): pyproject.toml requirements/dev.lock
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c requirements/dev.lock -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

host-tools:
	scripts/ensure-host-tools.sh

image: host-tools
	scripts/build-base-image.sh >/dev/null

# The test bundle also carries stub NVIDIA packages (tests/fixtures/nvidia-repo, test doubles).
bundle-test: venv image
	python3 tests/fixtures/nvidia-repo/build.py >/dev/null
	python3 tests/fixtures/kernel-repo/build_kernels.py >/dev/null
	python3 tests/fixtures/grafana/build.py >/dev/null
	python3 tests/fixtures/vllm-dist/build_vllm_dist.py >/dev/null
	python3 scripts/make-tiny-model.py build/models/tiny-llama/r1 >/dev/null
	python3 scripts/make-tiny-model.py build/models/tiny-embed/r1 --seed 3 >/dev/null
	labctl bundle build --profile test --out $(TEST_BUNDLE) --base-image $(LABCTL_TEST_IMAGE)
	labctl bundle verify $(TEST_BUNDLE)

lint: venv
	yamllint --strict .
	ansible-lint
	ansible-playbook --syntax-check site.yml -i inventories/lab
	mypy
	ruff check .

# After the bundle: some tests read the pinned wheels (metric names in vLLM's and LiteLLM's source),
# and run the real LiteLLM proxy from its wheel set (tests/unit/gateway_proxy.py), in build/gateway-venv:
# made once per lock (its sha256 in .stamp, which the tests also check).
GATEWAY_VENV := $(CURDIR)/build/gateway-venv
unit: venv host-tools bundle-test
	$(MAKE) --no-print-directory unit-run

$(GATEWAY_VENV)/.stamp: $(TEST_BUNDLE)/wheels/sets/litellm.txt
	rm -rf $(GATEWAY_VENV)
	python3 -m venv $(GATEWAY_VENV)
	$(GATEWAY_VENV)/bin/pip install -q --no-index --find-links $(TEST_BUNDLE)/wheels --no-deps --require-hashes -r $<
	sha256sum $< | cut -c1-64 > $@

.PHONY: unit-run lab-parts-run
unit-run: $(GATEWAY_VENV)/.stamp
	pytest tests/unit

# The fingerprint is read after the bundle exists, so molecule runs in a sub-make.
molecule: bundle-test
	$(MAKE) --no-print-directory molecule-run

.PHONY: molecule-run
# MOLECULE_ARGS=--destroy=never keeps the containers of the last scenario for a look (molecule destroy -s S).
molecule-run:
	@for s in $(SCENARIOS); do echo "=== molecule test -s $$s $(MOLECULE_ARGS)"; molecule test -s $$s $(MOLECULE_ARGS); done

# Everything CI runs. The bundle first, then the jobs two at a time, longest first (scripts/run-jobs.py:
# a converge keeps about one core busy); each job's log is printed whole when it ends, then a table of
# durations (build/test-logs/durations.json). TEST_JOBS=1 runs them one after another.
# stack and unit first, then scaleout (one replica per GPU host, without its `extended` patch test) once unit
# ends: the two scenarios' replicas never start at the same time (each vLLM CPU engine's start takes a core
# for minutes; side by side the stack's first start took 590 s, 2026-12-07), then the short ones
# (figures: docs/testing.md).
TEST_JOBS ?= 2
TEST_JOB_ORDER := stack unit scaleout gpu datastores control_node lab-parts airgap artifacts lint host_tuning
test: venv host-tools bundle-test
	python3 scripts/run-jobs.py --jobs $(TEST_JOBS) $(foreach j,$(TEST_JOB_ORDER),'$(j)=$(call test-job,$(j))')

# The command of a job of `make test`: a scenario of SCENARIOS, or one of lint, unit, lab-parts. The
# lab-parts job leaves out the lab's CUDA vLLM set installed offline (tests/bundle/test_lab_vllm_offline.py:
# 3.6 GiB from PyPI, an 8 GiB venv, FlashInfer compiled; about 550 s of a 2-core machine): `make lab-parts`
# and `make lab-wheels-check` run it. With it, make test took 3,593 s of jobs in CI (2026-12-07), over
# its 60 minutes.
TEST_LAB_PARTS_ARGS := --ignore=tests/bundle/test_lab_vllm_offline.py
test-job = $(MAKE) --no-print-directory $(if $(filter $(1),$(SCENARIOS)),molecule-run SCENARIOS=$(1),$(1)$(if $(filter lint,$(1)),,-run)$(if $(filter lab-parts,$(1)), LAB_PARTS_ARGS=$(TEST_LAB_PARTS_ARGS)))

# The lab's CUDA vLLM set from its committed lock, built, installed offline in a network-less Debian 12
# container and proven there without a GPU (tests/bundle/test_lab_vllm_offline.py; also run by make
# lab-parts, so by make test). Figures: build/reports/lab-wheels.json.
.PHONY: lab-wheels-check
lab-wheels-check: venv bundle-test
	pytest -p no:cacheprovider -s tests/bundle/test_lab_vllm_offline.py

# The lab bundle's parts against the real registries (network: PyPI, deb.debian.org; docker):
# the apt part for Debian 12 with the strict NVIDIA double, the wheel sets resolved per OS.
.PHONY: lab-parts
lab-parts: venv bundle-test
	$(MAKE) --no-print-directory lab-parts-run
lab-parts-run:
	pytest -p no:cacheprovider -s tests/bundle $(LAB_PARTS_ARGS)

# The gpu scenario against NVIDIA's Ubuntu repositories (stub packages with Ubuntu's names and
# versions, tests/fixtures/nvidia-repo/README.md): a bundle per flavour, then `molecule test -s gpu`.
# `make test` runs the Debian flavour (the test bundle); this target
# runs the ones given (all by default). The containers stay Debian 12: only Debian's archive is
# reachable here (docs/verification.md).
GPU_FLAVOURS ?= ubuntu2404 ubuntu2204
.PHONY: test-gpu-flavours
test-gpu-flavours: bundle-test
	@for f in $(GPU_FLAVOURS); do \
	  echo "=== molecule test -s gpu, NVIDIA repository flavour $$f"; \
	  python3 tests/fixtures/nvidia-repo/flavour_profile.py $$f build/profiles/test-$$f.yml && \
	  labctl bundle build --profile build/profiles/test-$$f.yml --out build/bundles/test-$$f \
	    --base-image $(LABCTL_TEST_IMAGE) >/dev/null && \
	  LABCTL_BUNDLE=$(CURDIR)/build/bundles/test-$$f LABCTL_NVIDIA_FLAVOUR=$$f molecule test -s gpu || exit 1; \
	done

# The whole scaleout scenario: three hosts on an internal network, four vLLM replicas, a GPU host stopped
# mid-run, a driver change rebooting the GPU hosts one at a time, and its tests marked `extended` too (the
# security updates through `labctl patch`, 11 min: make test's scaleout job skips them for time;
# docs/runbooks/scale-out.md). The fingerprint is read after the bundle exists.
.PHONY: test-scaleout
test-scaleout: bundle-test
	LABCTL_TEST_EXTENDED=1 $(MAKE) --no-print-directory molecule-run SCENARIOS=scaleout

# Not in `make test` (CI budget): the stack scenario with its tests marked `extended` too
# (molecule/conftest.py: a power cut, the compile cache's gain, drift through a whole check-mode run,
# a rule change's reload, a PostgreSQL restart under the gateway).
.PHONY: test-extended
test-extended: bundle-test
	LABCTL_TEST_EXTENDED=1 $(MAKE) --no-print-directory molecule-run SCENARIOS=stack

# Not a test: staging speed vs rsync -a and sha256sum on synthetic weights (8 x 1 GiB, 3 rounds; BENCH_FILES,
# BENCH_SIZE, BENCH_WORKERS, BENCH_ROUNDS change it). Table on stdout, JSON in build/bench-artifacts.json.
.PHONY: bench-artifacts
bench-artifacts: venv
	python3 scripts/bench-artifacts.py

# Not a test: the lab's gateway settings vs the project's (`labctl gateway-config -i bench/inventory`), each
# through the real LiteLLM in front of two vLLM stand-ins, same seeded load (bench/README.md, ~15 min).
# LiteLLM comes from the test bundle's wheel set into build/bench-venv; JSON and PNG in build/bench-gateway/.
BENCH_VENV := $(CURDIR)/build/bench-venv
$(TEST_BUNDLE)/wheels/sets/litellm.txt:
	$(MAKE) --no-print-directory bundle-test
$(BENCH_VENV)/.stamp: bench/requirements.txt $(TEST_BUNDLE)/wheels/sets/litellm.txt
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --no-index --find-links $(TEST_BUNDLE)/wheels --no-deps --require-hashes \
		-r $(TEST_BUNDLE)/wheels/sets/litellm.txt
	$(BENCH_VENV)/bin/pip install -q -r bench/requirements.txt
	touch $@

.PHONY: bench-gateway
bench-gateway: venv $(BENCH_VENV)/.stamp
	command -v redis-server >/dev/null || apt-get install -y -q redis-server
	$(BENCH_VENV)/bin/python bench/gateway_bench.py

# Not a test: site.yml's first converge on a fresh sandbox container (labctl-benchprov) and the no-op re-run
# (target <= 60 s, changed=0, no service restarted), with the ten slowest tasks of each; JSON in
# build/bench-provision.json. BENCH_KEEP=1 keeps the container, BENCH_RERUN_ONLY=1 times only the re-run.
.PHONY: bench-provision
bench-provision: bundle-test
	$(MAKE) --no-print-directory bench-provision-run

.PHONY: bench-provision-run
bench-provision-run:
	python3 scripts/bench-provision.py

# Not a test: the no-op re-run of site.yml over SSH (an sshd container on an internal network), with the
# one-call file plugins, without them (LABCTL_FILE_ACTIONS=builtin) and with Mitogen; build/bench-ssh.json.
.PHONY: bench-ssh
bench-ssh: bundle-test
	$(MAKE) --no-print-directory bench-ssh-run

.PHONY: bench-ssh-run
bench-ssh-run:
	python3 scripts/bench-ssh.py

demo: bundle-test
	$(MAKE) --no-print-directory demo-run

.PHONY: demo-run
demo-run:
	scripts/sandbox.sh up
	ansible-playbook site.yml -i inventories/sandbox
	@echo; echo "=== what site.yml did inside the sandbox (docker exec labctl-sandbox ...)"
	scripts/sandbox.sh report

demo-down:
	scripts/sandbox.sh down

clean: demo-down
	rm -rf build
