# Every target is self-contained on a fresh machine: it creates $(VENV) with $(PYTHON) and
# installs the project into it when missing. The pinned torch comes from wherever pip finds it
# (a local CPU wheel on the course's machines; see README: Why torch is pinned).
#
#   make test PYTHON=python3.12        create .venv/ with that interpreter (if .venv/ is absent)
#   make test VENV=$CONDA_PREFIX       use an existing environment (e.g. conda's) instead of .venv/
#   make grade SUBMISSION=work/02_autograd.ipynb OUT=build/mine JOBS=4 GRADE_ARGS="--seed 1"
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
SUBMISSION ?= solutions
# OUT and JOBS reach `grader grade` only when given on make's command line, so the grader's CLI
# is the one source of their defaults (--out build/grades/<folder graded>, --jobs one per CPU
# core); a variable of the same name in the environment (OUT is a common one) is ignored.
GRADE_OUT  = $(if $(filter command line,$(origin OUT)),$(if $(OUT),--out $(OUT)))
GRADE_JOBS = $(if $(filter command line,$(origin JOBS)),$(if $(JOBS),--jobs $(JOBS)))
# further flags, e.g. GRADE_ARGS="--device cuda --seed 1234 --fail-under 60 --force"
GRADE_ARGS ?=
# e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" (README: Why torch
# is pinned)
TORCH_PIP_ARGS ?=

.PHONY: grade test seeds lab release venv clean gpu-check bench other-torch

# The stamp holds pyproject.toml's checksum and this checkout's folder: a pyproject.toml only
# newer (a fresh clone, a checkout) installs nothing again; another folder installs this one.
INSTALLED = $$(cksum < pyproject.toml) $(CURDIR)

$(STAMP): pyproject.toml
	@if [ -f $(STAMP) ] && [ "$$(cat $(STAMP))" = "$(INSTALLED)" ]; then \
		echo "$(VENV) has the course installed from here, as pyproject.toml asks"; \
		touch $(STAMP); exit 0; fi; \
	set -ex; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install --quiet --upgrade pip; \
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS); \
	$(PY) -m pip install --quiet -e .; \
	echo "$(INSTALLED)" > $(STAMP)

venv: $(STAMP)

# Grade every lab in solutions/ (full marks expected), or SUBMISSION=a notebook or a folder.
grade: $(STAMP)
	$(PY) -m grader grade $(SUBMISSION) $(GRADE_OUT) $(GRADE_JOBS) $(GRADE_ARGS)

# What learners read is formatted (ruff, lines of at most 99 characters, pyproject.toml).
FORMATTED := solutions $(wildcard labs/*/viz.py)

# The whole suite: the release is current, what learners read is formatted, the solution
# notebooks run top to bottom without an error in any cell and score full marks in the grader's
# own kernels (tests/test_labs_end_to_end.py), the grader's and every exercise's tests, and a
# learner's session in JupyterLab in a real browser (tests/test_browser.py). Two pytest workers
# (pytest-xdist), one test file each at a time, in the order tests/conftest.py collects them (the
# files that grade whole notebooks first, not last: --no-loadscope-reorder): the hostile
# submissions, graded by two processes of their own, run beside the rest.
test: $(STAMP)
	$(PY) -m grader release --check
	$(PY) -m ruff format --check $(FORMATTED)
	$(PY) -m ruff check --select E501 $(FORMATTED) notebooks grader
	$(PY) -m pytest tests -n 2 --dist loadfile --no-loadscope-reorder

# Every reference answer through its public and hidden checks on 50 seeds (make test grades
# each on seed 1234, then on as many more as a tenth of a second allows).
seeds: $(STAMP)
	SEED_BUDGET_S=0 $(PY) -m pytest tests/labs/test_reference_seeds.py -n 2 --dist load -rA

# Learners work on copies in work/ (never overwritten), so notebooks/ stays the clean release.
# JupyterLab opens on the first lab, with the course's kernel and settings (build/jupyter/).
lab: $(STAMP)
	$(PY) -m grader lab work

release: $(STAMP)
	$(PY) -m grader release

# How long grading takes here, against plain papermill, and how a batch scales with --jobs
# (README, "Performance"): tables on the console, everything in build/bench/bench.json. About
# 25 to 50 minutes on 2 cores; e.g. BENCH_ARGS="--repeat 1 --labs autograd --batch 4" for a taste.
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) tools/bench.py $(BENCH_ARGS)

# On a machine with a CUDA GPU, with the torch it has (any version), e.g.
#   make gpu-check VENV=/path/to/env-with-cuda-torch
# proves that the GPU-marked tests pass (pytest -m gpu), and that the reference solutions score
# full marks over what could run, graded with --device cuda then on the CPU (both with
# --allow-torch-mismatch: the results mark the exercises whose checks depend on torch 2.13.0),
# then prints a table per lab of seconds and scores, CPU versus CUDA (build/gpu-check/). It uses
# $(VENV) as given: it never installs torch there, only the project (pip --no-deps) and its other
# dependencies. Without CUDA it stops at once, saying so. Both gradings and the table run
# whatever the scores; the exit status is the first grading's that failed.
GPU_CHECK_OUT := build/gpu-check
# the project's dependencies but torch (pyproject.toml)
DEPS_BUT_TORCH = $(PY) -c "import tomllib; print(*(d for d in tomllib.load(open('pyproject.toml', \
	'rb'))['project']['dependencies'] if not d.startswith('torch==')))"

gpu-check:
	@test -x $(PY) || { echo "make gpu-check: no Python at $(PY); pass VENV= an environment \
	whose torch is a CUDA build"; exit 2; }
	@$(PY) -c "import sys, torch; torch.cuda.is_available() or sys.exit('make gpu-check needs \
	a CUDA GPU, and torch ' + torch.__version__ + ' in $(VENV) sees none: run it on a GPU \
	machine, with VENV= an environment whose torch is a CUDA build')"
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip install --quiet $$($(DEPS_BUT_TORCH))
	$(PY) -m pytest tests -m gpu -q
	$(PY) -m grader grade solutions --device cuda --allow-torch-mismatch --force \
		--fail-under 100 --out $(GPU_CHECK_OUT)/cuda; cuda=$$?; \
	$(PY) -m grader grade solutions --device cpu --allow-torch-mismatch --force \
		--fail-under 100 --out $(GPU_CHECK_OUT)/cpu; cpu=$$?; \
	$(PY) -m grader timings $(GPU_CHECK_OUT)/cpu $(GPU_CHECK_OUT)/cuda && \
	exit $$(( cuda ? cuda : cpu ))

# Grade the reference solutions under another torch and print the exercises that differ from
# the pinned release (both graded here with seed 1234, on the CPU):
#   make other-torch OTHER=/path/to/venv-with-that-torch
# It installs the project (pip --no-deps, editable) and its other dependencies into OTHER, never
# torch; results in build/other-torch/{pinned,other}; exit 1 when an exercise differs.
OTHER_OUT := build/other-torch

other-torch: $(STAMP)
	@test -x $(OTHER)/bin/python || { echo "make other-torch: pass OTHER= a virtual \
	environment that has the torch to try"; exit 2; }
	$(OTHER)/bin/python -m pip install --quiet --no-deps -e .
	$(OTHER)/bin/python -m pip install --quiet $$($(DEPS_BUT_TORCH))
	$(PY) -m grader grade solutions --device cpu --seed 1234 --force \
		--out $(OTHER_OUT)/pinned > /dev/null || true
	$(OTHER)/bin/python -m grader grade solutions --device cpu --seed 1234 --force \
		--allow-torch-mismatch --out $(OTHER_OUT)/other > /dev/null || true
	$(PY) -m grader compare $(OTHER_OUT)/pinned $(OTHER_OUT)/other

clean:
	rm -rf build .pytest_cache
