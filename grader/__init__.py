"""The course grader."""
__version__ = "0.1.0"
