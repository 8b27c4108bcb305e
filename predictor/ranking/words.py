"""The ranking's prose in its caller's words (issue #39): where an explanation, a hint, a plan's note or a reason for
leaving fleets out names a constraint, it asks :class:`Words` for the name (``max_instances`` / ``--max-instances``)
or the setting (``market='any'`` / ``--market any``), so that each front end reads its own vocabulary: Python and the
service (whose JSON fields are the Python names) :data:`PYTHON`, ``srifty recommend`` :data:`FLAGS`, read from the
flags the constraints declare (:data:`predictor.ranking.constraints.SPECS`). A refused value is not prose: it keeps
its parts on the :class:`~predictor.exceptions.ConfigError` and each front end says it from them."""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any, Literal

from predictor.ranking.constraints import SPECS

Vocabulary = Literal["python", "flags"]


@dataclass(frozen=True)
class Words:
    """A front end's words for the constraints: ``python`` (the library and the service) or ``flags`` (the CLI)."""

    vocabulary: Vocabulary = "python"

    @property
    def caller(self) -> str:
        """What the user called: ``rank()`` or ``srifty recommend``."""
        return "srifty recommend" if self.vocabulary == "flags" else "rank()"

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
        unit, never a number ``parse_duration`` refuses), ``--allow-arm64``."""
        spec = SPECS.get(field)
        if self.vocabulary == "python" or spec is None or spec.flag is None:
            shown = f"{value:g}" if isinstance(value, float) else repr(value)
            return f"{field}={shown}"
        flag = self.name(field)
        if value is True:
            return flag
        if isinstance(value, (tuple, list)):
            return f"{flag} {','.join(str(v) for v in value)}"
        if spec.unit == "h" and isinstance(value, (int, float)):  # a duration as the user writes it: 10m, not 0.17h
            return f"{flag} {value * 60:.4g}m" if value < 1 else f"{flag} {value:.6g}h"
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        return f"{flag} {shown}{spec.unit}"


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
