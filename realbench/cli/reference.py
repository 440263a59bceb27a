"""The command line's reference, generated from its argument parser (the manual's reference/cli.md
page: docs/hooks/generated.py), so that the manual names exactly the commands and flags that exist."""

from __future__ import annotations

import argparse

from realbench.cli import build_parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name ({} where it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help, as `realbench --help` lists it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines = ["| argument | meaning |", "|---|---|"]
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) or a.help == argparse.SUPPRESS:
            continue
        if a.option_strings:
            value = "" if a.nargs == 0 else " " + (a.metavar if isinstance(a.metavar, str) else a.dest.upper())
            name = "`, `".join(flag + value for flag in a.option_strings)
        else:
            name = a.metavar if isinstance(a.metavar, str) else a.dest
        meaning = a.help or ""
        if a.choices and not isinstance(a.choices, dict):
            meaning += f" (one of: {', '.join(map(str, a.choices))})"
        if a.default not in (None, False, "", argparse.SUPPRESS, []) and a.nargs != 0:
            meaning += f" (default: {a.default})"
        lines.append(f"| `{_cell(name)}` | {_cell(meaning)} |")
    return lines if len(lines) > 2 else []


def _section(name: str, parser: argparse.ArgumentParser, help_line: str, level: int) -> list[str]:
    usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
    out = [f"{'#' * level} `{name}`", ""]
    if help_line:
        out += [help_line[0].upper() + help_line[1:] + ".", ""]
    out += ["```text", usage, "```", ""]
    options = _options(parser)
    out += options + ([""] if options else [])
    helps = _helps(parser)
    for sub, child in subcommands(parser).items():
        out += _section(f"{name} {sub}", child, helps.get(sub, ""), level + 1)
    return out


def markdown_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Every subcommand of `realbench`: its help line, usage and arguments, in the parser's order."""
    parser = parser or build_parser()
    helps = _helps(parser)
    lines: list[str] = []
    for name, child in subcommands(parser).items():
        lines += _section(f"realbench {name}", child, helps.get(name, ""), 2)
    return "\n".join(lines).rstrip() + "\n"
