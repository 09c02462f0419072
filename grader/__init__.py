"""The course grader."""
__version__ = "0.3.0"
