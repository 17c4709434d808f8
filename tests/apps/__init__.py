"""A user's own apps, for the scenario-reference tests (``tests.apps.team:...``).

Importable as ``tests.apps`` both by the test process (pytest runs from the repository root)
and by Ray's worker processes (they get the driver's working directory on ``sys.path``), which
rebuild the scenarios by importing their references.
"""
