"""Shared test helpers (fixtures stay in the ``conftest.py`` files)."""
