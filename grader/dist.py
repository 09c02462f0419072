"""Copies of the course for a class, from the one source (like otter-grader's ``assign``, and
nbgrader's split between the instructor's source and the learners' release):

- :func:`student` (``grader dist student OUT/``): a learner's copy: the released notebooks, each
  lab's modules with its hidden checks removed (:func:`withhold_hidden`) and without its
  ``instructor_only`` files (a reference that answers exercises), the grader (for the
  in-notebook self-check, ``make lab`` and ``make check``), and a README, Makefile,
  ``pyproject.toml``, ``environment.yml`` and GitHub Classroom workflow written for learners.
  No solution notebook, no hidden check, no test.
- :func:`gradescope` (``grader dist gradescope OUT.zip``): a Gradescope autograder: the course
  with every check, plus ``setup.sh`` (builds the environment once) and ``run_autograder``
  (runs :func:`autograde` on each submission: ``grader autograde``).

Templates are in ``grader/templates/dist/``.
"""
from __future__ import annotations

import ast
import inspect
import json
import math
import re
import shutil
import tempfile
import time
import tomllib
import zipfile
from collections import Counter, defaultdict
from dataclasses import asdict, replace
from pathlib import Path

import jinja2

from grader import notebook
from grader.errors import GraderError
from grader.files import atomic_write
from grader.labs import load_lab

#: what only the course's own tests and tools need: left out of what learners install
DEV_ONLY = ("pytest", "pytest-xdist", "ruff", "playwright", "check-jsonschema", "jsonschema")
#: the files of ``grader/`` and ``labs/`` that are copied (compiled caches are not)
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")

_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("grader", "templates/dist"),
                                undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                trim_blocks=True, lstrip_blocks=True)


def _requirements(root: Path) -> tuple[str, list[str]]:
    """(the torch requirement, the other requirements learners install) from pyproject.toml."""
    deps = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "dependencies"]
    name = lambda req: re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower()  # noqa: E731
    torch = [d for d in deps if name(d) == "torch"]
    if len(torch) != 1:
        raise GraderError(f"{root / 'pyproject.toml'}: no single torch requirement to pin")
    return torch[0], [d for d in deps if name(d) not in ("torch", *DEV_ONLY)]


def _render(name: str, target: Path, **values) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(_TEMPLATES.get_template(name).render(**values), encoding="utf-8")
    return target


def _empty_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GraderError(f"{out} exists and is not an empty folder: name a new one")


def _release_is_current(root: Path) -> None:
    from grader.release import release

    release(root, check=True)  # raises ReleaseOutOfDate naming each stale notebook


def _course(root: Path, out: Path, *, withhold: bool, notebooks: list[str] | None = None):
    """Copy ``grader/``, ``labs/`` (hidden checks removed when ``withhold``) and the released
    ``notebooks/`` (those named by stem in ``notebooks``; default all) of the course at
    ``root`` into ``out``."""
    shutil.copytree(root / "grader", out / "grader", ignore=_SKIP)
    shutil.copytree(root / "labs", out / "labs", ignore=_SKIP)
    (out / "notebooks").mkdir()
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        if notebooks is None or path.stem in notebooks:
            shutil.copy2(path, out / "notebooks" / path.name)
    if withhold:
        for path in _instructor_only(root / "labs"):
            (out / "labs" / path.relative_to(root / "labs")).unlink()
        public = [c.source for p in sorted((root / "notebooks").glob("*.ipynb"))
                  for c in notebook.read(p).cells if c.cell_type == "code"]
        texts, withheld = withhold_hidden(root / "labs", public)
        for path, text in texts.items():
            (out / "labs" / path).write_text(text, encoding="utf-8")
        for table in (out / "labs").glob("*/lab.toml"):
            table.write_text(_with_withheld(table.read_text(encoding="utf-8"), withheld),
                             encoding="utf-8")


# --------------------------------------------------------------------------- hidden checks

def _labs(root: Path) -> list:
    """The labs of the course at ``root`` (``labs/*/lab.toml``), by id."""
    return sorted((load_lab(p.parent.name) for p in (root / "labs").glob("*/lab.toml")),
                  key=lambda lab: lab.notebook)


def _instructor_only(labs_dir: Path) -> set[Path]:
    """The files of the labs under ``labs_dir`` that their tables mark ``instructor_only``."""
    return {labs_dir / lab.id / name for lab in _labs(labs_dir.parent)
            for name in lab.instructor_only}


def _hidden_checks(labs: list) -> dict[str, list[tuple[str, int]]]:
    """module name -> (exercise id, first line of the check's code) of each hidden check that
    ``labs`` register (importing their checks)."""
    from grader.checks import checks_for

    found: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for lab in labs:
        for e in lab.exercises:
            for c in checks_for(e.id):
                if c.hidden:
                    fn = inspect.unwrap(c.fn)
                    found[fn.__module__].append((e.id, fn.__code__.co_firstlineno))
    return found


def _defs(tree: ast.Module) -> list[tuple[str, ast.stmt, int]]:
    """The module's top-level definitions: (name, node, first line including decorators) of
    each function, class and assignment to one plain name."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, node, first))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                out.append((targets[0].id, node, node.lineno))
    return out


def _decorated(node: ast.stmt, name: str) -> bool:
    """Whether ``node`` is decorated with ``@<name>(...)``."""
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", ""))
               == name for d in getattr(node, "decorator_list", ()))


def _registers_a_check(node: ast.stmt) -> bool:
    """Whether ``node`` is decorated with ``@check(...)`` (a check: nothing names it)."""
    return _decorated(node, "check")


def _names_used(source: str) -> Counter:
    """How often each name is read in ``source`` (names, attributes, imported names); in a
    notebook cell that is not plain Python (``%magic``), every word counts."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return Counter(re.findall(r"\w+", source))
    used: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used[node.id] += 1
        elif isinstance(node, ast.Attribute):
            used[node.attr] += 1
        elif isinstance(node, ast.ImportFrom):
            used.update(a.name for a in node.names)
    return used


def _cut(lines: list[str], first: int, last: int) -> None:
    """Blank lines ``first``..``last`` (1-based) and the comment lines just above them."""
    while first > 1 and (lines[first - 2] or "").lstrip().startswith("#"):
        first -= 1
    lines[first - 1:last] = [None] * (last - first + 1)


def _tidy(lines: list[str | None]) -> str:
    text = "\n".join(line for line in lines if line is not None)
    return re.sub(r"\n{4,}", "\n\n\n", text).rstrip("\n") + "\n"


def withhold_hidden(labs_dir: Path, public_sources: list[str]) -> tuple[dict[str, str],
                                                                        Counter]:
    """(the new text of each check module under ``labs_dir`` (``labs/``) that changes, keyed by
    its path relative to ``labs_dir``; how many hidden checks each exercise lost). Every hidden
    check's definition is removed, and every function the grader runs ahead of the checks
    (``@ahead``), then every top-level function, class or constant of a check module that
    nothing shipped reads any more (helpers and data only those used).

    ``public_sources`` is other code that ships (the released notebooks' cells): a name it
    reads is kept. Raises GraderError when a hidden check is not a top-level definition of its
    own (nothing could be removed without a public check)."""
    hidden = _hidden_checks(_labs(labs_dir.parent))
    excluded = _instructor_only(labs_dir)  # not shipped: what they read does not count
    modules = {p: ".".join(("labs", *p.relative_to(labs_dir).with_suffix("").parts))
               .removesuffix(".__init__") for p in sorted(labs_dir.rglob("*.py"))
               if p not in excluded}
    lines = {p: p.read_text(encoding="utf-8").splitlines() for p in modules}
    changed: set[Path] = set()
    withheld: Counter = Counter()
    for path, module in modules.items():
        if module not in hidden:
            continue
        defs = _defs(ast.parse("\n".join(lines[path])))
        changed.add(path)
        for exercise, line in hidden[module]:
            node = next((n for _, n, first in defs if first <= line <= n.end_lineno), None)
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                    not _registers_a_check(node):
                raise GraderError(f"{module}: the hidden check of {exercise} at line {line} is "
                                  "not a top-level function of its own: it cannot be withheld")
            first = next(f for _, n, f in defs if n is node)
            _cut(lines[path], first, node.end_lineno)
            withheld[exercise] += 1
        lines[path] = _tidy(lines[path]).splitlines()
    for path, module in modules.items():  # the grader's work ahead (grader.checks.ahead)
        ahead = [(n, f) for _, n, f in _defs(ast.parse("\n".join(lines[path])))
                 if _decorated(n, "ahead")]
        for node, first in reversed(ahead):
            _cut(lines[path], first, node.end_lineno)
            changed.add(path)
        lines[path] = _tidy(lines[path]).splitlines()
    checks_dirs = [p for p in modules if "checks" in p.relative_to(labs_dir).parts]
    while True:  # drop what only the removed checks read, until nothing more goes
        texts = {p: "\n".join(lines[p]) for p in modules}
        used = sum((_names_used(t) for t in [*texts.values(), *public_sources]), Counter())
        dropped = False
        for path in checks_dirs:
            for name, node, first in reversed(_defs(ast.parse(texts[path]))):
                if name.startswith("__") or _registers_a_check(node):
                    continue
                own = _names_used(ast.get_source_segment(texts[path], node) or "")
                if used[name] - own[name] <= 0:
                    _cut(lines[path], first, node.end_lineno)
                    changed.add(path)
                    dropped = True
            lines[path] = _tidy(lines[path]).splitlines()
        if not dropped:
            break
    return {str(p.relative_to(labs_dir)): _tidy(lines[p]) for p in changed}, withheld


def _with_withheld(table: str, withheld: Counter) -> str:
    """A lab table's text with ``withheld = N`` under each exercise's id that lost N hidden
    checks (see :attr:`grader.labs.Exercise.withheld`)."""
    def add(m: re.Match) -> str:
        n = withheld.get(m.group(2), 0)
        return m.group(0) + (f"\nwithheld = {n}  # hidden checks the instructor's grader runs"
                             if n else "")

    return re.sub(r'^(id\s*=\s*"([^"]+)")', add, table, flags=re.M)


# --------------------------------------------------------------------------- the two bundles

def student(root: Path, out: Path, labs: list[str] | None = None) -> list[Path]:
    """Write a learner's copy of the course at ``root`` into the new folder ``out``, with the
    notebooks of ``labs`` (lab ids; default every lab) only; return the files written. Raises
    GraderError when ``out`` is not empty or the release is stale."""
    _empty_target(out)
    _release_is_current(root)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [lab for lab in _labs(root) if labs is None or lab.id in labs]
    _course(root, out, withhold=True, notebooks=[lab.notebook for lab in chosen])
    torch, requirements = _requirements(root)
    # a GitHub-hosted runner has a C++ compiler, and no GPU
    on_runner = [e for lab in chosen for e in lab.exercises
                 if not any(need.startswith("cuda") for need in e.requires)]
    values = dict(torch=torch, requirements=requirements, labs=chosen,
                  exercises=[dict(id=e.id, title=e.title, points=e.points,
                                  step=re.sub(r"[^a-z0-9]+", "-", e.id)) for e in on_runner],
                  left_out=[e.id for lab in chosen for e in lab.exercises if e not in on_runner])
    for template, target in [("README.md", "README.md"), ("Makefile", "Makefile"),
                             ("pyproject.toml", "pyproject.toml"),
                             ("environment.yml", "environment.yml"),
                             ("gitignore", ".gitignore"),
                             ("classroom.yml", ".github/workflows/classroom.yml")]:
        _render(template, out / target, **values)
    return sorted(p for p in out.rglob("*") if p.is_file())


def gradescope(root: Path, out_zip: Path, labs: list[str] | None = None) -> Path:
    """Write a Gradescope autograder for the course at ``root`` to ``out_zip``: ``setup.sh``
    and ``run_autograder`` at its root, beside the course (every check, no solution), grading
    the notebooks of ``labs`` (lab ids; default: of any lab). Raises GraderError when
    ``out_zip`` does not end in ``.zip`` or the release is stale."""
    if out_zip.suffix != ".zip":
        raise GraderError(f"{out_zip}: a Gradescope autograder is a .zip file")
    _release_is_current(root)
    torch, requirements = _requirements(root)
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        src = Path(tmp)
        _course(root, src, withhold=False)
        _render("pyproject.toml", src / "pyproject.toml", torch=torch, requirements=requirements)
        for name in ("setup.sh", "run_autograder"):
            _render(name, src / name, torch=torch, labs=labs).chmod(0o755)
        out_zip.parent.mkdir(parents=True, exist_ok=True)
        partial = out_zip.with_name(out_zip.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(src.rglob("*")):
                if path.is_file():
                    info = zipfile.ZipInfo.from_file(path, path.relative_to(src).as_posix())
                    zf.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
        partial.replace(out_zip)
    return out_zip


# --------------------------------------------------------------------------- on Gradescope

def autograde(root: Path, labs: list[str] | None = None) -> dict:
    """Grade a Gradescope submission: every notebook under ``root/submission`` (each in its
    own kernel, on the CPU, with a fresh seed); write ``root/results/results.json`` (the
    format of :func:`grader.reports.gradescope.gradescope_results`, several notebooks merged
    into one) and
    return it. With ``labs`` (the assignment's lab ids), notebooks of other labs are left out
    and a lab without a notebook scores 0 of its points. Exercises that need what Gradescope's
    machines lack (a GPU) are left out of the tests and the maximum, with a note. Always writes
    a results.json, even for a submission without a notebook."""
    from grader.judge.batch import assigned_lab, find_submissions, grade_all
    from grader.judge.grade import new_seed, resolve_device
    from grader.results import Environment

    started, seed, device = time.monotonic(), new_seed(), resolve_device("auto")
    env = Environment.current(device, seed)
    with tempfile.TemporaryDirectory(prefix="autograde-") as tmp:
        try:
            subs = find_submissions([str(root / "submission")])
        except GraderError:
            subs = []
        graded = [r for _, r, _ in grade_all(subs, Path(tmp), device=device, seed=seed,
                                              timeout=None, jobs=1,
                                              assigned=assigned_lab(subs, labs))]
    notes = []
    if labs is not None:
        notes = [f"{Path(r.notebook).name} was not graded: "
                 + (r.error if r.lab == "unknown" and r.error else
                    f"it is lab {r.lab}, and this assignment grades {', '.join(labs)}")
                 for r in graded if r.lab not in labs]
        graded = [r for r in graded if r.lab in labs]
        graded += [_not_submitted(load_lab(lab), env) for lab in labs
                   if lab not in {r.lab for r in graded}]
    if graded:
        results = merge_gradescope([_runnable(r) for r in graded], notes)
    else:
        why = ("no notebook (.ipynb) was found in your submission: upload the lab's notebook "
               "(e.g. 02_autograd.ipynb)")
        results = {"score": 0,
                   "execution_time": math.ceil(time.monotonic() - started), "output": why,
                   "visibility": "visible", "stdout_visibility": "hidden", "tests": [],
                   "extra_data": {"lab": "unknown", "notebook": "", "max_score": 0,
                                  "runnable_max_score": 0,
                                  "error": why, "environment": asdict(env)}}
    atomic_write(root / "results" / "results.json", json.dumps(results, indent=2) + "\n")
    return results


def _not_submitted(lab, env):
    """The result of a lab the assignment grades and the submission has no notebook of."""
    from grader.results import ExerciseResult, LabResult

    why = f"not submitted: your submission has no notebook of lab {lab.id} ({lab.notebook}.ipynb)"
    return LabResult(lab=lab.id, notebook=f"{lab.notebook}.ipynb", environment=env, error=why,
                     exercises=tuple(ExerciseResult(e.id, e.title, "skipped", 0.0, e.points,
                                                    unmet) if (unmet := e.unmet(env.device))
                                     else ExerciseResult(e.id, e.title, "error", 0.0, e.points,
                                                         why) for e in lab.exercises))


def _runnable(result):
    """``result`` without the exercises that could not run on this machine (``skipped``), and
    a note naming them."""
    skipped = [e for e in result.exercises if e.status == "skipped"]
    if not skipped:
        return result
    return replace(result, exercises=tuple(e for e in result.exercises if e.status != "skipped"),
                   notes=(*result.notes, "left out, as this machine cannot run them: "
                          + "; ".join(f"{e.id} ({e.message})" for e in skipped)))


def merge_gradescope(results: list, notes: list[str] = ()) -> dict:
    """One Gradescope ``results.json`` for the :class:`~grader.results.LabResult` s of one
    submission: that of the result itself for one; for several, every exercise as a test and
    the scores, times and outputs added up (where one lab was submitted twice, only the
    higher score of it counts, and the output says so). ``notes`` end the output."""
    from grader.reports.gradescope import gradescope_results

    best: dict[str, object] = {}
    notes = list(notes)
    for r in sorted(results, key=lambda r: -r.score):
        if r.lab in best:
            notes.append(f"{Path(r.notebook).name} is lab {r.lab} too: it scored "
                         f"{r.score:g}, so {Path(best[r.lab].notebook).name} counts")
        else:
            best[r.lab] = r
    parts = [gradescope_results(r) for r in sorted(best.values(), key=lambda r: r.lab)]
    if len(parts) == 1 and not notes:
        return parts[0]
    first = parts[0]
    return {"score": sum(p["score"] for p in parts),
            "execution_time": sum(p["execution_time"] for p in parts),
            "output": "\n\n".join([p["output"] for p in parts] + notes),
            "visibility": "visible", "stdout_visibility": "hidden",
            "tests": [t for p in parts for t in p["tests"]],
            "extra_data": {"lab": ",".join(p["extra_data"]["lab"] for p in parts),
                           "notebook": ", ".join(p["extra_data"]["notebook"] for p in parts),
                           "max_score": sum(p["extra_data"]["max_score"] for p in parts),
                           "runnable_max_score": sum(p["extra_data"]["runnable_max_score"]
                                                     for p in parts),
                           "error": "; ".join(e for p in parts
                                              if (e := p["extra_data"]["error"])) or None,
                           "environment": first["extra_data"]["environment"]}}
