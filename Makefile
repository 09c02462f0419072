# Every target is self-contained on a fresh machine: it creates .venv/ and installs the
# project into it when missing. The pinned CPU torch comes from the local wheel where pip finds one.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
OUT     ?= build/grades
SUBMISSION ?= solutions

.PHONY: grade test lab release venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

venv: $(STAMP)

grade: $(STAMP)
	$(PY) -m grader grade $(SUBMISSION) --out $(OUT)

test: $(STAMP)
	$(PY) -m grader release --check
	$(PY) -m pytest

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

release: $(STAMP)
	$(PY) -m grader release

clean:
	rm -rf build .pytest_cache
