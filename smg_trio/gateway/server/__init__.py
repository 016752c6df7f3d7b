"""Everything that touches hypercorn or h11 internals: direct socket writes, the shielded
finish, the request guard, and the server fixes (connection close, protocol-error bodies)."""
