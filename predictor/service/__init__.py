"""The HTTP service (``srifty serve``) and its client:

- :mod:`~predictor.service.app`: the FastAPI application (:func:`create_app`);
- :mod:`~predictor.service.guard`: its limits (body size, concurrency, timeouts, memory) and error bodies;
- :mod:`~predictor.service.answers`: the response schemas (OpenAPI);
- :mod:`~predictor.service.observations`: measured runs users report back, which calibrate later predictions;
- :mod:`~predictor.service.client`: :class:`ServiceClient` (the standard library only).

``create_app`` loads FastAPI when first asked for: the client does not need it. The other names of 0.2's
``predictor.service`` module (``background_server``, ``ServiceSettings``, ``MAX_BODY_BYTES``, ``model_key``, ...)
still resolve here, with a ``DeprecationWarning``, until 0.3: import them from their modules.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from predictor.service.client import ServiceClient

__all__ = ["ServiceClient", "create_app"]


def __getattr__(name: str) -> Any:
    if name.startswith("_"):  # probes of the import system and tools (__wrapped__, ...): never load FastAPI for them
        raise AttributeError(f"module 'predictor.service' has no attribute {name!r}")
    if name == "create_app":  # without the serve extra this raises the ImportError the CLI names the extra from
        return importlib.import_module("predictor.service.app").create_app
    try:
        app = importlib.import_module("predictor.service.app")
    except ImportError:  # no FastAPI: 0.2's module names cannot be there either
        raise AttributeError(f"module 'predictor.service' has no attribute {name!r}") from None
    if hasattr(app, name):  # 0.2's predictor.service was the app module
        value = getattr(app, name)
        home = getattr(value, "__module__", None) or "predictor.service.app"
        if not home.startswith("predictor.service"):
            home = "predictor.service.app"
        warnings.warn(
            f"predictor.service.{name} moved: import it from {home} (the old path goes in lightning-srifty 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
    raise AttributeError(f"module 'predictor.service' has no attribute {name!r}")
