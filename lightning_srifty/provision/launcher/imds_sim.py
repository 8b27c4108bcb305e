"""A local IMDSv2-compatible metadata server, for trying spot interruptions without EC2 (``srifty launch
--simulate-notice-after``) and for tests: a token endpoint, the token required on every read, 404 on
``spot/instance-action`` until :meth:`LocalIMDS.notify` is called."""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalIMDS:
    """``metadata`` maps paths under ``/latest/`` (e.g. ``meta-data/instance-type``) to bodies; every request is
    recorded in ``requests`` as (method, path)."""

    def __init__(self, metadata: dict[str, str] | None = None) -> None:
        self.token = secrets.token_hex(16)
        self.metadata = dict(metadata if metadata is not None else {"meta-data/instance-life-cycle": "spot"})
        self.requests: list[tuple[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_PUT(self) -> None:
                owner.requests.append(("PUT", self.path))
                ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                self._reply(200 if ok else 400, owner.token if ok else "bad token request")

            def do_GET(self) -> None:
                owner.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") != owner.token:
                    self._reply(401, "missing or wrong token")
                    return
                body = owner.metadata.get(self.path.removeprefix("/latest/"))
                self._reply(200 if body is not None else 404, body if body is not None else "not found")

            def _reply(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="srifty-local-imds", daemon=True)

    def notify(self, action: str = "terminate", when: str | None = None) -> None:
        """Post a spot notice as AWS does: the action and an ISO 8601 UTC time (default: two minutes from now)."""
        if when is None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self.metadata["meta-data/spot/instance-action"] = json.dumps({"action": action, "time": when})

    def __enter__(self) -> LocalIMDS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
