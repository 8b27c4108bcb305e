"""Parameter checks with one message shape everywhere.

"The 'profile_steps' parameter of SriftyCallback() must be an int >= 1. Got 0."
"--root-volume-gb must be a whole number of GiB between 30 and 16384. Got -5. <the fix>"
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from predictor.exceptions import ConfigError, did_you_mean


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 400-digit number is named, not echoed)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def refused(
    what: str, expected: str, value: object, fix: str = "", *, parameter: str | None = None, owner: str | None = None
) -> ConfigError:
    """The one shape of a refused value: "<what> must be <expected>. Got <value>. <fix>" (``what``: a parameter of a
    function, or a command-line option such as ``--key-name``), with its parts kept on the error for the other front
    ends (:meth:`~predictor.exceptions.ConfigError.in_words`)."""
    message = f"{what} must be {expected}. Got {shown(value)}."
    if fix:
        message += f" {fix}"
    name = parameter or what.lstrip("-").replace("-", "_")
    return ConfigError(message, parameter=name, value=value, owner=owner, expected=expected, got=shown(value), fix=fix)


def _fail(owner: str, name: str, expected: str, value: object, fix: str = "") -> ConfigError:
    return refused(f"The {name!r} parameter of {owner}", expected, value, fix, parameter=name, owner=owner)


def check_int(
    owner: str, name: str, value: object, *, minimum: int | None = None, maximum: int | None = None, fix: str = ""
) -> int:
    """Return ``value`` if it is an int (not a bool) in [``minimum``, ``maximum``]; raise ConfigError otherwise."""
    expected = "an int" + (f" >= {bound_text(minimum)}" if minimum is not None else "")
    if maximum is not None:
        expected += (" and" if minimum is not None else "") + f" <= {bound_text(maximum)}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _fail(owner, name, expected, value, fix)
    number = int(value)  # exact for an Integral (numbers.Integral declares no __gt__ to compare with)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise _fail(owner, name, expected, value, fix)
    return number


def bound_text(x: float) -> str:
    """A bound as a reader writes it: 0.25, 16384, 1000000, 1e+12, 1234567.5 (not 1000000000000000.0)."""
    if float(x).is_integer() and abs(x) <= 1e6:
        return str(int(x))
    short = f"{x:g}"
    return short if float(short) == x else f"{x:.15g}"


def check_number(
    owner: str,
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    exclusive: bool = False,
    maximum: float | None = None,
) -> float:
    """Return ``value`` as float if it is a finite real number above (or at) ``minimum`` and at most ``maximum``."""
    bound = ""
    if minimum is not None:
        bound = f" {'>' if exclusive else '>='} {bound_text(minimum)}"
    if maximum is not None:
        bound += (" and" if bound else "") + f" <= {bound_text(maximum)}"
    expected = "a number" + bound
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value or abs(value) == float("inf"):
        raise _fail(owner, name, expected, value)
    if minimum is not None and (value <= minimum if exclusive else value < minimum):
        raise _fail(owner, name, expected, value)
    # "not <=" for ">": numbers.Real declares only __lt__ and __le__ (the same for a number that is not NaN)
    if maximum is not None and not value <= maximum:
        raise _fail(owner, name, expected, value)
    return float(value)


def check_choice(owner: str, name: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; the error lists them and suggests the closest."""
    options = list(choices)
    if value in options:
        return str(value)
    fix = ""
    if isinstance(value, str):
        fix = did_you_mean(difflib.get_close_matches(value, options, n=1))
    raise _fail(owner, name, "one of {" + ", ".join(repr(c) for c in options) + "}", value, fix)


@dataclass(frozen=True)
class Setting:
    """One setting of a configuration object, declared once: its kind (``int``, ``number``, ``choice``), bounds and
    choices; :func:`check_settings` checks values against the declarations with the one message shape, and each front
    end names the setting its own way (Python the parameter, ``srifty`` the flag its parser has for it). A class's
    declarations are its ``SETTINGS`` (``SriftyCallback``, ``SpotPreemption``, ``MigrationTriggers``,
    ``LauncherSettings``); the tests try a refused value of every one."""

    kind: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False  # above the minimum, not at it
    choices: tuple[str, ...] = ()
    optional: bool = False  # None allowed (a default decided elsewhere)
    fix: str = ""

    def check(self, owner: str, name: str, value: object) -> None:
        """Refuse ``value`` (ConfigError, its parts kept) unless it is of the declared kind, within the bounds."""
        if value is None and self.optional:
            return
        if self.kind == "int":  # whole numbers: an exclusive bound is the next one (declare minimum=1, not >0)
            low = None if self.minimum is None else int(self.minimum)
            high = None if self.maximum is None else int(self.maximum)
            check_int(owner, name, value, minimum=low, maximum=high, fix=self.fix)
        elif self.kind == "number":
            check_number(owner, name, value, minimum=self.minimum, exclusive=self.exclusive, maximum=self.maximum)
        elif self.kind == "choice":
            check_choice(owner, name, value, self.choices)
        else:
            raise ValueError(f"unknown setting kind {self.kind!r}")


def check_settings(owner: str, declared: Mapping[str, Setting], values: Mapping[str, object]) -> None:
    """Check every declared setting's value (:meth:`Setting.check`), in declaration order.

    Raises:
        ConfigError: the first refused one, naming the parameter of ``owner``, the value and what it must be.
    """
    for name, setting in declared.items():
        setting.check(owner, name, values[name])


def suggest(name: str, known: Iterable[str], n: int = 3, cutoff: float = 0.5) -> list[str]:
    """Close matches of ``name`` among ``known``, case-insensitively, best first."""
    known = list(known)
    lowered = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=cutoff)
    return [lowered[h] for h in hits]
