"""Real-peer (e2e) lane: see conftest.py."""
