# The kit's front door. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The Python .venv is made with: PYTHON= when given; else, once .venv exists, the interpreter it was
# made with (whoever runs make: root at set-up, a student later); else the newest supported one on this
# machine (on the PATH, or installed by pyenv and not selected there: `python3 -m labkit.machine.envsetup
# pick-python`). uv never downloads one. Python 3.12 and newer get JAX 0.12, 3.11 JAX 0.10.2 (uv.lock).
# Interpreters are named by their real path, so that every user names the same one.
VENV ?= .venv
BASE_OF := import os, sys; print(os.path.realpath(sys.executable))
ifeq ($(origin PYTHON),undefined)
PYTHON_EXE := $(or $(shell $(VENV)/bin/python -c '$(BASE_OF)' 2>/dev/null),$(shell for p in python3 python3.13 python3.12 python3.11; do $$p -m labkit.machine.envsetup pick-python 2>/dev/null && break; done))
PYTHON := $(or $(PYTHON_EXE),python3)
endif
# (already found above, by its real path, unless PYTHON= was given or nothing was found)
PYTHON_EXE := $(or $(PYTHON_EXE),$(shell $(PYTHON) -c '$(BASE_OF)' 2>/dev/null))
export UV_PYTHON_DOWNLOADS := never
UV_VERSION := 0.13.9
PY := $(VENV)/bin/python
CONFIGS ?=
TIMEOUT ?= 120
EXTRAS ?=
FORCE ?=
# Which dependency groups go into .venv. Unset: the student's lean selection (the `notebook` group:
# the student loop and JupyterLab), plus whatever the goals need on top (`make test`: every group;
# `make lint`: lint), plus what .venv already has, so nothing installed is taken away again.
# Set, it is exact: DEP_GROUPS=notebook is the course image's selection.
DEP_GROUPS ?=
# FOR=test: `make setup FOR=test` installs what `make test` needs without running it (nox does so).
FOR ?=
# OFFLINE=1: install from WHEELHOUSE (made by `make wheelhouse`) with no index and no network.
OFFLINE ?=
WHEELHOUSE ?= wheelhouse
PIP_VERSION := 26.3
comma := ,
STUDENT_GROUPS := notebook
ALL_GROUPS = $(shell $(PYTHON) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['dependency-groups'])" 2>/dev/null)
GOALS := $(MAKECMDGOALS) $(FOR)
NEEDED_GROUPS = $(STUDENT_GROUPS) $(if $(filter test test-kit test-fast,$(GOALS)),$(ALL_GROUPS)) $(if $(filter lint,$(GOALS)),dev lint) \
  $(if $(filter docs,$(GOALS)),docs)
RECORDED := $(strip $(shell cat $(VENV)/.synced 2>/dev/null))
# What .venv has now: a stamp without --no-default-groups was written when every group was the default.
RECORDED_GROUPS = $(if $(wildcard $(VENV)/.synced),$(if $(findstring --no-default-groups,$(RECORDED)),\
  $(patsubst group=%,%,$(filter group=%,$(subst --group ,group=,$(RECORDED)))),$(ALL_GROUPS)))
# The extra (EXTRAS=tpu, EXTRAS=cuda): the one named; else the one .venv already has; else, for `make test` (and
# FOR=test) where JAX 0.12 installs (Python 3.12 and newer), `tpu`: libtpu, the TPU compiler of the compile-only
# TPU configurations (v5e-8, ...) whose tests then run instead of skipping. Never in the student's lean set-up.
RECORDED_EXTRAS = $(patsubst extra=%,%,$(filter extra=%,$(subst --extra ,extra=,$(RECORDED))))
TEST_EXTRAS = $(if $(filter test test-kit,$(GOALS)),$(if $(filter 1,$(shell $(PYTHON_EXE) -c 'import sys; print(int(sys.version_info >= (3, 12)))' 2>/dev/null)),tpu))
SETUP_EXTRAS = $(or $(EXTRAS),$(RECORDED_EXTRAS),$(TEST_EXTRAS))
# The part of uv.lock that `make setup` installs; recorded in .venv/.synced, and a different one re-syncs.
SELECTION := $(strip $(if $(PYTHON_EXE),--python $(PYTHON_EXE)) $(if $(SETUP_EXTRAS),--extra $(SETUP_EXTRAS)) --no-default-groups \
  $(addprefix --group ,$(if $(DEP_GROUPS),$(subst $(comma), ,$(DEP_GROUPS)),$(sort $(NEEDED_GROUPS) $(RECORDED_GROUPS)))))

# uv from the PATH when there is one; otherwise a private copy under .tools/, made once.
UV := $(or $(shell command -v uv 2>/dev/null),.tools/bin/uv)

.PHONY: help setup system-deps test test-fast test-kit test-other-jax test-other-jax-logged docs lab-% labs list configs student-notebooks check-student-notebooks bench clean
.PHONY: wheelhouse lint docker-base docker-build docker-lab docker-grade .selection-changed doctor

help: ## show this help
	@grep -hE '^[a-zA-Z%_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 28

# Python itself, present and new enough, before anything is installed with it (in each set-up recipe).
define check_python
@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: \`$(PYTHON)\` is not on the PATH: install Python 3.11 or newer \
  (Debian and Ubuntu: apt install python3 python3-venv), or name one: make ... PYTHON=/path/to/python3.11" >&2; exit 1; }
@$(PYTHON) -m labkit.machine.envsetup check-python
endef

.tools/bin/uv:
	$(check_python)
	@echo "Fetching uv $(UV_VERSION) into .tools/ (once; it is not on the PATH)."
	@$(PYTHON) -m venv .tools >/dev/null 2>&1 || { rm -rf .tools; echo "error: \`$(PYTHON) -m venv\` failed: this Python \
	  has no working venv module (Debian and Ubuntu: apt install python3-venv)" >&2; exit 1; }
	@.tools/bin/pip install --quiet --disable-pip-version-check $(if $(OFFLINE),--no-index --find-links $(WHEELHOUSE)) \
	  uv==$(UV_VERSION) || { rm -rf .tools; echo "error: could not install uv $(UV_VERSION) into .tools/ (see above)" >&2; exit 1; }

ifneq ($(SELECTION),$(RECORDED))
$(VENV)/.synced: .selection-changed
endif
.selection-changed: ;
$(VENV)/.synced: pyproject.toml uv.lock
	$(check_python)
	@test -x "$(UV)" || $(MAKE) --no-print-directory .tools/bin/uv OFFLINE=$(OFFLINE)
ifeq ($(OFFLINE),)
	@$(PYTHON) -m labkit.machine.envsetup sync --uv $(UV) --venv $(VENV) --log build/setup.log -- $(SELECTION)
else
	@rm -f $@
	@$(PYTHON) -m labkit.machine.wheelhouse missing --wheelhouse $(WHEELHOUSE) --uv $(UV) -- $(SELECTION)
	@$(PYTHON) -m labkit.machine.envsetup remove-other-venv --venv $(VENV)
	$(UV) venv --quiet --allow-existing --python $(PYTHON_EXE) --prompt labkit $(VENV)
	$(UV) export --quiet --frozen --no-emit-project --no-header --no-annotate $(SELECTION) -o $(VENV)/requirements.txt
	$(UV) pip sync --quiet --python $(PY) --offline --no-index --find-links $(WHEELHOUSE) --compile-bytecode $(VENV)/requirements.txt
	$(UV) pip install --quiet --python $(PY) --offline --no-index --find-links $(WHEELHOUSE) --no-deps -e .
	@echo '$(SELECTION)' > $@
endif

setup: $(VENV)/.synced ## create .venv from uv.lock, lean (FOR=test: the kit's tools too; EXTRAS=tpu on a TPU VM, EXTRAS=cuda with an NVIDIA GPU; OFFLINE=1)

wheelhouse: ## download every locked wheel for this machine (all groups, EXTRAS too) into wheelhouse/
	@test -x "$(UV)" || $(MAKE) --no-print-directory .tools/bin/uv
	@mkdir -p $(WHEELHOUSE)
	$(UV) export --quiet --frozen --all-groups $(if $(EXTRAS),--extra $(EXTRAS)) --no-emit-project --no-header \
	  --no-annotate -o $(WHEELHOUSE)/requirements.txt
	@py=$(PYTHON_EXE) && pip="$(UV) tool run --from pip==$(PIP_VERSION) pip --python $$py" && \
	set -x && $$pip download --quiet --disable-pip-version-check --only-binary :all: --no-deps --require-hashes \
	  -r $(WHEELHOUSE)/requirements.txt -d $(WHEELHOUSE) && \
	$$pip download --quiet --disable-pip-version-check --only-binary :all: -d $(WHEELHOUSE) \
	  $$($(PYTHON) -m labkit.machine.wheelhouse build-requires) uv==$(UV_VERSION)
	@$(PYTHON) -m labkit.machine.wheelhouse missing --wheelhouse $(WHEELHOUSE) --uv $(UV) -- \
	  --python $(PYTHON_EXE) --all-groups $(if $(EXTRAS),--extra $(EXTRAS))
	@echo "$(WHEELHOUSE)/: $$(ls $(WHEELHOUSE)/*.whl | wc -l) wheels, $$(du -sh $(WHEELHOUSE) | cut -f1)"

lab-%: setup ## run lab N on each device configuration: make lab-3 [CONFIGS=cpu-8] [TIMEOUT=120]
	@$(PY) -m labkit lab $* $(if $(CONFIGS),--configs $(CONFIGS)) --timeout $(TIMEOUT)

list: setup ## list the labs
	@$(PY) -m labkit list

doctor: ## what this machine can do for the kit and what is missing, with fixes [FOR=lab,grade,test,docker,browser]
	@if [ -f $(VENV)/.synced ]; then $(PY) -m labkit.machine.doctor --for $(or $(FOR),lab); \
	else $(PYTHON) -m labkit.machine.doctor --for $(or $(FOR),lab); fi

configs: setup ## list the device configurations and whether each runs here
	@$(PY) -m labkit configs

.PHONY: grade scoreboard gradescope isolation slurm-grade progress review
isolation: setup ## whether notebooks run in a sandbox here: which bwrap, or why none and the fix
	@$(PY) -m labkit isolation

# The TA's inputs, the course's state (labkit/grading/state/course.py, kept in OUT/course/): ROSTER=file gives
# --roster file, and so for every input its registry lists (asked of it when a grading target runs, so an
# input added there needs nothing here). Each one left out is the one kept from the class's last run.
COURSE_INPUTS = $(or $(shell $(PY) -m labkit.grading.state.course names 2>/dev/null),roster policy overrides extensions adjustments pins)
# The inputs the registry lists today, named here for readers (a test checks the two lists agree):
ROSTER ?=
POLICY ?=
OVERRIDES ?=
EXTENSIONS ?=
ADJUSTMENTS ?=
PINS ?=
upper = $(shell echo '$(1)' | tr 'a-z-' 'A-Z_')
# A value as one word of the shell, whatever it holds (a download the browser named `submissions (1).zip`).
quote = '$(subst ','\'',$(1))'
COURSE_FLAGS = $(foreach i,$(COURSE_INPUTS),$(if $($(call upper,$(i))),--$(i) $(call quote,$($(call upper,$(i))))))
# ... and what every grading path takes with them: which inputs to drop, a change of policy asked for by
# name, where the state is kept, and which units to grade again.
COURSE_ARGS = $(COURSE_FLAGS) $(if $(FORGET),--forget $(FORGET)) $(if $(CHANGE_POLICY),--change-policy) \
  $(if $(COURSE),--course $(call quote,$(COURSE))) $(if $(STUDENTS),--students $(STUDENTS)) $(if $(RETRY),--retry)

grade: setup ## grade a class: make grade [SUBMISSIONS=dir-or-zip] [OUT=scoreboard] [ROSTER=roster.csv] [POLICY=..] [OVERRIDES=..] [EXTENSIONS=..] [ADJUSTMENTS=..] [FORGET=overrides] [CHANGE_POLICY=1] [STUDENTS=id,id] [RETRY=1] [LABS=3,5] [CONFIGS=..] [JOBS=..] [SHARD=1/4] [ISOLATION=limits-only] [START=cold]
	@$(PY) -m labkit grade $(if $(SUBMISSIONS),--submissions $(call quote,$(SUBMISSIONS))) --out $(call quote,$(or $(OUT),scoreboard)) \
	  $(if $(LABS),--labs $(LABS)) $(if $(CONFIGS),--configs $(CONFIGS)) $(if $(JOBS),--jobs $(JOBS)) \
	  $(if $(SHARD),--shard $(SHARD)) $(COURSE_ARGS) \
	  $(if $(ISOLATION),--isolation $(ISOLATION)) $(if $(START),--start $(START)) --timeout $(TIMEOUT)

slurm-grade: setup ## grade on a Slurm cluster: make slurm-grade SHARDS=4 [SUBMISSIONS=..] [OUT=..] [ROSTER=..] [POLICY=..] [OVERRIDES=..] [EXTENSIONS=..] [STUDENTS=..] [RETRY=1] [LABS=..] [CONFIGS=..] [PARTITION=..] [ACCOUNT=..] [NO_WAIT=1]
	@test -n "$(SHARDS)" || { echo "usage: make slurm-grade SHARDS=N [SUBMISSIONS=..] [OUT=..]" >&2; exit 2; }
	@$(PY) -m labkit slurm-grade --shards $(SHARDS) $(if $(SUBMISSIONS),--submissions $(call quote,$(SUBMISSIONS))) \
	  --out $(call quote,$(or $(OUT),scoreboard)) $(if $(LABS),--labs $(LABS)) $(if $(CONFIGS),--configs $(CONFIGS)) \
	  $(if $(JOBS),--jobs $(JOBS)) $(if $(PARTITION),--partition $(PARTITION)) $(if $(ACCOUNT),--account $(ACCOUNT)) \
	  $(if $(NO_WAIT),--no-wait) $(COURSE_ARGS) --timeout $(TIMEOUT)

progress: setup ## how far a grading run (or its shards, on any engine) has got: make progress OUT=scoreboard [WATCH=1]
	@$(PY) -m labkit progress $(or $(OUT),scoreboard) $(if $(WATCH),--watch)

review: setup ## grade written answers by rubric in a browser on this machine: make review [OUT=scoreboard] [TA=name] [PORT=..]
	@$(PY) -m labkit review $(or $(OUT),scoreboard) $(if $(TA),--ta $(TA)) $(if $(PORT),--port $(PORT))

gradescope: setup ## the Gradescope autograder of one lab: make gradescope LAB=3 [POLICY=policy.toml] [ISOLATION=limits-only] -> build/gradescope/lab-3.zip
	@test -n "$(LAB)" || { echo "usage: make gradescope LAB=N" >&2; exit 2; }
	@$(PY) -m labkit gradescope $(LAB) $(if $(POLICY),--policy $(POLICY)) $(if $(ISOLATION),--isolation $(ISOLATION))

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
# Where one cannot be installed (no apt-get, no sudo, no network), it stops here with one line that names the
# packages and the fix, before any test runs (tests/kit/test_make_targets.py hides a package to check).
system-deps: ## install the Debian packages the kit's tests need (.ci/apt-packages.txt), when missing
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); missing=$$(echo $$missing); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  as=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$as apt-get update -qq && $$as apt-get install -y -qq --no-install-recommends $$missing; } || { \
	    echo "error: the kit's tests need Debian packages that are not installed and could not be installed here: $$missing (.ci/apt-packages.txt); fix: sudo apt-get install $$missing, then run make again" >&2; \
	    exit 1; }; \
	fi

# TEST_WORKERS: pytest-xdist workers, two more than the CPUs (at most 4): much of a test's time is spent
# waiting on a kernel, a container or the disk (on 2 CPUs, 4 workers left them idle 142 CPU-seconds of a
# run against 3 workers' 345); 0 runs the suite in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n + 2)))
test-fast: setup system-deps ## the fast tier: unit and contract tests, a few minutes; what a change runs first
	$(PY) -m pytest -m fast $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile) --durations=10

# SWEEP=full: every sweep whole (every reference on each of cpu-2, 4, 16 and 32, not a small and a large one).
# The two halves run side by side (make -j2): the suite's waits (containers, the disk, a cell that never ends)
# and its last minutes, when fewer tests are left than workers, leave CPUs idle that the other JAX's runs take.
# The other JAX's output goes to $(OTHER_LOG) and is shown whole once both are done. TEST_WORKERS=0: one
# after the other, in one process each.
OTHER_LOG ?= build/test-other-jax.log
test: setup system-deps check-student-notebooks ## the kit's own test suite and, beside it, the student loop on the other JAX
	@mkdir -p $(dir $(OTHER_LOG)); rm -f $(OTHER_LOG); \
	$(MAKE) --no-print-directory $(if $(filter 0,$(TEST_WORKERS)),-j1,-j2) test-kit test-other-jax-logged; status=$$?; \
	if [ -s $(OTHER_LOG) ]; then echo; echo "== the student loop on the other JAX ($(OTHER_LOG)) =="; cat $(OTHER_LOG); fi; \
	exit $$status

test-kit: setup system-deps check-student-notebooks ## the kit's own test suite (tests/kit) alone, in .venv
	$(if $(SWEEP),LABKIT_TEST_SWEEP=$(SWEEP) )$(PY) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile) --durations=25 --junitxml=build/test-kit.xml

# OTHER_WORKERS: the other JAX's workers beside the suite's (make test); alone (make test-other-jax), TEST_WORKERS.
OTHER_WORKERS ?= 2
test-other-jax-logged:
	@$(MAKE) --no-print-directory test-other-jax $(if $(filter 0,$(TEST_WORKERS)),,TEST_WORKERS=$(OTHER_WORKERS)) > $(OTHER_LOG) 2>&1 \
	  || { echo "test-other-jax failed: its output is in $(OTHER_LOG), and below once the suite is done"; exit 1; }

# The lock's other world: where .venv has Python 3.12 or newer (JAX 0.12), a Python 3.11 (JAX 0.10.2),
# and the other way round. There, in $(OTHER_VENV), every lab's reference and the student loop run
# again (tests/kit/test_student_loop.py, but the untouched handouts, which make test runs on the first JAX),
# the references on cpu-8 alone, the loop's other tests on cpu-1 and cpu-8 (no pod size: LABKIT_TEST_SWEEP=none).
# Skipped, with a line saying so, where no such Python is here.
OTHER_VENV ?= .venv-other
test-other-jax: ## every reference and the student loop on the lock's other JAX (Python 3.11 against 3.12+)
	@other=$$($(PYTHON) -m labkit.machine.envsetup pick-python --other-than $(PYTHON_EXE)) || { \
	  echo "test-other-jax: no Python here gives the lock's other JAX (3.11 against 3.12 or newer): tested on one JAX only."; \
	  exit 0; }; \
	echo "test-other-jax: the student loop on $$other ($(OTHER_VENV)/)"; \
	$(MAKE) --no-print-directory setup VENV=$(OTHER_VENV) PYTHON=$$other DEP_GROUPS=notebook,dev && \
	LABKIT_TEST_SWEEP=none $(OTHER_VENV)/bin/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --maxprocesses 4 --dist load) --durations=5 tests/kit/test_student_loop.py -k "not unmodified_student_notebook"

bench: setup ## benchmarks: the student loop and grading, against plain python
	$(PY) benchmarks/bench_lab.py
	$(PY) benchmarks/bench_grade.py

docs: setup ## the course and manual site, offline, into build/site (a broken link fails the build)
	@$(PY) -m labkit.course.docsite --out build/site

# What ruff checks (tests/kit/test_lint.py reads this line); mypy and vulture take theirs from pyproject.toml.
LINT_PATHS := labkit tests benchmarks tools noxfile.py
lint: setup ## ruff (check and format), mypy (labkit/), vulture (dead code), and hadolint on the Dockerfile
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/vulture
	$(VENV)/bin/hadolint Dockerfile

# The course image (see the Dockerfile and docker/): EXTRAS=tpu builds the TPU variant, labkit:tpu.
# Every docker target goes through docker/client.sh: a client that builds with BuildKit, the engine
# DOCKER_HOST names, and one clear line when that engine is missing, not running or refuses this user.
DOCKER_CLIENT := bash docker/client.sh
# Debian 13 (Python 3.13, so JAX 0.12, the JAX the course is written for); DEBIAN_SUITE=bookworm: Debian 12
# (Python 3.11, JAX 0.10.2).
DEBIAN_SUITE ?= trixie
BASE_IMAGE ?= labkit-base:$(DEBIAN_SUITE)
DEFAULT_BASE := labkit-base:$(DEBIAN_SUITE)
DEBIAN_MIRROR ?=
CA_CERTS ?=
IMAGE ?= labkit:$(or $(EXTRAS),cpu)
KIT_IN_IMAGE := /home/student/kit
PORT ?= 8888
LAB_NAME ?= labkit-lab
LAB_DIR ?= labs
GRADES ?= grades
GRADE_ARGS ?=
DOCKER_PIDS ?= 8192
# What bubblewrap needs to make the kit's sandbox inside the container, and no more (see docs/containers.md,
# "The course image"): the kit's seccomp profile, a /proc it may mount again, no capabilities.
# DOCKER_RUN_OPTS adds options of your own (e.g. --security-opt apparmor=unconfined on AppArmor hosts).
DOCKER_RUN_OPTS ?=
DOCKER_SANDBOX := --security-opt seccomp=$(CURDIR)/docker/seccomp.json --security-opt systempaths=unconfined \
  --security-opt no-new-privileges --cap-drop ALL --pids-limit $(DOCKER_PIDS) $(DOCKER_RUN_OPTS)

docker-base: ## a base image from Debian's packages (debootstrap; root): labkit-base:trixie [DEBIAN_SUITE=..] [DEBIAN_MIRROR=..]
	@bash docker/base.sh $(BASE_IMAGE) $(DEBIAN_SUITE) $(DEBIAN_MIRROR)

docker-build: ## build the course image labkit:cpu (EXTRAS=tpu: labkit:tpu, with libtpu) [BASE_IMAGE=..] [CA_CERTS=ca.crt]
	@$(DOCKER_CLIENT) version >/dev/null
	@$(if $(CA_CERTS),test -r "$(CA_CERTS)" || { echo "error: CA_CERTS=$(CA_CERTS) is not a readable file" >&2; exit 1; })
	@$(DOCKER_CLIENT) image inspect $(BASE_IMAGE) >/dev/null 2>&1 || \
	  if [ "$(BASE_IMAGE)" = "$(DEFAULT_BASE)" ]; then echo "$(BASE_IMAGE) is not there yet: make docker-base"; \
	    $(MAKE) --no-print-directory docker-base; fi
	$(DOCKER_CLIENT) build --build-arg BASE_IMAGE=$(BASE_IMAGE) $(if $(EXTRAS),--build-arg EXTRAS=$(EXTRAS)) \
	  $(if $(CA_CERTS),--secret id=ca$(comma)src=$(abspath $(CA_CERTS))) -t $(IMAGE) .

docker-lab: ## JupyterLab in the course image on http://localhost:8888, with labs/ mounted [PORT=8888] [LAB_DIR=labs]
	bash docker/run.sh "$(abspath $(LAB_DIR))" -- --rm --name $(LAB_NAME) $$([ -t 0 ] && echo -it) \
	  -p 127.0.0.1:$(PORT):8888 $(DOCKER_SANDBOX) -v "$(abspath $(LAB_DIR)):$(KIT_IN_IMAGE)/labs" $(IMAGE) \
	  jupyter lab --ip=0.0.0.0 --port=8888 --no-browser

# Each TA input given (ROSTER=.., ...) is mounted read-only by docker/grade.sh at /course-inputs/<name>/<its file name>,
# and the term's submissions each at the place the kept term names (GRADES/docker-sources.tsv).
DOCKER_COURSE = $(foreach i,$(COURSE_INPUTS),$(if $($(call upper,$(i))),--input $(call quote,$(i)=$($(call upper,$(i))))))
DOCKER_COURSE_ARGS = $(if $(FORGET),--forget $(FORGET)) \
  $(if $(CHANGE_POLICY),--change-policy) $(if $(STUDENTS),--students $(STUDENTS)) $(if $(RETRY),--retry)

docker-grade: ## grade the term (SUBMISSIONS added) into GRADES in the course image: no network, each notebook in the kit's sandbox [ROSTER=..] [POLICY=..] [OVERRIDES=..] [EXTENSIONS=..] [STUDENTS=..] [RETRY=1]
	@mkdir -p "$(GRADES)"
	bash docker/grade.sh "$(abspath $(GRADES))" $(call quote,$(SUBMISSIONS)) $(call quote,$(FORGET)) $(DOCKER_COURSE) \
	  -- --rm --network none $(DOCKER_SANDBOX) -v "$(abspath $(GRADES)):/grades" \
	  -v "$(CURDIR)/reference:$(KIT_IN_IMAGE)/reference:ro" \
	  -v "$(CURDIR)/tests/hidden:$(KIT_IN_IMAGE)/tests/hidden:ro" $(IMAGE) \
	  nox -s grade -- --out /grades $(if $(LABS),--labs $(LABS)) \
	  $(if $(CONFIGS),--configs $(CONFIGS)) $(if $(JOBS),--jobs $(JOBS)) --timeout $(TIMEOUT) $(DOCKER_COURSE_ARGS) \
	  $(GRADE_ARGS)

.PHONY: workshop-up workshop-links workshop-status workshop-run workshop-collect workshop-grade workshop-idle workshop-down
WORKSHOP := bash infra/workshop.sh
RUN ?= lab 3
RESULTS ?= build/workshop-results
workshop-up: ## check infra/workshop.tfvars, print the cost per hour and for the day, start the VMs [YES=1]
	$(WORKSHOP) up $(if $(YES),--yes)

workshop-links: ## per student, the one command that opens their JupyterLab (an IAP tunnel)
	$(WORKSHOP) links

workshop-status: ## the workshop VMs (preempted ones too) and whether the kit on each is ready
	$(WORKSHOP) status

workshop-run: ## on every VM, as its student: make workshop-run RUN="lab 3" | RUN="lab 3 --configs tpu"
	$(WORKSHOP) run $(RUN)

workshop-collect: setup ## every VM's notebooks back into RESULTS/submissions/<student>/
	$(WORKSHOP) collect $(RESULTS)

workshop-grade: setup ## collect, then grade RESULTS/submissions here with the hidden tests [LABS=3] [CONFIGS=..]
	WORKSHOP_RESULTS=$(RESULTS) $(WORKSHOP) grade $(if $(LABS),--labs $(LABS)) $(if $(CONFIGS),--configs $(CONFIGS))

workshop-idle: ## delete the TPU VMs that saved their labs/ and went idle [YES=1]
	$(WORKSHOP) idle $(if $(YES),--yes)

workshop-down: ## after workshop-collect: destroy everything, then list what labelled is left [YES=1] [FORCE=1]
	$(WORKSHOP) down $(if $(YES),--yes) $(if $(FORCE),--force)

clean: ## remove build outputs (keeps .venv)
	rm -rf build
