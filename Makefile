# The kit's front door. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.9
VENV := .venv
PY := $(VENV)/bin/python
CONFIGS ?=
TIMEOUT ?= 120
EXTRAS ?=
FORCE ?=

# uv from the PATH when there is one; otherwise a private copy under .tools/, made once.
UV := $(or $(shell command -v uv 2>/dev/null),.tools/bin/uv)

.PHONY: help setup system-deps test lab-% labs list configs student-notebooks check-student-notebooks bench clean

help: ## show this help
	@grep -hE '^[a-zA-Z%_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 28

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen $(if $(EXTRAS),--extra $(EXTRAS))
	@touch $@

setup: $(VENV)/.synced ## create .venv from uv.lock (EXTRAS=tpu on a TPU VM)

lab-%: setup ## run lab N on each device configuration: make lab-3 [CONFIGS=cpu-8] [TIMEOUT=120]
	@$(PY) -m labkit lab $* $(if $(CONFIGS),--configs $(CONFIGS)) --timeout $(TIMEOUT)

list: setup ## list the labs
	@$(PY) -m labkit list

configs: setup ## list the device configurations and whether each runs here
	@$(PY) -m labkit configs

.PHONY: grade scoreboard
grade: setup ## grade a class: make grade [SUBMISSIONS=submissions] [OUT=scoreboard] [LABS=3,5] [CONFIGS=..] [JOBS=..] [SHARD=1/4]
	@$(PY) -m labkit grade --submissions $(or $(SUBMISSIONS),submissions) --out $(or $(OUT),scoreboard) \
	  $(if $(LABS),--labs $(LABS)) $(if $(CONFIGS),--configs $(CONFIGS)) $(if $(JOBS),--jobs $(JOBS)) \
	  $(if $(SHARD),--shard $(SHARD)) --timeout $(TIMEOUT)

scoreboard: setup ## your results across labs and configurations, from your last `make lab-N` runs
	@$(PY) -m labkit scoreboard

student-notebooks: setup ## generate labs/ from reference/ (never overwrites an edited notebook unless FORCE=1)
	@$(PY) -m labkit student-notebooks $(if $(FORCE),--force)

check-student-notebooks: setup ## fail when labs/ is out of date with reference/
	@$(PY) -m labkit student-notebooks --check

APT_PACKAGES := $(shell grep -v '^\#' .ci/apt-packages.txt 2>/dev/null)
system-deps: ## install the Debian packages the kit's tests need (.ci/apt-packages.txt), when missing
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

test: setup system-deps check-student-notebooks ## the kit's own test suite
	$(PY) -m pytest

bench: setup ## benchmarks: the student loop and grading, against plain python
	$(PY) benchmarks/bench_lab.py
	$(PY) benchmarks/bench_grade.py

clean: ## remove build outputs (keeps .venv)
	rm -rf build
