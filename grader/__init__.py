"""The course grader.

- :mod:`grader.kernel`: what runs inside a learner's kernel (probes, the in-notebook self-check,
  displays); it imports nothing of the judge's side;
- :mod:`grader.judge`: the grading run (assembling the notebook, the sandboxed kernel, the
  judges in the grader's own process, batches);
- :mod:`grader.reports`: the report formats, one module each, which only read results;
- :mod:`grader.checks` (the API a lab's probes and checks import), :mod:`grader.labs` (the lab
  tables), :mod:`grader.results` (the result schema, signed), and the CLI.
"""
import sys
from pathlib import Path

__version__ = "0.4.0"
#: the course's root folder (labs/, solutions/, notebooks/ and this package)
ROOT = Path(__file__).resolve().parent.parent

# jsonschema (which nbformat imports to validate notebooks) imports rfc3987_syntax when it is
# installed (jupyterlab's dependencies install it), and that builds 39 lark grammars: 2.0 s of
# every grader process and pool worker, for IRI formats no schema of ours or nbformat's uses.
# Marked absent here (an import of it raises ImportError), jsonschema leaves that format out.
sys.modules.setdefault("rfc3987_syntax", None)
