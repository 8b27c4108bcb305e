"""The HTTP service (``srifty serve``) and its client:

- :mod:`~predictor.service.app`: the FastAPI application (:func:`create_app`);
- :mod:`~predictor.service.guard`: its limits (body size, concurrency, timeouts, memory) and error bodies;
- :mod:`~predictor.service.answers`: the response schemas (OpenAPI);
- :mod:`~predictor.service.observations`: measured runs users report back, which calibrate later predictions;
- :mod:`~predictor.service.client`: :class:`ServiceClient` (the standard library only).

``create_app`` loads FastAPI when first asked for: the client does not need it.
"""

from __future__ import annotations

import importlib
from typing import Any

from predictor.service.client import ServiceClient

__all__ = ["ServiceClient", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        return importlib.import_module("predictor.service.app").create_app
    raise AttributeError(f"module 'predictor.service' has no attribute {name!r}")
