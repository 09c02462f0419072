"""The course grader."""
__version__ = "0.2.0"
