"""vLLM's ``--chat-template`` value: a template file's path, or the template inline."""

from __future__ import annotations

import os
import stat

from smg_trio.tokenizer.chat_template import ChatTemplate

__all__ = ["MAX_TEMPLATE_BYTES", "load_chat_template_arg"]

#: The largest template file read (real templates are a few KiB; Llama 4's is under 20).
MAX_TEMPLATE_BYTES = 1 << 20
#: vLLM's test for "this is a template, not a path": any of these characters.
_JINJA_CHARS = "{}\n"


def _read_file(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block startup
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"--chat-template {path!r} is not a regular file")
        data = f.read(MAX_TEMPLATE_BYTES + 1)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"--chat-template {path!r} is larger than {MAX_TEMPLATE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--chat-template {path!r} is not UTF-8 (byte {exc.start})") from None


def load_chat_template_arg(value: str, content_format: str = "auto") -> str:
    """The Jinja source ``--chat-template value`` means, as vLLM reads it: the file at
    ``value`` when one opens; else ``value`` itself when it looks like a template (has ``{``,
    ``}`` or a newline); else an error naming the path. The file is read once, at startup,
    from the operator's own command line (never from a request or the admin API): a regular
    file of at most :data:`MAX_TEMPLATE_BYTES`, UTF-8. The source is compiled in the
    sandbox here, so a bad template fails at startup. Raises ``ValueError``."""
    try:
        source = _read_file(value)
    except OSError as exc:
        if not any(c in value for c in _JINJA_CHARS):
            raise ValueError(
                f"--chat-template {value!r} looks like a file path, but it cannot be opened "
                f"({exc.strerror or exc}); pass a template file or the template itself"
            ) from None
        source = value
    ChatTemplate(source, name="--chat-template", content_format=content_format)
    return source
