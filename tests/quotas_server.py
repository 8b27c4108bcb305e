"""A small local fake of the AWS Service Quotas API (JSON 1.1 over HTTP, what boto3 speaks): moto's own knows only
VPC quotas. It serves EC2's vCPU quotas by name and code, ListServiceQuotas (paged) and GetServiceQuota, and records
what was asked. Point boto3 at it with AWS_ENDPOINT_URL_SERVICE_QUOTAS."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _support import LocalServer

# (name, code, value): EC2 vCPU quotas by their Service Quotas names; the codes are AWS's except the P5 spot one,
# which stands in (srifty reads codes from the listing, never from a table of its own)
EC2_QUOTAS = (
    ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "L-1216C47A", 64.0),
    ("Running On-Demand P instances", "L-417A185B", 0.0),
    ("Running On-Demand G and VT instances", "L-DB2E81BA", 8.0),
    ("All P4, P3 and P2 Spot Instance Requests", "L-7212CCBC", 0.0),
    ("All P5 Spot Instance Requests", "L-C4BD4855", 0.0),
    ("All G and VT Spot Instance Requests", "L-3819A6DF", 8.0),
    ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", "L-34B43A08", 64.0),
)


class FakeServiceQuotas(LocalServer):
    """``with FakeServiceQuotas({"Running On-Demand P instances": 192}) as url:`` overrides values by name."""

    def __init__(self, values: dict[str, float] | None = None, fail: str | None = None) -> None:
        self.quotas = [
            {"QuotaName": n, "QuotaCode": c, "Value": (values or {}).get(n, v), "ServiceCode": "ec2", "Unit": "None"}
            for n, c, v in EC2_QUOTAS
        ]
        self.fail = fail  # an error code every call answers with (AccessDeniedException ...)
        self.calls: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                action = self.headers.get("X-Amz-Target", "").rsplit(".", 1)[-1]
                outer.calls.append(action)
                status, answer = outer.answer(action, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def answer(self, action: str, body: dict) -> tuple[int, dict]:
        if self.fail:
            return 400, {"__type": self.fail, "message": "User is not authorized to perform this action"}
        if action == "ListServiceQuotas":
            start = int(body.get("NextToken") or 0)
            page = self.quotas[start : start + 3]  # small pages: the client must follow NextToken
            more = start + 3 < len(self.quotas)
            return 200, {"Quotas": page, **({"NextToken": str(start + 3)} if more else {})}
        if action == "GetServiceQuota":
            found = [q for q in self.quotas if q["QuotaCode"] == body.get("QuotaCode")]
            if found:
                return 200, {"Quota": found[0]}
            return 400, {"__type": "NoSuchResourceException", "message": "no such quota"}
        return 400, {"__type": "UnknownOperationException", "message": action}
