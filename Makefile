# Every target is self-contained on a fresh machine: it creates .venv/ and installs the
# project into it when missing. The pinned CPU torch comes from the local wheel where pip finds one.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
OUT     ?= build/grades
SUBMISSION ?= solutions
JOBS    ?= $(shell nproc 2>/dev/null || echo 1)
# e.g. GRADE_ARGS="--device cuda --seed 1234 --fail-under 60 --force"
GRADE_ARGS ?=
# e.g. TORCH_PIP_ARGS="--index-url <the CPU wheel index>" (see README: Why torch is pinned)
TORCH_PIP_ARGS ?=

.PHONY: grade test lab release venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

venv: $(STAMP)

# Grade every lab in solutions/ (full marks expected), or SUBMISSION=a notebook or a folder.
grade: $(STAMP)
	$(PY) -m grader grade $(SUBMISSION) --out $(OUT) --jobs $(JOBS) $(GRADE_ARGS)

# The whole suite: the release is current, the solution notebooks run top to bottom (nbval,
# lax mode), the grader's and every exercise's tests.
test: $(STAMP)
	$(PY) -m grader release --check
	$(PY) -m pytest tests solutions --nbval-lax

# Learners work on copies in work/ (never overwritten), so notebooks/ stays the clean release.
lab: $(STAMP)
	mkdir -p work && cp -n notebooks/*.ipynb work/
	$(VENV)/bin/jupyter lab work/ $(if $(filter 0,$(shell id -u)),--allow-root)

release: $(STAMP)
	$(PY) -m grader release

clean:
	rm -rf build .pytest_cache
