"""lightning-srifty: profile a Lightning run, then choose, provision and move to the right cloud GPUs.

    from lightning_srifty import SriftyCallback
    trainer = Trainer(callbacks=[SriftyCallback()], strategy="srifty_ddp")

Attributes load lazily so that the torch-free parts (``srifty recommend``, the service) start fast; importing
``SriftyCallback`` or ``SriftyDDPStrategy`` (or this package after ``lightning``) registers the ``"srifty_ddp"``
strategy with Lightning.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"

__all__ = ["SriftyCallback", "SriftyDDPStrategy", "SriftyError", "__version__", "capture_ops", "load_profile"]

_LAZY = {
    "SriftyCallback": "lightning_srifty.callback",
    "SriftyDDPStrategy": "lightning_srifty.strategy",
    "SriftyError": "predictor.exceptions",
    "capture_ops": "lightning_srifty.capture",
    "load_profile": "predictor.profile",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightning_srifty' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if "lightning.pytorch" in sys.modules:  # lightning is loaded anyway: make strategy="srifty_ddp" work right away
    importlib.import_module("lightning_srifty.strategy")
