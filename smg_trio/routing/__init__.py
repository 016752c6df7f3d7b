"""Routing knowledge as pure data structures: block keys, the engines' KV block index, and the
cache-aware policy's scoring. No I/O, no trio, no sockets: the worker layer feeds and asks it."""
