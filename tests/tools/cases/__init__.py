"""Tool-call cases, one module per format family; each module exposes ``CASES``."""
