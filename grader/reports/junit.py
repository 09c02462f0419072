"""JUnit XML for CI dashboards: one testsuite per (learner, lab), one testcase per exercise."""
from __future__ import annotations

import io
import re
from dataclasses import asdict
from pathlib import Path

from grader.files import atomic_write
from grader.reports.graded import Graded, num
from grader.results import CAVEAT_MARK, CONTROL, mismatch_note

_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """``text`` without the characters XML 1.0 cannot hold (control sequences, NUL...)."""
    return _XML_ILLEGAL.sub("", CONTROL.sub("", text))


def junit_xml(graded: list[Graded]) -> bytes:
    """JUnit XML (the xunit2 dialect pytest writes, which allows testcase properties): one
    ``<testsuite name="<learner>.<lab>">`` per submission with the run's environment and
    scores as properties, one ``<testcase classname="<learner>.<lab>" name="<exercise id>"
    time="<seconds>">`` per exercise with ``points`` and ``max_points`` properties, and
    ``<failure>`` (failed), ``<error type="error|timeout|crashed">`` or ``<skipped>`` whose
    message is the result's message. A submission whose grading failed before any exercise was
    known gets one ``<testcase name="grading">`` with an ``<error type="error">`` saying why,
    so that CI dashboards do not lose it. Under a torch other than the pinned release the
    suite has a ``torch_caveat`` property (:func:`grader.results.mismatch_note`) and each
    exercise marked ``version_caveat`` a ``version_caveat`` property (``true``), its message
    prefixed with the mark. Characters XML cannot hold are dropped."""
    from junitparser import Error, Failure, Skipped
    from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

    root = JUnitXml(name="pytorch-internals-course")
    for g in graded:
        r, env = g.result, g.result.environment
        suite_name = _xml_text(f"{g.learner}.{r.lab}")
        suite = TestSuite(suite_name)
        suite.timestamp = env.started_at
        for key, value in (("name", g.name), ("learner", g.learner), ("lab", r.lab),
                           ("notebook", r.notebook), ("score", num(r.score)),
                           ("max_score", num(r.max_score)),
                           ("runnable_max_score", num(r.runnable_max_score)),
                           *((k, str(v)) for k, v in asdict(env).items() if v is not None),
                           *((("error", r.error),) if r.error else ()),
                           *((("torch_caveat", mismatch_note(env)),)
                             if env.torch_mismatch else ())):
            suite.add_property(key, _xml_text(value))
        cases = []
        for e in r.exercises:
            case = TestCase(_xml_text(e.id), suite_name, e.duration_s)
            case.add_property("points", num(e.points))
            case.add_property("max_points", num(e.max_points))
            message = _xml_text(e.message)
            if e.version_caveat:
                case.add_property("version_caveat", "true")
                message = f"{CAVEAT_MARK} {message}"
            if e.status == "failed":
                case.result = [Failure(message, "failed")]
            elif e.status in ("error", "timeout", "crashed"):
                case.result = [Error(message, e.status)]
            elif e.status == "skipped":
                case.result = [Skipped(message, "skipped")]
            for res in case.result:
                res.text = message
            cases.append(case)
        if not r.exercises:
            case = TestCase("grading", suite_name, r.duration_s)
            case.result = [Error(_xml_text(r.error or "no exercises were graded"), "error")]
            case.result[0].text = _xml_text(r.error or "no exercises were graded")
            cases.append(case)
        suite.add_testcases(cases)
        root.add_testsuite(suite)
    root.update_statistics()
    buf = io.BytesIO()
    root.write(buf, pretty=True)
    return buf.getvalue()


def write_junit_xml(graded: list[Graded], path: Path) -> Path:
    """Write :func:`junit_xml` to ``path`` atomically; return ``path``."""
    return atomic_write(path, junit_xml(graded))

