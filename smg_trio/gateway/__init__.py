"""The gateway: ``openai`` (API semantics, framework-free), ``http`` (the app and handlers)
and ``server`` (hypercorn and h11 internals, fenced)."""
