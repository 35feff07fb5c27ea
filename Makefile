# ddp-workshop. Every target creates the Python environment first if it is missing.
#
# The environment lives outside the clone, in a cache folder named after a hash of the Python
# version and requirements.txt: a second clone, or a second `make test`, reuses the 5 GB install,
# and changing a pin gives a new environment. Override with `make VENV=/path/to/venv ...`.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ddp-workshop
ENV_KEY := $(shell $(PYTHON) -c 'import hashlib, sys; v = sys.version_info; print(f"py{v[0]}{v[1]}-" + hashlib.sha256(open("requirements.txt", "rb").read()).hexdigest()[:12])')
VENV ?= $(CACHE_DIR)/venv-$(ENV_KEY)
BIN := $(VENV)/bin
READY := $(VENV)/.ready

# The notebooks, the tests and every launched script import ddp_lib from this clone.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))

.PHONY: help setup lab run test test-browser lint browser bench exercises schedule clean

help:
	@echo "make setup   create the Python environment ($(VENV))"
	@echo "make lab     open the course in JupyterLab"
	@echo "make run     execute every notebook headless into build/ (notebooks and HTML pages)"
	@echo "make test    lint, unit tests, every notebook through nbval, a representative set in JupyterLab"
	@echo "make test-browser  the long sweep: every other notebook in JupyterLab, repeated launches"
	@echo "make bench   benchmarks: launch overhead, all-reduce bandwidth, training (docs/benchmarks.md)"
	@echo "make exercises  the learners' edition, solutions replaced by stubs, in build/exercises/"
	@echo "make schedule   regenerate docs/schedule.md (the instructor's plan) from the notebooks"
	@echo "make clean   remove build/, written scripts and run logs (keeps data/ and the environment)"

setup: $(READY)

# No prerequisite on purpose: the folder's name already changes with requirements.txt, and a
# fresh clone's file times must not trigger a reinstall. The marker is written last, so an
# interrupted install is redone from scratch.
$(READY):
	rm -rf "$(VENV)"
	$(PYTHON) -m venv "$(VENV)"
	"$(BIN)/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch "$@"

# Containers often run as root, which Jupyter refuses without --allow-root. LAB_ARGS adds more,
# e.g. make lab LAB_ARGS="--no-browser --port 8889".
LAB_ARGS ?=
lab: $(READY)
	cd notebooks && "$(BIN)/jupyter" lab $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

run: $(READY)
	rm -rf build/notebooks build/html
	"$(BIN)/jupyter" nbconvert --to notebook --execute --ExecutePreprocessor.timeout=1800 \
		--output-dir build/notebooks $(NOTEBOOKS)
	"$(BIN)/jupyter" nbconvert --to html --output-dir build/html build/notebooks/*.ipynb
	@echo
	@echo "Executed notebooks: $(CURDIR)/build/notebooks/"
	@echo "HTML pages:         $(CURDIR)/build/html/"

lint: $(READY)
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
# The browser drives a representative set here (tests/e2e says which); test-browser is the long
# sweep that CI runs after make test: every other notebook in JupyterLab, and 20 DDP launches in
# a row (tests marked `sweep`).
test test-browser: export DDP_WORKSHOP_DATASET ?= synthetic
test test-browser: export DDP_WORKSHOP_FULL_SIZE ?= 0
test: lint browser
	"$(BIN)/python" -m pytest tests $(NOTEBOOKS) -m "not sweep" --nbval-lax --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600 --durations=15

# The sweep also executes the learners' edition: its stubs are `...`, so this checks that no later
# cell depends on what a solution computed.
test-browser: browser exercises
	"$(BIN)/python" -m pytest tests -m sweep --durations=15
	"$(BIN)/python" -m pytest build/exercises/notebooks/*.ipynb --nbval-lax \
		--nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600

exercises: $(READY)
	rm -rf build/exercises
	"$(BIN)/python" -m workshop.exercises build/exercises

schedule: $(READY)
	"$(BIN)/python" -m workshop.schedule

# Programs, not tests: they print tables (and write build/bench/results.md). BENCH_ARGS passes
# options, e.g. make bench BENCH_ARGS="--quick" or BENCH_ARGS="--only notebooks".
BENCH_ARGS ?=
bench: export DDP_WORKSHOP_DATASET ?= synthetic
bench: $(READY)
	"$(BIN)/python" -m benchmarks.run_all $(BENCH_ARGS)

clean:
	rm -rf build notebooks/scripts notebooks/runs notebooks/checkpoints notebooks/results runs .pytest_cache .ruff_cache
