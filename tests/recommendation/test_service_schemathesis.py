"""Property-based tests of the HTTP API against its own OpenAPI document (schemathesis): no input, however odd,
gets a 5xx, every status code and content type is one the document declares, and every answer, success or error,
validates against the schema the document declares for it."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from predictor.catalog import Catalog  # noqa: E402
from predictor.service.app import ServiceSettings, create_app  # noqa: E402

pytestmark = pytest.mark.slow  # hypothesis drives hundreds of requests: ~40 s in all on 2 cores

_APP = None
_TOKEN = "schemathesis-token-" + "s" * 20  # at least 32 bytes


def _app():
    global _APP
    if _APP is None:
        import tempfile

        folder = tempfile.mkdtemp(prefix="srifty-schemathesis-")
        _APP = create_app(
            catalog=Catalog.load(use_refreshed=False, use_env=False),
            observations=f"{folder}/o.sqlite",
            settings=ServiceSettings(token=_TOKEN, allowed_hosts=("testserver",)),
        )
    return _APP


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_and_never_fails(case) -> None:
    # with the token, so that writes are explored past the 401
    case.call_and_validate(
        headers={"Authorization": f"Bearer {_TOKEN}"},
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
    )
