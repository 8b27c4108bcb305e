"""A small client of ``srifty serve`` (standard library only, so that a training job needs nothing more)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from predictor.exceptions import ServiceError
from predictor.plan import Plan, load_plan
from predictor.profile import Profile

if TYPE_CHECKING:
    from predictor.ranking.constraints import Constraints


class ServiceClient:
    """``ServiceClient("http://127.0.0.1:8000").rank(profile, {"steps": 100000})``."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ServiceError(f"The predictor URL must start with http:// or https://. Got {url!r}.")
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", "accept": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                detail = json.load(exc)["detail"]
                message = "; ".join(d.get("msg", str(d)) for d in detail) if isinstance(detail, list) else str(detail)
            except (ValueError, KeyError, TypeError):
                message = exc.reason
            raise ServiceError(f"{self.url}{path} answered {exc.code}: {message}", status=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServiceError(
                f"Cannot reach the predictor at {self.url} ({reason}). Is `srifty serve` running there?"
            ) from None

    def rank(self, profile: Profile, constraints: Constraints | dict[str, Any]) -> Plan:
        asked = constraints if isinstance(constraints, dict) else constraints.to_request()
        return load_plan(self._post("/v1/rank", {"profile": profile.to_dict(), "constraints": asked}))

    def predict(self, profile: Profile, fleet: str, scaling: str = "strong") -> dict[str, Any]:
        return self._post("/v1/predict", {"profile": profile.to_dict(), "fleet": fleet, "scaling": scaling})

    def observe(
        self, profile: Profile, fleet: str, throughput_samples_s: float, *, iteration_time_s: float | None, source: str
    ) -> dict[str, Any]:
        body = {
            "profile": profile.to_dict(),
            "fleet": fleet,
            "throughput_samples_s": throughput_samples_s,
            "iteration_time_s": iteration_time_s,
            "source": source[:200],
        }
        return self._post("/v1/observations", body)
