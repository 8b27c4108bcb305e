"""An IMDSv2-compatible HTTP server on 127.0.0.1 for tests (token endpoint, token check, metadata paths)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "test-token-123"


class FakeIMDS:
    def __init__(self, metadata: dict[str, str]) -> None:
        self.metadata = dict(metadata)
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                server.requests.append(("PUT", self.path))
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._reply(200, TOKEN)
                else:
                    self._reply(400, "bad token request")

            def do_GET(self):
                server.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    self._reply(401, "missing or wrong token")
                    return
                key = self.path.removeprefix("/latest/")
                if key in server.metadata:
                    self._reply(200, server.metadata[key])
                else:
                    self._reply(404, "not found")

            def _reply(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeIMDS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
