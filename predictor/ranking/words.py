"""The ranking's prose in its caller's words (issue #39): where an explanation, a hint, a plan's note or a reason for
leaving fleets out names a constraint, it asks :class:`Words` for the name (``max_instances`` / ``--max-instances``)
or the setting (``market='any'`` / ``--market any``), so that each front end reads its own vocabulary: Python and the
service (whose JSON fields are the Python names) :data:`PYTHON`, ``srifty recommend`` :data:`FLAGS`, read from the
flags the constraints declare (:data:`predictor.ranking.constraints.SPECS`). A refused value is not prose: it keeps
its parts on the :class:`~predictor.exceptions.ConfigError` and each front end says it from them."""

from __future__ import annotations

import enum
import numbers
import string
from dataclasses import dataclass
from typing import Any, Literal

from predictor.ranking.constraints import SPECS

Vocabulary = Literal["python", "flags"]


def chance_beside(p: float, asked: float) -> str:
    """A chance beside the confidence asked, with as many decimals as tell them apart: a fleet left out at 89.6 %
    read "at 90%, under the 90% asked" (a trial)."""
    for digits in (0, 1, 2):
        said = f"{p:.{digits}%}"
        if p >= asked or said != f"{asked:.{digits}%}":
            return said
    return f"{p:.3%}"


def plain(value: float) -> str:
    """A number as a user types it, never in exponent form (which ``--deadline`` and the number flags refuse):
    ``16``, ``0.95``, ``1234567``, ``0.000017``."""
    x = float(value)
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    text = f"{x:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "0", "-0") else f"{x:.6g}"


def three(value: float) -> str:
    """A figure to three significant digits as people read one, never in exponent form: ``0.0123``, ``4.56``,
    ``2,040`` (``f"{2040:,.3g}"`` is ``2.04e+03``: a trial read "its predicted 2.04e+03 h")."""
    x = float(value)
    return f"{x:,.0f}" if abs(float(f"{x:.3g}")) >= 1000 else f"{x:,.3g}"  # 999.7 rounds to 1,000, not 1e+03


@dataclass(frozen=True)
class Words:
    """A front end's words for the constraints: ``python`` (the library and the service) or ``flags`` (the CLI)."""

    vocabulary: Vocabulary = "python"

    def name(self, field: str) -> str:
        """A constraint's name: ``max_instances``, or its flag ``--max-instances`` (a constraint without a flag keeps
        its name)."""
        spec = SPECS.get(field)
        if self.vocabulary == "python" or spec is None or spec.flag is None:
            return field
        return spec.flag or "--" + field.replace("_", "-")

    def setting(self, field: str, value: Any) -> str:
        """A constraint set to ``value``: ``market='any'``, ``regions=('us-east-1',)``, ``deadline_h=0.5``; or as
        typed on the command line: ``--market any``, ``--regions us-east-1``, ``--deadline 30m`` (a duration with its
        unit, a number never in exponent form), ``--allow-arm64``. Numpy numbers read as numbers, enums as their
        values; an unset value (None, False, nothing) reads ``no --budget``."""
        if isinstance(value, enum.Enum):
            value = value.value
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        spec = SPECS.get(field)
        if self.vocabulary == "python" or spec is None or spec.flag is None:
            if number:
                return f"{field}={plain(value)}"
            shown = repr(tuple(value)) if isinstance(value, (tuple, list)) else repr(value)
            return f"{field}={shown}"
        flag = self.name(field)
        if value is True:
            return flag
        if value is None or value is False or (isinstance(value, (tuple, list)) and not value):
            return f"no {flag}"
        if isinstance(value, (tuple, list)):
            return f"{flag} {','.join(str(v) for v in value)}"
        if spec.unit == "h" and number:  # a duration as the user writes it: 10m, not 0.17h
            return f"{flag} {plain(value * 60)}m" if value < 1 else f"{flag} {plain(value)}h"
        return f"{flag} {plain(value) if number else value}{spec.unit}"


def doc(field: str, words: Words) -> str:
    """A constraint's declared doc in ``words``: a doc that names another constraint names it as ``{field}``."""
    text = SPECS[field].doc
    return text.format_map({f: words.name(f) for _, f, _, _ in string.Formatter().parse(text) if f})


def names(words: Words, *fields: str) -> str:
    """Several constraints' names, joined: ``allow, deny and regions`` / ``--allow, --deny and --regions``."""
    said = [words.name(f) for f in fields]
    return ", ".join(said[:-1]) + f" and {said[-1]}" if len(said) > 1 else "".join(said)


PYTHON = Words("python")
FLAGS = Words("flags")
WORDS: dict[str, Words] = {"python": PYTHON, "flags": FLAGS}
