"""Files the product reads are regular files of a bounded size (issue #23 item 7): a FIFO (which would hang every
command: nothing writes to it) and a device (``/dev/zero`` never ends) are refused before a byte is read; a file over
the limit is refused after at most limit + 1 bytes. One reader, :func:`predictor.documents.atomic.read_bounded`, serves
the catalog extra and every JSON document (profiles, plans)."""

from __future__ import annotations

import os

import pytest

from predictor.catalog.extra import load_extra
from predictor.documents.atomic import TooLarge, read_bounded
from predictor.documents.profile import load_profile
from predictor.exceptions import CatalogError, ProfileError


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_fifo_or_a_device_is_refused_without_reading(fifo) -> None:
    for path in (fifo, "/dev/zero"):
        with pytest.raises(OSError, match="not a regular file") as exc:
            read_bounded(path)
        assert not isinstance(exc.value, TooLarge)
    with pytest.raises(CatalogError, match=r"pipe: cannot read it: is a FIFO, not a regular file"):
        load_extra(fifo)
    with pytest.raises(CatalogError, match=r"/dev/zero: cannot read it: is a device, not a regular file"):
        load_extra("/dev/zero")
    with pytest.raises(ProfileError, match=r"Cannot read profile '.*pipe': it is a FIFO, not a regular file"):
        load_profile(fifo)
    with pytest.raises(ProfileError, match=r"'/dev/zero': it is a device, not a regular file"):
        load_profile("/dev/zero")


def test_a_file_over_the_limit_is_refused_after_limit_plus_one_bytes(tmp_path, monkeypatch) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 5000)
    assert read_bounded(big, 5000) == b"#" * 5000
    with pytest.raises(TooLarge, match="is over 4,999 bytes"):
        read_bounded(big, 4999)
    monkeypatch.setattr("predictor.catalog.extra.MAX_EXTRA_BYTES", 100)
    with pytest.raises(CatalogError, match=r"big.yaml: over 100 bytes, the most a catalog extra file may be"):
        load_extra(big)


def test_the_environment_variable_names_a_fifo_and_no_command_hangs(fifo, monkeypatch) -> None:
    from predictor.catalog import Catalog

    monkeypatch.setenv("SRIFTY_CATALOG_EXTRA", str(fifo))
    with pytest.raises(CatalogError, match="FIFO"):
        Catalog.load(use_refreshed=False)


def test_the_service_token_file_refuses_a_fifo(fifo) -> None:
    from lightning_srifty.cli.serve import read_token
    from predictor.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"token_file.*is a FIFO, not a regular file"):
        read_token(str(fifo))
