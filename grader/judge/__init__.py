"""The grading run, in the grader's own process: a submission assembled into the notebook that
runs (:mod:`~grader.judge.assemble`), its kernel walled in (:mod:`~grader.judge.sandbox`) and
driven cell by cell with each exercise's judges here (:mod:`~grader.judge.execute`), one
notebook graded into a signed result (:mod:`~grader.judge.grade`), and a class of hand-ins
graded, resumed and sharded (:mod:`~grader.judge.batch`)."""
