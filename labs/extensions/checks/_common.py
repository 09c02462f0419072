"""What the C++ exercises' judges share: a probe's reply read for a failed build, a missing
operator, or a tensor where one was due."""
from __future__ import annotations

from grader.checks import AnswerRaised, CheckFailure, paired, plain_tensor


def built(seen, exercise: str, op: str | None) -> dict:
    """``seen`` (a probe's reply) when the source built and registered ``op`` (if given); else
    CheckFailure with the compiler's errors (trimmed to the source's lines) or what is
    missing."""
    if type(seen) is not dict:
        raise CheckFailure("what came back from the probe is not a reply: the grader's probe did "
                           "not run as shipped (answers must not modify the grader).")
    if "build" in seen:
        error = seen["build"]
        raise CheckFailure(f"your source did not build ({error.get('ename')}):\n"
                           f"{error.get('text')}")
    if op is not None and seen.get("schema") is None:
        raise CheckFailure(
            f"your source built, but registered no operator `{op}` in its namespace. Define it "
            f"in a TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) block: m.def(\"{op}(...) -> ...\"); "
            f"TORCH_EXTENSION_NAME is the name the build gives each version of your source "
            f"({exercise}).")
    return seen


def tensor(value, what: str):
    """``value`` as a plain tensor (:func:`grader.checks.plain_tensor`), or CheckFailure saying
    what came back instead (a probe sends ``{"type": name}`` for what is not a tensor)."""
    if type(value) is dict and "type" in value:
        raise CheckFailure(f"{what} is a {value['type']}, not a tensor.")
    return plain_tensor(value, what)


def failed_tests(words: dict) -> dict:
    """The opcheck tests of ``words`` (test -> "SUCCESS" or the error) that did not succeed."""
    if type(words) is not dict:
        return {"opcheck": str(words)[:300]}
    return {t: str(w) for t, w in words.items() if w != "SUCCESS"}


def first_lines(text: str, n: int = 3) -> str:
    """The first ``n`` non-empty lines of ``text`` (torch's messages are long), at most 500
    characters."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return " ".join(lines[:n])[:500]


def results(seen, asked: list, what: str = "cases") -> list:
    """The probe's ``results`` for the ``asked`` cases, one per case (``paired``: a reply that
    covers fewer, or is not a list, fails); an entry that says the answer raised is raised."""
    reply = seen.get("results") if type(seen) is dict else None
    found = []
    for _, got in paired(asked, reply, what):
        if type(got) is dict and type(got.get("raised")) is dict:
            raise AnswerRaised(got["raised"])
        found.append(got)
    return found
