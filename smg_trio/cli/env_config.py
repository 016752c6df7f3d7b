"""Flag values from SMG_TRIO_<FLAG> variables and the --config file, under the command line."""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_ENV_PREFIX = "SMG_TRIO_"


def _apply_env_and_file(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> None:
    """Precedence: command line > SMG_TRIO_<FLAG> env > --config file > defaults.

    A flag with aliases (``--dp-size``/``--data-parallel-size``) reads the variable and the file
    key of each of its names, its first name first. ``SMG_TRIO_CONFIG`` names the file when
    ``--config`` does not. The command line's flags are whole names (``allow_abbrev=False``),
    so the flags it names are exactly those argparse set."""
    file_values: dict[str, Any] = {}
    config = getattr(args, "config", None)
    if config is None and hasattr(args, "config"):
        config = args.config = os.environ.get(_ENV_PREFIX + "CONFIG")
    if config:
        path = Path(config)
        text = path.read_text()
        file_values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    subparser = sub.choices[args.command]
    for action in subparser._actions:
        if not action.option_strings or action.dest in ("help", "config"):
            continue
        if any(o in given for o in action.option_strings):
            continue
        found = _env_or_file(action, file_values)
        if found is None:
            continue
        source, raw = found
        if isinstance(action, argparse._StoreTrueAction):
            raw = _flag_bool(subparser, action, raw, source)
        elif action.nargs == "+" and isinstance(raw, str):
            raw = raw.split(",")
        elif action.type is not None and isinstance(raw, (str, int, float)):
            try:
                raw = action.type(str(raw))  # type: ignore[operator,unused-ignore]
            except (argparse.ArgumentTypeError, ValueError) as exc:
                subparser.error(
                    f"argument {'/'.join(action.option_strings)}: {exc} (from {source})"
                )
        if action.choices is not None and raw not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            subparser.error(
                f"argument {'/'.join(action.option_strings)}: invalid choice: {raw!r} "
                f"(from {source}; choose from {choices})"
            )
        setattr(args, action.dest, raw)


def _env_or_file(action: argparse.Action, file_values: dict[str, Any]) -> tuple[str, Any] | None:
    """``(where, value)`` of a flag not on the command line: its SMG_TRIO_<NAME> variable, else
    its config-file key, trying each of the flag's names in order; None when neither is set."""
    names = dict.fromkeys(
        [action.dest, *(o.lstrip("-").replace("-", "_") for o in action.option_strings)]
    )
    for name in names:
        env = os.environ.get(_ENV_PREFIX + name.upper())
        if env is not None:
            return _ENV_PREFIX + name.upper(), env
    for name in names:
        if file_values.get(name) is not None:
            return f"--config key {name!r}", file_values[name]
    return None


def _flag_bool(
    parser: argparse.ArgumentParser, action: argparse.Action, raw: Any, source: str
) -> bool:
    """An on/off flag's env or config-file value: a bool, or 1/0, true/false, yes/no, on/off."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    parser.error(
        f"argument {'/'.join(action.option_strings)}: expected true or false, got {raw!r} "
        f"(from {source})"
    )
