"""Checkers for the chapters' exercises, one module per chapter.

Each checker takes the reader's function, runs it against a reference on random inputs,
and either prints a short success line (returning ``True``) or raises
:class:`ExerciseError` whose message says in words what is wrong: a wrong shape, NaNs
from a fully masked row, epsilon outside the square root, an input modified in place...
An exercise that still raises ``NotImplementedError`` is reported as not attempted, in one
printed line that says what to do (the checker returns ``None``, so a notebook shows nothing
more), and a notebook runs top to bottom before the reader has begun.
"""

from lib.exercises._common import ExerciseError, checker

__all__ = ["ExerciseError", "checker"]
