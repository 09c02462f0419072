"""What runs inside a learner's kernel: the probes that call an answer and return plain data
(:mod:`~grader.kernel.probe`), the in-notebook self-check, hints and progress
(:mod:`~grader.kernel.selfcheck`), and the displays labs draw with (:mod:`~grader.kernel.display`).

Nothing here imports :mod:`grader.judge` or :mod:`grader.reports` (a test holds it to that): a
kernel learns nothing of how it is judged beyond the public checks the self-check runs.
"""
