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
# Which dependency groups go into .venv: empty for the default groups of pyproject.toml, or a list,
# e.g. DEP_GROUPS=notebook for the lean student environment the course image has.
DEP_GROUPS ?=
# OFFLINE=1: install from WHEELHOUSE (made by `make wheelhouse`) with no index and no network.
OFFLINE ?=
WHEELHOUSE ?= wheelhouse
PIP_VERSION := 26.3
comma := ,
# The part of uv.lock that `make setup` installs; recorded in .venv/.synced, and a different one re-syncs.
SELECTION := $(strip $(if $(EXTRAS),--extra $(EXTRAS)) \
  $(if $(DEP_GROUPS),--no-default-groups $(addprefix --group ,$(subst $(comma), ,$(DEP_GROUPS)))))

# uv from the PATH when there is one; otherwise a private copy under .tools/, made once.
UV := $(or $(shell command -v uv 2>/dev/null),.tools/bin/uv)

.PHONY: help setup system-deps test lab-% labs list configs student-notebooks check-student-notebooks bench clean
.PHONY: wheelhouse lint docker-build docker-lab docker-grade .selection-changed

help: ## show this help
	@grep -hE '^[a-zA-Z%_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 28

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet $(if $(OFFLINE),--no-index --find-links $(WHEELHOUSE)) uv==$(UV_VERSION)

ifneq ($(SELECTION),$(strip $(shell cat $(VENV)/.synced 2>/dev/null)))
$(VENV)/.synced: .selection-changed
endif
.selection-changed: ;
$(VENV)/.synced: pyproject.toml uv.lock
	@test -x "$(UV)" || $(MAKE) --no-print-directory .tools/bin/uv OFFLINE=$(OFFLINE)
ifeq ($(OFFLINE),)
	$(UV) sync --frozen $(SELECTION)
else
	@$(PYTHON) -m labkit.wheelhouse missing --wheelhouse $(WHEELHOUSE) --uv $(UV) -- $(SELECTION)
	$(UV) venv --quiet --allow-existing --prompt labkit $(VENV)
	$(UV) export --quiet --frozen --no-emit-project --no-header --no-annotate $(SELECTION) -o $(VENV)/requirements.txt
	$(UV) pip sync --quiet --python $(PY) --offline --no-index --find-links $(WHEELHOUSE) $(VENV)/requirements.txt
	$(UV) pip install --quiet --python $(PY) --offline --no-index --find-links $(WHEELHOUSE) --no-deps -e .
endif
	@echo '$(SELECTION)' > $@

setup: $(VENV)/.synced ## create .venv from uv.lock (EXTRAS=tpu on a TPU VM, EXTRAS=cuda with an NVIDIA GPU; DEP_GROUPS=notebook; OFFLINE=1)

wheelhouse: ## download every locked wheel for this machine (all groups, EXTRAS too) into wheelhouse/
	@test -x "$(UV)" || $(MAKE) --no-print-directory .tools/bin/uv
	@mkdir -p $(WHEELHOUSE)
	$(UV) export --quiet --frozen --all-groups $(if $(EXTRAS),--extra $(EXTRAS)) --no-emit-project --no-header \
	  --no-annotate -o $(WHEELHOUSE)/requirements.txt
	@py=$$($(UV) python find) && pip="$(UV) tool run --from pip==$(PIP_VERSION) pip --python $$py" && \
	set -x && $$pip download --quiet --disable-pip-version-check --only-binary :all: --no-deps --require-hashes \
	  -r $(WHEELHOUSE)/requirements.txt -d $(WHEELHOUSE) && \
	$$pip download --quiet --disable-pip-version-check --only-binary :all: -d $(WHEELHOUSE) \
	  $$($(PYTHON) -m labkit.wheelhouse build-requires) uv==$(UV_VERSION)
	@$(PYTHON) -m labkit.wheelhouse missing --wheelhouse $(WHEELHOUSE) --uv $(UV) -- \
	  --all-groups $(if $(EXTRAS),--extra $(EXTRAS))
	@echo "$(WHEELHOUSE)/: $$(ls $(WHEELHOUSE)/*.whl | wc -l) wheels, $$(du -sh $(WHEELHOUSE) | cut -f1)"

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

.PHONY: release
release: setup ## the student release, a folder and a .tar.gz without solutions or hidden tests [RELEASE=build/student-release]
	@$(PY) -m labkit release $(if $(RELEASE),--out $(RELEASE))

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

lint: setup ## lint the Dockerfile with hadolint (the locked `lint` group)
	$(VENV)/bin/hadolint Dockerfile

# The course image (see the Dockerfile): EXTRAS=tpu builds the TPU variant, labkit:tpu.
DOCKER ?= docker
IMAGE ?= labkit:$(or $(EXTRAS),cpu)
KIT_IN_IMAGE := /home/student/kit
PORT ?= 8888
SUBMISSIONS ?= submissions
GRADES ?= grades
DOCKER_USER := --user "$$(id -u):$$(id -g)"

docker-build: ## build the course image labkit:cpu (EXTRAS=tpu: labkit:tpu)
	$(DOCKER) build $(if $(EXTRAS),--build-arg EXTRAS=$(EXTRAS)) -t $(IMAGE) .

docker-lab: ## JupyterLab in the course image on http://localhost:8888, with labs/ mounted
	$(DOCKER) run --rm -it -p $(PORT):8888 $(DOCKER_USER) -v "$(CURDIR)/labs:$(KIT_IN_IMAGE)/labs" $(IMAGE) \
	  jupyter lab --ip=0.0.0.0 --port=8888 --no-browser

docker-grade: ## grade SUBMISSIONS into GRADES in the course image, with no network
	@mkdir -p "$(GRADES)"
	$(DOCKER) run --rm --network none $(DOCKER_USER) -v "$(abspath $(SUBMISSIONS)):/submissions:ro" \
	  -v "$(abspath $(GRADES)):/grades" -v "$(CURDIR)/reference:$(KIT_IN_IMAGE)/reference:ro" \
	  -v "$(CURDIR)/tests/hidden:$(KIT_IN_IMAGE)/tests/hidden:ro" $(IMAGE) \
	  nox -s grade -- --submissions /submissions --out /grades

.PHONY: workshop-up workshop-status workshop-run workshop-collect workshop-down
WORKSHOP := bash infra/workshop.sh
RUN ?= lab 3
RESULTS ?= build/workshop-results
workshop-up: ## start the workshop VMs of infra/workshop.tfvars; prints the cost per hour first [YES=1]
	$(WORKSHOP) up $(if $(YES),--yes)

workshop-status: ## the workshop VMs and whether the kit on each is ready
	$(WORKSHOP) status

workshop-run: ## on every VM: make workshop-run RUN="lab 3" | RUN="lab 3 --configs tpu" | RUN="grade --labs 3"
	$(WORKSHOP) run $(RUN)

workshop-collect: setup ## every VM's notebooks and results back into RESULTS, one merged scoreboard
	$(WORKSHOP) collect $(RESULTS)

workshop-down: ## destroy everything workshop-up created, then check nothing labelled is left [YES=1]
	$(WORKSHOP) down $(if $(YES),--yes)

clean: ## remove build outputs (keeps .venv)
	rm -rf build
