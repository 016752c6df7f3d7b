"""Hints for unrecognized arguments: a positional model, a stray value, an engine flag."""

from __future__ import annotations

import argparse


def _is_prefix_of_a_flag(parser: argparse.ArgumentParser, arg: str) -> bool:
    """Whether ``arg`` abbreviates one of the subcommands' own flags (a typo for it, not an
    engine argument: abbreviations are refused)."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for sub in getattr(action, "choices", {}).values():
            if any(opt.startswith(arg) for opt in sub._option_string_actions):
                return True
    return False


def _subcommand_with_flag(parser: argparse.ArgumentParser, flag: str, command: str) -> str | None:
    """The other subcommand (``serve``, ``launch``) that has exactly ``flag``, if one has."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in getattr(action, "choices", {}).items():
            if (
                name != command
                and name in ("serve", "launch")
                and flag in sub._option_string_actions
            ):
                return str(name)
    return None


def _unknown_hint(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str], unknown: list[str]
) -> str:
    """What to write instead of arguments the subcommand does not know: a model given
    positionally (``vllm serve MODEL``) is ``--model``/``--model-path``; another stray value
    follows a flag that takes one value (vLLM's ``--api-key K1 K2``); a flag of the engine's
    goes after ``--``."""
    first = unknown[0]
    if not first.startswith("-"):
        if argv.index(first) == 1 and args.command in ("serve", "launch"):
            flag = "--model" if args.command == "serve" else "--model-path"
            return f" (the model is a flag here, not positional as in 'vllm serve MODEL': {flag} {first})"
        return (
            f" ({first!r} follows a flag that takes one value; several only where --help shows"
            " 'X [X ...]'; engine arguments go after '--')"
        )
    flag = first.split("=", 1)[0]
    model_flag = {"serve": "--model", "launch": "--model-path"}
    if flag in ("--model", "--model-path") and args.command in model_flag:
        return f" ({args.command} names its model with {model_flag[args.command]})"
    other = _subcommand_with_flag(parser, flag, args.command)
    if other is not None:
        return f" ({flag} is a flag of '{other}', not of '{args.command}')"
    if args.command == "serve" and not any(
        u.startswith("--") and _is_prefix_of_a_flag(parser, u.split("=", 1)[0]) for u in unknown
    ):
        return f" (engine arguments go after '--': serve ... -- {' '.join(unknown)})"
    return ""
