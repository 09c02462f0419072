"""Project files agree with each other."""
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
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
    assert len(files) == 3
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                          "vendor.github-workflows", *files], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_actionlint_knows_every_self_hosted_runner_label():
    """actionlint refuses a runner label it does not know: .github/actionlint.yaml declares the
    self-hosted ones the workflows use (beside `self-hosted` itself)."""
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    used = set()
    for path in (ROOT / ".github" / "workflows").glob("*.yml"):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            labels = job.get("runs-on", [])
            labels = [labels] if isinstance(labels, str) else labels
            if "self-hosted" in labels:
                used |= set(labels) - {"self-hosted"}
    assert used == {"gpu"} and used <= set(config["self-hosted-runner"]["labels"])


# ------------------------------------------------------------------ Makefile

def _make_n(*args: str, env: dict | None = None) -> str:
    """What ``make -n ARGS`` would run, with an installed environment (a fresh stamp in a
    temporary VENV) so only the target's own commands show. Variables of an outer make (when
    the suite runs under ``make test OUT=...``) are not passed on."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL", "OUT", "JOBS",
                          "VENV", "PYTHON", "GRADE_ARGS", "SUBMISSION")}
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "env"
        venv.mkdir()
        (venv / ".installed").touch()  # newer than pyproject.toml
        run = subprocess.run(["make", "-n", "-C", str(ROOT), f"VENV={venv}", *args],
                             capture_output=True, text=True, env={**clean, **(env or {})})
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _grade_line(out: str) -> list[str]:
    lines = [line.split() for line in out.splitlines() if "-m grader grade" in line]
    assert len(lines) == 1, out
    return lines[0][lines[0].index("grade") + 1:]


def test_make_grade_leaves_out_and_jobs_to_the_grader_unless_given():
    assert _grade_line(_make_n("grade")) == ["solutions"]
    # an OUT or JOBS in the environment (OUT is a common variable) is not taken for one
    assert _grade_line(_make_n("grade", env={"OUT": "/elsewhere", "JOBS": "9"})) == ["solutions"]
    assert _grade_line(_make_n("grade", "OUT=", "JOBS=")) == ["solutions"]


def test_make_grade_passes_out_jobs_and_grade_args_when_given():
    args = _grade_line(_make_n("grade", "SUBMISSION=work/02_autograd.ipynb", "OUT=build/mine",
                               "JOBS=3", "GRADE_ARGS=--seed 1 --force"))
    assert args == ["work/02_autograd.ipynb", "--out", "build/mine", "--jobs", "3",
                    "--seed", "1", "--force"]


def test_an_environment_installed_from_this_checkout_is_not_installed_again(tmp_path):
    """A fresh clone (or a checkout) makes pyproject.toml newer than the stamp: when its
    content and the checkout's folder are those the stamp records, nothing is installed."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "VENV")}
    checksum = subprocess.run("cksum < pyproject.toml", shell=True, cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    venv = tmp_path / "env"
    venv.mkdir()
    (venv / ".installed").write_text(f"{checksum} {ROOT}\n")
    os.utime(venv / ".installed", (0, 0))  # older than pyproject.toml
    run = subprocess.run(["make", "-C", str(ROOT), f"VENV={venv}", "venv"],
                         capture_output=True, text=True, env=clean)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "has the course installed from here" in run.stdout and "pip" not in run.stdout
    assert (venv / ".installed").stat().st_mtime > 0  # (touched: up to date for make)


def test_make_creates_the_environment_with_the_chosen_python(tmp_path):
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "PYTHON")}
    for extra, python in (([], "python3"), (["PYTHON=python3.12"], "python3.12")):
        run = subprocess.run(["make", "-n", "-C", str(ROOT), f"VENV={tmp_path / 'new'}", "venv",
                              *extra], capture_output=True, text=True, env=clean)
        assert run.returncode == 0, run.stderr
        assert f"|| {python} -m venv {tmp_path / 'new'}" in run.stdout, run.stdout


def _commands(out: str) -> list[str]:
    """The shell commands of ``make -n`` output, continuation lines joined (make's own
    ``make: Entering directory`` lines left out)."""
    return [" ".join(line.split()) for line in re.sub(r"\\\n", " ", out).splitlines()
            if not line.startswith("make")]


def test_make_gpu_check_keeps_the_machine_s_torch_and_checks_cuda_first(tmp_path):
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    # an environment make has not installed (no stamp): nothing may install torch into it
    run = subprocess.run(["make", "-n", "-C", str(ROOT), f"VENV={tmp_path}", "gpu-check"],
                         capture_output=True, text=True, env=clean)
    assert run.returncode == 0, run.stderr
    commands = _commands(run.stdout)
    assert commands[0].startswith(f"test -x {tmp_path}/bin/python ||")
    assert commands[1].startswith(f"{tmp_path}/bin/python -c")
    assert "torch.cuda.is_available() or sys.exit(" in commands[1]  # before anything else
    assert not any("-m venv" in c or "install --quiet torch" in c for c in commands)
    assert commands[2].endswith("-m pip install --quiet --no-deps -e .")
    assert "if not d.startswith('torch==')" in commands[3]  # the other dependencies
    assert commands[4].endswith("-m pytest tests -m gpu -q")
    # both gradings and the table run whatever the scores; the status is the first failure's
    assert len(commands) == 6 and commands[5].endswith("&& exit $(( cuda ? cuda : cpu ))")
    grades = [part.split("-m grader ", 1)[1].split()
              for part in re.split(r"; | && ", commands[5]) if "-m grader " in part]
    assert grades == [
        ["grade", "solutions", "--device", "cuda", "--allow-torch-mismatch", "--force",
         "--fail-under", "100", "--out", "build/gpu-check/cuda"],
        ["grade", "solutions", "--device", "cpu", "--allow-torch-mismatch", "--force",
         "--fail-under", "100", "--out", "build/gpu-check/cpu"],
        ["timings", "build/gpu-check/cpu", "build/gpu-check/cuda"]]


def test_make_gpu_check_stops_at_once_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: gpu-check would run")
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    run = subprocess.run(["make", "-C", str(ROOT), f"VENV={sys.prefix}", "gpu-check"],
                         capture_output=True, text=True, env=clean, timeout=120)
    assert run.returncode != 0
    assert "make gpu-check needs a CUDA GPU, and torch" in run.stderr
    assert "sees none: run it on a GPU machine" in run.stderr
    assert "pip" not in run.stdout and "pytest" not in run.stdout  # nothing else ran


def test_pytest_knows_the_gpu_marker():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert any(m.startswith("gpu:") for m in options["ini_options"]["markers"])


# ------------------------------------------------------------------ what git keeps

def test_git_ignores_what_make_and_the_grader_write():
    written = [".venv/bin/python", "build/grades/solutions/gradebook.csv",
               "work/02_autograd.ipynb", "submissions/alice/02_autograd.ipynb",
               "grades/gradebook.csv", "pytorch_internals_course.egg-info/PKG-INFO",
               "grader/__pycache__/cli.pyc"]
    kept = ["solutions/01_dispatcher.ipynb", "notebooks/01_dispatcher.ipynb",
            "labs/autograd/lab.toml", "tests/fixtures/labs/toy/lab.toml",
            ".github/workflows/grade-gpu.yml"]
    run = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
                         input="\n".join(written + kept), capture_output=True, text=True)
    assert run.returncode in (0, 1), run.stderr
    assert sorted(run.stdout.split()) == sorted(written)


# ------------------------------------------------------------------ workflows

def _workflow(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def _steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_gpu_workflow_starts_each_run_from_a_clean_checkout():
    """A self-hosted runner keeps its workspace: results of an earlier run left in the grades
    folder would be counted in this run's reports, so the checkout must clean it (the default)."""
    steps = _steps(_workflow("grade-gpu.yml"))
    checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout")]
    assert checkouts, "grade-gpu.yml checks nothing out"
    for step in checkouts:
        assert step.get("with", {}).get("clean", True) is True, step
    # nor is the environment (which `make` creates when missing) kept inside the workspace
    assert any("VENV=" in s.get("run", "") and "GITHUB_ENV" in s.get("run", "") for s in steps)


def test_workflows_grade_into_the_workspace_folder_they_upload_and_publish():
    for name in ("grade-cpu.yml", "grade-gpu.yml"):
        steps = _steps(_workflow(name))
        grade = [s["run"] for s in steps if "make grade" in s.get("run", "")]
        assert len(grade) == 1, name
        out = re.search(r"\bOUT=(\S+)", grade[0])
        assert out, f"{name}: make grade without OUT= (the grader's default folder differs)"
        out = out.group(1).rstrip("/")
        # a relative folder inside the checkout, which the checkout cleans
        assert not out.startswith(("/", "~", "$", "..")) and ".." not in out.split("/"), name
        uploads = [s["with"]["path"] for s in steps if "upload-artifact" in s.get("uses", "")]
        junit = [s["with"]["files"] for s in steps if "publish-unit-test" in s.get("uses", "")]
        assert [p.rstrip("/") for p in uploads] == [out], name
        assert junit == [f"{out}/junit.xml"], name


def test_sharded_workflow_grades_one_shard_per_runner_and_merges_them(tmp_path):
    workflow = _workflow("grade-sharded.yml")
    plan = workflow["jobs"]["plan"]["steps"][0]["run"]
    output = tmp_path / "output"
    run = subprocess.run(["bash", "-c", plan], env={**os.environ, "SHARDS": "3",
                                                    "GITHUB_OUTPUT": str(output)},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert output.read_text() == "shards=[1, 2, 3]\n"
    shard = workflow["jobs"]["shard"]
    assert shard["strategy"]["matrix"]["k"] == "${{ fromJSON(needs.plan.outputs.shards) }}"
    grade = next(s for s in shard["steps"] if "make grade" in s.get("run", ""))
    assert grade["env"]["SHARD"] == "${{ matrix.k }}/${{ inputs.shards }}"
    assert "--shard $SHARD" in grade["run"] and "--seed $SEED" in grade["run"]
    assert "OUT=build/shard " in grade["run"]
    upload = next(s for s in shard["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["with"] == {"name": "shard-${{ matrix.k }}", "path": "build/shard"}
    merge = workflow["jobs"]["merge"]
    assert merge["needs"] == "shard" and merge["if"].startswith("always()")
    download = next(s for s in merge["steps"] if "download-artifact" in s.get("uses", ""))
    assert download["with"] == {"pattern": "shard-*", "path": "build/shards"}
    assert any("-m grader merge build/shards/* --out build/grades" in s.get("run", "")
               for s in merge["steps"])
    junit = [s["with"]["files"] for s in merge["steps"] if "publish-unit" in s.get("uses", "")]
    assert junit == ["build/grades/junit.xml"]


# ------------------------------------------------------------------ README

def test_readme_names_only_notebooks_that_exist_and_every_one_that_does():
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"notebooks/(\d\d_\w+\.ipynb)", readme))
    present = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert named == present


def test_readme_conda_commands_match_environment_yml():
    readme = (ROOT / "README.md").read_text()
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "conda env create -f environment.yml" in readme
    assert f"conda activate {env['name']}" in readme
    assert "VENV=$CONDA_PREFIX" in readme


def test_make_gpu_check_without_an_environment_says_which_to_pass(tmp_path):
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    run = subprocess.run(["make", "-C", str(ROOT), f"VENV={tmp_path}", "gpu-check"],
                         capture_output=True, text=True, env=clean, timeout=60)
    assert run.returncode != 0
    assert f"make gpu-check: no Python at {tmp_path}/bin/python; pass VENV=" in run.stdout
