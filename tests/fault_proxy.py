"""A fault-injecting HTTP proxy in front of moto's server: every request is passed through unchanged, except EC2
calls that launch instances (CreateFleet, RunInstances) of the named instance types, which get the error EC2 gives
when it has no capacity, and the first call of each action in ``lose``, which moto carries out but whose answer is
replaced by EC2's 500 InternalError (an answer lost on its way back: the AWS SDK retries the call). Calls that
carry a ClientToken are idempotent, as on EC2 (a repeated token gets the first call's answer, nothing is made
twice), which moto's server is not: an SDK retry of a launch, or of a CreateLaunchTemplate, whose answer was lost or
slow on a loaded machine would otherwise make a second fleet or template outside terraform's state (CI met the
template: one left behind by the failover test). User data over EC2's limit is refused as EC2 refuses it (moto takes
any size): "User data is limited to 16 KB, in raw form, before it is base64-encoded"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html), for RunInstances and launch templates alike.
Point the AWS provider (srifty's aws_endpoint) at it."""

from __future__ import annotations

import base64
import binascii
import http.client
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _support import LocalServer

LAUNCHES = ("CreateFleet", "RunInstances")
ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code><Message>We currently do not '
    "have sufficient {itype} capacity in the Availability Zone you requested. Our system will be working on "
    "provisioning additional capacity.</Message></Error></Errors><RequestID>srifty-fault-proxy</RequestID></Response>"
)


USER_DATA_LIMIT = 16_384  # bytes of raw user data (before base64), EC2's documented limit (module docstring)
TOO_LONG = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>User '
    "data is limited to 16384 bytes</Message></Error></Errors><RequestID>srifty-fault-proxy</RequestID></Response>"
)


def user_data_sizes(form: dict[str, list[str]]) -> list[int]:
    """The raw size of every user data an EC2 query-API call carries (``UserData``, ``LaunchTemplateData.UserData``)."""
    sizes = []
    for key, values in form.items():
        if key == "UserData" or key.endswith(".UserData"):
            for value in values:
                try:
                    sizes.append(len(base64.b64decode(value, validate=False)))
                except (binascii.Error, ValueError):
                    sizes.append(len(value))
    return sizes


LOST = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InternalError</Code><Message>An internal '
    "error has occurred</Message></Error></Errors><RequestID>srifty-fault-proxy</RequestID></Response>"
)


class FaultProxy(LocalServer):
    def __init__(
        self,
        upstream: str,
        refuse: set[str] = frozenset(),
        code: str = "InsufficientInstanceCapacity",
        lose: set[str] = frozenset(),
    ) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.refuse, self.code, self.lose = refuse, code, set(lose)
        self.refused: list[str] = []
        self.too_long: list[str] = []  # calls refused for their user data's size: "Action:bytes"
        self.lost: list[str] = []
        self.answered: dict[tuple[str, str], tuple[int, list[tuple[str, str]], bytes]] = {}  # by ClientToken
        self.replayed: list[str] = []  # launches answered from an earlier call's token
        self.replayed_other: list[str] = []  # other calls so answered (CreateLaunchTemplate retried by the SDK ...)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send_error(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(data)))
                # the AWS SDK retries these: each retry on a fresh connection, so that the last attempt's error is
                # the one sent, never a read on a connection the server has meanwhile dropped
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def _handle(self) -> None:
                body = self._body()
                form = urllib.parse.parse_qs(body.decode("latin-1")) if b"Action=" in body else {}
                action = (form.get("Action") or [""])[0]
                types = {v for k, vs in form.items() if k.endswith("InstanceType") for v in vs}
                hit = sorted(types & outer.refuse)
                too_long = [n for n in user_data_sizes(form) if n > USER_DATA_LIMIT]
                if too_long:  # EC2 refuses it; moto would take it
                    outer.too_long.append(f"{action}:{too_long[0]}")
                    self._send_error(400, TOO_LONG.encode())
                    return
                if action in LAUNCHES and hit:
                    outer.refused.append(f"{action}:{hit[0]}")
                    self._send_error(400, ERROR.format(code=outer.code, itype=hit[0]).encode())
                    return
                token = (form.get("ClientToken") or [""])[0]
                key = (action, token)
                if token and key in outer.answered:  # EC2's idempotency: a repeated token gets the first answer
                    (outer.replayed if action in LAUNCHES else outer.replayed_other).append(action)
                    self._reply(*outer.answered[key])
                    return
                conn = http.client.HTTPConnection(outer.upstream.hostname, outer.upstream.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "host")}
                headers["Content-Length"] = str(len(body))
                headers["Host"] = f"{outer.upstream.hostname}:{outer.upstream.port}"
                conn.request(
                    self.command,
                    self.path,
                    body=body if body or self.command not in ("GET", "HEAD") else None,
                    headers=headers,
                )
                answer = conn.getresponse()
                data = answer.read()
                if token and answer.status < 300:  # carried out: a retry gets this answer
                    outer.answered[key] = (answer.status, answer.getheaders(), data)
                if action in outer.lose:  # carried out upstream; the client sees a server error instead
                    outer.lose.discard(action)
                    outer.lost.append(action)
                    conn.close()
                    self._send_error(500, LOST.encode())
                    return
                self._reply(answer.status, answer.getheaders(), data)
                conn.close()

            def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
