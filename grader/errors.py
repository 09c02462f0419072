"""The grader's one error taxonomy. Each error maps to one CLI exit code."""


class GraderError(Exception):
    """Grading itself could not happen (bad arguments, unreadable input, missing lab). Exit 2."""

    exit_code = 2


class ReleaseError(GraderError):
    """A solution notebook cannot be released (unclosed or nested markers, duplicate ids)."""


class ReleaseOutOfDate(GraderError):
    """``notebooks/`` differs from what the release step produces today. Exit 1."""

    exit_code = 1
