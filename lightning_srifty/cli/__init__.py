"""The ``srifty`` command line: one module per command, each with ``add_parser(sub, common)``.

Importing it loads neither torch nor lightning: each command imports what it uses when it runs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import select
import signal
import sys
from collections.abc import Sequence
from typing import Any

from predictor.exceptions import ConfigError, LaunchInterrupted, MissingExtraError, SriftyError

# the order of `srifty --help`; each module declares its command(s) with add_parser(sub, common)
COMMANDS = (
    "demo",
    "capture",
    "profile",
    "schema",
    "catalog",
    "predict",
    "recommend",
    "terraform",
    "check",
    "rehearse",
    "launch",
    "replay",
    "operations",
    "serve",
    "eval",
)


class Parser(argparse.ArgumentParser):
    """argparse that answers a mistyped subcommand, choice or flag with the closest known one ("did you mean")."""

    argv: Sequence[str] = ()  # the command line being parsed (main sets it)

    def error(self, message: str) -> None:  # type: ignore[override]
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            close = difflib.get_close_matches(match.group(1), re.findall(r"'([^']*)'", match.group(2)), n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        elif "required" in message and self._unknown_flags(Parser.argv):
            # a mistyped flag (--stpes 1000) is why a required one is missing: say that, not the consequence
            self.unknown(self._unknown_flags(Parser.argv))
        self._fail(message)

    def _fail(self, message: str) -> None:
        """One line that names the argument, the value and the fix, and where the options are listed: not argparse's
        usage of every option first (20 lines before the error for ``srifty recommend``)."""
        what = "option" if " " in self.prog else "command"  # srifty recommend's options; srifty's commands
        self.exit(2, f"{self.prog}: error: {message}\n  ({self.prog} --help lists every {what})\n")

    def _known(self) -> list[str]:
        return [o for action in self._actions for o in action.option_strings]

    def _unknown_flags(self, argv: Sequence[str]) -> list[str]:
        """``--flags`` of ``argv`` (before a ``--``) that are neither a flag of this parser nor a unique prefix."""
        known, out = self._known(), []
        for token in argv:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if name.startswith("--") and name not in known and len([k for k in known if k.startswith(name)]) != 1:
                out.append(name)
        return out

    def unknown(self, extra: Sequence[str]) -> None:
        """Refuse arguments this parser does not know, naming the closest flag of each."""
        hints = []
        for token in extra:
            if token.startswith("-"):
                name = token.split("=", 1)[0]
                close = difflib.get_close_matches(name, self._known(), n=1, cutoff=0.6)
                if close:
                    hints.append(f"{name}: did you mean {close[0]}?")
        self._fail(f"unrecognized arguments: {' '.join(extra)}" + ("; " + "; ".join(hints) if hints else ""))


def build_parser() -> argparse.ArgumentParser:
    from lightning_srifty._version import __version__

    parser = Parser(prog="srifty", description="Profile Lightning training and pick cloud GPUs.")
    parser.add_argument("--version", action="version", version=f"lightning-srifty {__version__}")
    parser.add_argument(
        "--catalog-extra",
        action="append",
        metavar="YAML",
        dest="global_catalog_extra",
        help="user-defined GPUs and instance types merged over the catalog (repeatable)",
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")  # launch has a "command"
    common = argparse.ArgumentParser(add_help=False)  # the catalog flags, for the commands that read the catalog
    common.add_argument(
        "--catalog-extra",
        action="append",
        metavar="YAML",
        help="user-defined GPUs and instance types merged over the catalog (repeatable; also $SRIFTY_CATALOG_EXTRA)",
    )
    common.add_argument("--catalog", metavar="DIR", help="use this catalog copy instead of the newest one")
    for name in COMMANDS:
        importlib.import_module(f"lightning_srifty.cli.{name}").add_parser(sub, common)
    return parser


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command ``args`` ran (``srifty catalog refresh``: refresh's own)."""
    for _ in range(3):
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or chosen not in sub.choices:
            return parser
        parser = sub.choices[chosen]
    return parser


def flag_for(parser: argparse.ArgumentParser, dest: str) -> str | None:
    """The option of ``parser`` that sets ``dest`` (its long form), or None when no option does."""
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=lambda o: (o.startswith("--"), len(o)))
    return None


def error_words(exc: SriftyError, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """An error in the command's words: a refused value (:class:`ConfigError` with its parts) or any error raised
    from a template names the flag that set each parameter, read from the command's own parser (no flag is written
    in the library); prose is said as raised (``srifty recommend`` asks the ranking for its flags:
    :mod:`predictor.ranking.words`)."""
    parts = isinstance(exc, ConfigError) and exc.expected is not None and bool(exc.parameter)
    if exc.template is not None or parts:
        command = command_parser(parser, args)
        # every parameter the refusal names must be a flag of this command, else it is said as the library said it
        named = exc.template_names() if exc.template is not None else [getattr(exc, "parameter", None) or ""]
        if all(flag_for(command, name) is not None for name in named):
            return exc.in_words("cli", lambda name: flag_for(command, name))
    return str(exc)


def _negative_values_joined(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--deadline -3h`` as ``--deadline=-3h``: argparse reads a value starting with a dash as an option ("expected
    one argument"), so the value's own check never said what was wrong with it. A token of a dash and a digit after
    one of the command's own options that takes one value is joined to it; nothing after ``--``, nor after the first
    word of a command that passes the rest on (``srifty launch PLAN... train.py --shift -5m``: the script's own)."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    command = sub.choices.get(argv[0]) if sub is not None and argv else None
    if command is None:
        return list(argv)
    valued = {o for a in command._actions if a.nargs is None and a.option_strings for o in a.option_strings}
    passes_on = any(a.nargs == argparse.REMAINDER for a in command._actions)
    out: list[str] = [argv[0]]
    for i, token in enumerate(argv[1:], start=1):
        previous = out[-1]
        if token == "--" or (passes_on and not token.startswith("-") and previous not in valued):
            return out + list(argv[i:])  # the script's own words from here
        if re.match(r"-\d", token) and previous in valued:
            out[-1] = f"{previous}={token}"
        else:
            out.append(token)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``srifty`` console script; SriftyError becomes a one-line message and exit code 2, and so
    does a module an uninstalled extra would bring (the message names the extra and the pip command)."""
    parser = build_parser()
    Parser.argv = list(sys.argv[1:] if argv is None else argv)
    argv = _negative_values_joined(Parser.argv, parser)
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.subcommand].unknown(extra)
    try:
        return int(args.func(args) or 0)
    except SriftyError as exc:
        print(f"srifty: error: {error_words(exc, parser, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # what the command started it has released already (its own finally) and said so
        print(f"srifty {args.subcommand}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except LaunchInterrupted as exc:  # SIGTERM or SIGHUP, made an exception so that the command's finally ran
        print(f"srifty {args.subcommand}: {exc}", file=sys.stderr)
        return exc.exit_code
    except ImportError as exc:  # each command imports what it runs inside its function: an extra may be missing
        action = getattr(args, f"{args.subcommand}_command", None)  # srifty catalog refresh
        missing = MissingExtraError.of(exc, " ".join(filter(None, ("srifty", args.subcommand, action))))
        if missing is None:
            raise
        print(f"srifty: error: {missing}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the user named cannot be read or written: say which and why, no traceback
        if isinstance(exc, BrokenPipeError) and _reader_gone(sys.stdout):
            # the reader of our output left (srifty recommend | head): quiet, as a tool SIGPIPE ends (the shell's
            # 141), stdout pointed at /dev/null so that the interpreter's own flush at exit does not fail again
            # (Python's signal docs, "Note on SIGPIPE")
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) not in str(exc.strerror) else ""
        print(f"srifty: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from lightning_srifty.cli.capture import TORCHVISION_FIX, torchvision_mismatch
        from lightning_srifty.provision.aws import aws_words

        words = aws_words(exc)
        if words is None and torchvision_mismatch(exc):  # Lightning imports torchvision: a build for another torch
            words = f"torchvision's compiled operators do not load against this torch ({exc}): {TORCHVISION_FIX}."
        if words is None:
            raise
        print(f"srifty: error: {words}", file=sys.stderr)
        return 2


def _reader_gone(stream: Any) -> bool:
    """Whether ``stream`` is a pipe whose reader closed it (a write would raise BrokenPipeError): poll reports an
    error on the write end of such a pipe."""
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's StringIO), or no poll on this platform
        return False


if __name__ == "__main__":
    raise SystemExit(main())
