"""A small client of ``srifty serve`` (standard library only, so that a training job needs nothing more)."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from predictor.documents.plan import Plan, load_plan
from predictor.documents.profile import Profile, load_profile
from predictor.exceptions import ServiceError
from predictor.service.runs import is_run_token

if TYPE_CHECKING:
    from predictor.ranking.constraints import Constraints


TOKEN_ENV = "SRIFTY_SERVICE_TOKEN"
RETRY_STATUSES = (429, 503)  # too many at once / timed out: the service says when to retry (Retry-After)
MAX_BODY_BYTES = 1 << 20  # srifty serve's default body limit (its guard's): a profile with full series is ~100 KB
# a request over this that the service cut off while it was sent was, most likely, over the service's limit
CUT_OFF_BYTES = 64 << 10
_ISSUED: dict[tuple[str, str], str] = {}  # (service URL, run) -> the run token this process was issued
_ISSUED_LOCK = threading.Lock()


class ServiceClient:
    """``ServiceClient("http://127.0.0.1:8000").rank(profile, {"steps": 100000})``.

    Args:
        url: where ``srifty serve`` listens.
        timeout_s: socket timeout of one request.
        token: the service's bearer token, or a run token (``srifty run-token``: what a training job should hold),
            sent with every request (writes need it); default: $SRIFTY_SERVICE_TOKEN.
        retries: how many times a ranking or prediction answered 429 or 503 is asked again, after the service's
            ``Retry-After`` (at most ``max_wait_s`` each); observations are never sent twice.
        max_wait_s: the longest wait between retries.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        *,
        token: str | None = None,
        retries: int = 2,
        max_wait_s: float = 10.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ServiceError(f"The predictor URL must start with http:// or https://. Got {url!r}.")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.retries, self.max_wait_s = retries, max_wait_s
        self._token = token if token is not None else (os.environ.get(TOKEN_ENV, "").strip() or None)

    def __repr__(self) -> str:  # never the token
        return f"ServiceClient({self.url!r}, token={'set' if self._token else None})"

    def _post(self, path: str, body: dict[str, Any], *, retry: bool = True) -> Any:
        attempts = self.retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                return self._post_once(path, body)
            except ServiceError as error:
                if error.retry_after_s is None or attempt == attempts - 1:
                    raise
                time.sleep(min(self.max_wait_s, error.retry_after_s))
        raise AssertionError("unreachable")  # pragma: no cover

    def _post_once(self, path: str, body: dict[str, Any], token: str | None = None) -> Any:
        headers = {"content-type": "application/json", "accept": "application/json"}
        token = token or self._token
        if token:
            headers["authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                detail = json.load(exc)["detail"]
                message = "; ".join(d.get("msg", str(d)) for d in detail) if isinstance(detail, list) else str(detail)
            except (ValueError, KeyError, TypeError):
                message = exc.reason
            if exc.code in (401, 403) and not self._token:
                message += f" (no token was sent: pass token= or set {TOKEN_ENV})"
            retry = _seconds(exc.headers.get("Retry-After")) if exc.code in RETRY_STATUSES else None
            raise ServiceError(
                f"{self.url}{path} answered {exc.code}: {message}", status=exc.code, retry_after_s=retry
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, (BrokenPipeError, ConnectionResetError)) and len(data) > CUT_OFF_BYTES:
                # the guard answers 413 from the length alone and closes; urllib is still sending (a trial read
                # "Is srifty serve running there?" for a 2 MB profile)
                raise ServiceError(
                    f"The predictor at {self.url} closed the connection while the {len(data):,}-byte request was "
                    f"sent ({reason}): most likely over its body limit (a 413; `srifty serve --max-body` raises it, "
                    f"{MAX_BODY_BYTES:,} bytes by default). Send a smaller profile (its notes, its operator table).",
                    status=413,
                ) from None
            raise ServiceError(
                f"Cannot reach the predictor at {self.url} ({reason}). Is `srifty serve` running there?"
            ) from None

    def rank(self, profile: ProfileLike, constraints: Constraints | dict[str, Any], words: str = "python") -> Plan:
        """The service's plan for ``profile`` under ``constraints``, its prose in ``words`` (``python``: the
        constraints' names, as the JSON fields; ``flags``: ``srifty recommend``'s flags)."""
        asked = constraints if isinstance(constraints, dict) else constraints.to_request()
        body: dict[str, Any] = {"profile": _profile_body(profile), "constraints": asked}
        if words != "python":  # a service from before the field refuses it; the default needs none
            body["words"] = words
        return load_plan(self._post("/v1/rank", body))

    def predict(
        self,
        profile: ProfileLike,
        fleet: str,
        scaling: str = "strong",
        *,
        layout: str = "auto",
        transport: str = "auto",
    ) -> dict[str, Any]:
        """``POST /v1/predict``: the fields a prediction takes. ``layout`` (default ``auto``: the one srifty recommend
        runs the fleet with, as ``srifty predict``'s) is always sent: a service from before 2026-12-06 took plain DDP
        for a missing one and refuses ``auto`` by name, rather than answering another layout silently. ``transport``
        is sent only when not the default, so a service from before it answers as it did."""
        body: dict[str, Any] = {"profile": _profile_body(profile), "fleet": fleet, "scaling": scaling}
        body["layout"] = layout
        if transport != "auto":
            body["transport"] = transport
        return self._post("/v1/predict", body)

    def issue_run(self, ttl_s: int | None = None) -> dict[str, Any]:
        """A new run and its token (``POST /v1/runs``; needs the service's own token): ``{"run_id", "token",
        "expires_at"}``. Give the token to that run's jobs, not the service's token."""
        return self._post("/v1/runs", {} if ttl_s is None else {"ttl_s": ttl_s}, retry=False)

    def observe(
        self,
        profile: ProfileLike,
        fleet: str,
        throughput_samples_s: float,
        *,
        iteration_time_s: float | None = None,
        source: str = "",
        run: str | None = None,
        transport: str | None = None,
    ) -> dict[str, Any]:
        """Post a measured throughput. With a run token it counts under that token's run. With the service's own
        token and a ``run`` (the caller's identity of its run: a launch id, a process), the client first has the
        service issue a run for it, once per process, and posts with that run's token; with neither it is stored
        and counts toward no run (the answer's ``note`` says so). ``transport``: how the fleet's nodes met (its
        plan's), sent only when known. ``throughput_samples_s``: the whole fleet's samples per second;
        ``iteration_time_s``: one optimizer step (its accumulated batches): their product is the run's global batch,
        and an observation whose product is not the profile's is stored and counted in no calibration."""
        body: dict[str, Any] = {
            "profile": _profile_body(profile),
            "fleet": fleet,
            "throughput_samples_s": throughput_samples_s,
            "iteration_time_s": iteration_time_s,
            "source": source[:200],
        }
        if transport is not None:
            body["transport"] = transport
        token = None
        if run and self._token and not is_run_token(self._token):
            with _ISSUED_LOCK:
                token = _ISSUED.get((self.url, run))
                if token is None:
                    token = _ISSUED[(self.url, run)] = str(self.issue_run()["token"])
        return self._post_once("/v1/observations", body, token)  # a write is never sent twice


def _seconds(retry_after: str | None) -> float:
    """Retry-After in seconds (the service sends whole seconds; an HTTP date or garbage: 1 s)."""
    try:
        return max(0.0, float(retry_after or 1))
    except ValueError:
        return 1.0


ProfileLike = Profile | dict[str, Any] | str | os.PathLike[str]


def _profile_body(profile: ProfileLike) -> dict[str, Any]:
    """A profile as the service takes it: a :class:`Profile`, its JSON as a dict (``json.load``) or a file path, read
    and checked here (a bad one is refused in the CLI's words before anything is sent). A dict was sent to
    ``.to_dict()`` and failed with an AttributeError (a new user's trial)."""
    return (profile if isinstance(profile, Profile) else load_profile(profile)).to_dict()
