"""``python -m lightning_srifty.cli``: the same as the ``srifty`` command."""

from lightning_srifty.cli import main

raise SystemExit(main())
