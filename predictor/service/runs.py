"""Run tokens: the identity an observation is counted under (issue #36 M5).

An observation steers the next ranking only together with others from distinct runs (``MIN_RUNS`` in
:mod:`predictor.service.observations`). A run used to be whatever ``source`` string the post declared, so anyone
holding the service's write token (and every training job held it) could post four observations under four invented
names and move the top pick. Now a run is what the service issued: ``POST /v1/runs`` (the service's own token only)
answers a run id and a *run token*, ``srun.<run id>.<expiry>.<signature>``, the signature an HMAC-SHA256 of the id
and the expiry under a key only the service holds. A training job is given the run token, never the service's token:
it can post observations, every one counted under its one run, and cannot mint another run.

The key is derived from the service's token (``HMAC(token, "srifty run tokens v1")``), so run tokens outlive a
restart of the service and die when its token is rotated; a service started without a token
(``--allow-unauthenticated-writes``) draws a random key when it starts, and its run tokens end with it.
Stateless: nothing is stored per run, and a replaced observations store does not change which tokens are good.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from predictor.exceptions import ConfigError

PREFIX = "srun"
DEFAULT_TTL_S = 30 * 86400  # a training run of a month; the fleet's life cap is far shorter
MAX_TTL_S = 365 * 86400
_KEY_LABEL = b"srifty run tokens v1"
_RUN_ID = re.compile(r"^r-[0-9a-f]{16}$")
_SIGNATURE_BYTES = 32


@dataclass(frozen=True)
class IssuedRun:
    """What ``POST /v1/runs`` answers: the run's id, its token (a secret: give it to the run's jobs only) and when
    the token stops being accepted (ISO 8601, UTC)."""

    run_id: str
    token: str
    expires_at: str


class RunTokens:
    """Issues and checks run tokens under one key.

    Args:
        service_token: the service's own bearer token (the key is derived from it); None: a random key for the life
            of this object (a service without a token).
    """

    def __init__(self, service_token: str | None) -> None:
        secret = service_token.strip().encode() if service_token else secrets.token_bytes(32)
        self._key = hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()

    def _sign(self, run_id: str, expires: int) -> str:
        mac = hmac.new(self._key, f"{run_id}.{expires}".encode(), hashlib.sha256).digest()[:_SIGNATURE_BYTES]
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def issue(self, ttl_s: int = DEFAULT_TTL_S, *, now: float | None = None) -> IssuedRun:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 60 <= ttl_s <= MAX_TTL_S:
            raise ConfigError(
                f"A run token's ttl_s must be a whole number of seconds from 60 to {MAX_TTL_S} (a year). Got "
                f"{ttl_s!r}.",
                parameter="ttl_s",
                value=ttl_s,
            )
        run_id = "r-" + secrets.token_hex(8)
        expires = int(now if now is not None else time.time()) + ttl_s
        token = f"{PREFIX}.{run_id}.{expires}.{self._sign(run_id, expires)}"
        return IssuedRun(run_id, token, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)))

    def verify(self, token: str, *, now: float | None = None) -> str:
        """The run id of a good, unexpired run token; a :class:`ConfigError` saying what is wrong otherwise."""
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != PREFIX or not _RUN_ID.match(parts[1]) or not parts[2].isdigit():
            raise ConfigError("not a run token (srun.<run id>.<expiry>.<signature>)", parameter="authorization")
        run_id, expires = parts[1], int(parts[2])
        if not hmac.compare_digest(parts[3], self._sign(run_id, expires)):
            raise ConfigError(
                "the run token's signature does not match: it was not issued by this service, or the service's "
                "token was changed since",
                parameter="authorization",
            )
        if expires < (now if now is not None else time.time()):
            raise ConfigError(
                f"the run token of {run_id} expired at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(expires))}",
                parameter="authorization",
            )
        return run_id


def is_run_token(token: str | None) -> bool:
    """Whether a bearer token is a run token (by its form; :meth:`RunTokens.verify` says whether it is good)."""
    return bool(token) and str(token).startswith(PREFIX + ".")
