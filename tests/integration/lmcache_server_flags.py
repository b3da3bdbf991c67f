"""Prints, as JSON, every flag of the real `lmcache server` (the lmcache in this venv), read
from the parser lmcache itself builds for `lmcache server` (the same path as
`lmcache server --help`), in --help order.

Each entry: option strings, group title, argparse action kind, nargs, type name, choices,
default, and whether --help hides it.

Run:  .venv/bin/python tests/integration/lmcache_server_flags.py
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def reference_flags() -> list[dict]:
    logging.disable(logging.CRITICAL)
    from lmcache.cli.commands import register_commands  # noqa: PLC0415

    root = argparse.ArgumentParser(prog="lmcache")
    sub = root.add_subparsers(dest="command")
    register_commands(sub, ["server"])
    server = sub.choices["server"]
    group_of: dict[int, str] = {}
    for group in server._action_groups:  # noqa: SLF001 - argparse keeps groups here
        for action in group._group_actions:  # noqa: SLF001
            group_of[id(action)] = group.title
    out = []
    for action in server._actions:  # noqa: SLF001
        default = action.default
        if default is argparse.SUPPRESS:
            default = None
        try:
            json.dumps(default)
        except TypeError:
            default = repr(default)
        out.append({
            "options": list(action.option_strings),
            "group": group_of.get(id(action), "options"),
            "action": type(action).__name__,
            "nargs": action.nargs if not isinstance(action.nargs, int) else int(action.nargs),
            "type": getattr(action.type, "__name__", None) if action.type else None,
            "choices": list(action.choices) if action.choices else None,
            "default": default,
            "hidden": action.help == argparse.SUPPRESS,
        })
    return out


if __name__ == "__main__":
    json.dump(reference_flags(), sys.stdout, indent=1)
    sys.stdout.write("\n")
