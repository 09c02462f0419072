"""Project files agree with each other."""
import re
import subprocess
import sys
import tomllib

import yaml

from tests.conftest import ROOT


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_declares_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(map(_norm, project)) == sorted(_norm(p) for p in pip if not p.startswith("-e"))
    assert "-e ." in pip and "python=3.11" in env["dependencies"]


def test_torch_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch==2.13.0" in project


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()


def test_workflow_examples_are_valid_github_workflows():
    files = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    assert len(files) == 2
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                          "vendor.github-workflows", *files], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
