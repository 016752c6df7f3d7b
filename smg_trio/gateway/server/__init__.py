"""Everything that touches hypercorn or h11 internals: smg_trio's own serve loop (``serve``) and
its fixes, in subclasses for its servers only (connection close, protocol-error bodies), each
checked at startup (``fixes``); direct socket writes, the shielded finish, the request guard."""
