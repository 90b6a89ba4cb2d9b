"""Fixtures of the injection tests. They live in injection_harness.py, a uniquely named module,
so test files can import its helpers without `from injection_harness import`, which resolves to
whichever service's conftest was imported first when the whole suite runs."""

from injection_harness import *  # noqa: F403 - the fixtures and hooks pytest must see here
