"""The course grader."""
import sys

__version__ = "0.4.0"

# jsonschema (which nbformat imports to validate notebooks) imports rfc3987_syntax when it is
# installed (jupyterlab's dependencies install it), and that builds 39 lark grammars: 2.0 s of
# every grader process and pool worker, for IRI formats no schema of ours or nbformat's uses.
# Marked absent here (an import of it raises ImportError), jsonschema leaves that format out.
sys.modules.setdefault("rfc3987_syntax", None)
