"""The built-in mock engine (``serve --backend mock``) and the tiny model it serves."""
