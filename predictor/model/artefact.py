"""The fitted constants of the performance model (``predictor/data/model_v3.json``), read once, never trained on load.

``scripts/fit_model.py`` writes it from the bundled measurements: the data-parallel loss constants
(:mod:`predictor.model.scaling`), the tensor-core efficiencies of the operator path, and the held-out error of each
kind of prediction (:mod:`predictor.model.uncertainty`), with the data's sha256 and the library versions it was fitted
with. Everything in it is plain numbers evaluated with numpy, so an install with other library versions reads it as
it is; a missing or foreign file falls back to the documented defaults of each module (and says so).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from importlib import resources
from typing import Any

SCHEMA = "srifty.model/v3"
FILENAME = "model_v3.json"
# every file of fitted constants a prediction reads: the model's identity is their schema and content
CONSTANT_FILES = (FILENAME, "kernel_model.json", "correction.json")


@functools.cache
def model_artefact() -> dict[str, Any]:
    """The fitted constants ({} when the file is missing or of another schema)."""
    try:
        data = json.loads(resources.files("predictor.data").joinpath(FILENAME).read_text("utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else {}


@functools.cache
def model_version() -> str:
    """Which performance model made a prediction: the schema and the first 12 hex digits of the sha256 over the
    fitted-constant files (``CONSTANT_FILES``) and the model's own code (``predictor/model/*.py``, by name), e.g.
    ``srifty.model/v3+1a2b3c4d5e6f``. Two predictions with the same version came from the same numbers and the same
    model code (the catalog's GPU facts are the catalog's, recorded apart); a refit or a changed term changes it
    (until 2026-11-30 the code was not in it, so a term changed without a constant moving kept the version).
    ``+missing`` when a constant file is absent (defaults in use)."""
    digest = hashlib.sha256()
    folder = resources.files("predictor.data")
    for name in CONSTANT_FILES:
        try:
            digest.update(folder.joinpath(name).read_bytes())
        except FileNotFoundError:
            return f"{SCHEMA}+missing"
    for name, text in model_code():
        digest.update(name.encode() + b"\0" + text)
    return f"{SCHEMA}+{digest.hexdigest()[:12]}"


def model_code() -> list[tuple[str, bytes]]:
    """(name, bytes) of the model's modules, ``predictor/model/*.py`` by name: module names only (an editor's lock or
    backup file is not the model), a file that cannot be read left out rather than failing a prediction."""
    code = resources.files("predictor.model")
    out = []
    for name in sorted(f.name for f in code.iterdir() if re.fullmatch(r"[A-Za-z_]\w*\.py", f.name)):
        try:
            out.append((name, code.joinpath(name).read_bytes()))
        except OSError:
            continue
    return out
