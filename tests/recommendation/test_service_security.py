"""srifty serve's promises (issue #14, docs/security.md): bounded work per request (429/503 with Retry-After),
authenticated writes, the Host check against DNS rebinding, and no 500 for hostile input."""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _support import MINIMAL
from predictor.documents.profile import load_profile
from predictor.exceptions import ServiceError
from predictor.service.app import ServiceSettings, background_server, create_app
from predictor.service.client import ServiceClient
from predictor.service.observations import ObservationStore

TOKEN = "s3cret-token-" + "x" * 24  # at least 32 bytes (MIN_TOKEN_BYTES)


def _app(tmp_path, catalog, **settings):
    settings.setdefault("allowed_hosts", ("testserver",))
    return create_app(catalog=catalog, observations=tmp_path / "obs.sqlite", settings=ServiceSettings(**settings))


def _observation(name: str = "resnet50") -> dict:
    profile = {**copy.deepcopy(MINIMAL), "model": {**MINIMAL["model"], "name": name}}
    return {"profile": profile, "fleet": "g5.xlarge:1", "throughput_samples_s": 500.0, "source": "test"}


def _raw(client: TestClient, path: str, text: str | bytes, **headers: str):
    return client.post(path, content=text, headers={"content-type": "application/json", **headers})


# ------------------------------------------------------------------ authenticated writes


def test_writes_need_the_token_and_reads_do_not(tmp_path, catalog) -> None:
    with TestClient(_app(tmp_path, catalog, token=TOKEN)) as c:
        r = c.post("/v1/observations", json=_observation())
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["detail"][0]["loc"] == ["header", "authorization"] and "no Authorization" in r.text
        for wrong in (f"Bearer {TOKEN[:-1]}X", "Bearer ", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}2"):
            r = c.post("/v1/observations", json=_observation(), headers={"authorization": wrong})
            assert r.status_code == 401, wrong
        assert c.get("/v1/observations").json()["observations"] == []  # nothing was written
        r = c.post("/v1/observations", json=_observation(), headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
        assert len(c.get("/v1/observations").json()["observations"]) == 1  # reads stay open
        assert c.post("/v1/predict", json={"profile": MINIMAL, "fleet": "p3.2xlarge"}).status_code == 200


def test_without_a_token_writes_are_refused_unless_explicitly_opened(tmp_path, catalog) -> None:
    with TestClient(_app(tmp_path, catalog)) as c:
        r = c.post("/v1/observations", json=_observation(), headers={"authorization": "Bearer anything"})
        assert r.status_code == 403 and "--token-file" in r.json()["detail"][0]["msg"]
    with TestClient(_app(tmp_path, catalog, allow_unauthenticated_writes=True)) as c:
        assert c.post("/v1/observations", json=_observation()).status_code == 201


def test_the_write_token_is_checked_before_the_body_is_read(tmp_path, catalog) -> None:
    """An unauthenticated write gets 401 whatever its body: nothing of it is parsed or validated."""
    with TestClient(_app(tmp_path, catalog, token=TOKEN)) as c:
        assert _raw(c, "/v1/observations", b"{not json").status_code == 401


def test_the_comparison_is_constant_time(monkeypatch, tmp_path, catalog) -> None:
    import hmac

    seen = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    with TestClient(_app(tmp_path, catalog, token=TOKEN)) as c:
        c.post("/v1/observations", json=_observation(), headers={"authorization": "Bearer guess"})
    assert seen == [(b"guess", TOKEN.encode())]


def test_the_client_sends_the_token_from_its_argument_or_the_environment(tmp_path, catalog, monkeypatch) -> None:
    store = ObservationStore(tmp_path / "o.sqlite")
    app = create_app(catalog=catalog, observations=store, settings=ServiceSettings(token=TOKEN))
    profile = load_profile(copy.deepcopy(MINIMAL))
    monkeypatch.delenv("SRIFTY_SERVICE_TOKEN", raising=False)
    with background_server(app) as url:
        with pytest.raises(ServiceError, match=r"answered 401.*no token was sent") as info:
            ServiceClient(url).observe(profile, "g5.xlarge:1", 100.0, iteration_time_s=None, source="t")
        assert info.value.status == 401
        ServiceClient(url, token=TOKEN).observe(profile, "g5.xlarge:1", 100.0, iteration_time_s=None, source="arg")
        monkeypatch.setenv("SRIFTY_SERVICE_TOKEN", TOKEN)
        ServiceClient(url).observe(profile, "g5.xlarge:1", 100.0, iteration_time_s=None, source="env")
        assert TOKEN not in repr(ServiceClient(url))
    assert sorted(o.source for o in store.list()) == ["arg", "env"]


def test_migration_triggers_post_observations_with_the_token(tmp_path, catalog) -> None:
    from lightning_srifty.migrate.triggers import MigrationTriggers, _post_observation
    from predictor.ranking import Constraints, rank

    profile = load_profile(copy.deepcopy(MINIMAL))
    plan = rank(profile, Constraints(steps=1000, allow=("g5.xlarge",), max_instances=1), catalog=catalog)
    store = ObservationStore(tmp_path / "o.sqlite")
    app = create_app(catalog=catalog, observations=store, settings=ServiceSettings(token=TOKEN))
    with background_server(app) as url:
        triggers = MigrationTriggers(plan, 0, str(tmp_path), profile=profile, predictor_url=url, predictor_token=TOKEN)
        _post_observation(triggers.predictor_url, triggers._predictor_token, profile, "g5.xlarge:1", 123.0, 0.5, "auto")
    assert [(o.fleet, o.throughput_samples_s) for o in store.list()] == [("g5.xlarge:1", 123.0)]


def test_the_callbacks_observation_is_of_an_optimizer_step(monkeypatch) -> None:
    """SriftyCallback posted a batch's time as ``iteration_time_s``, where the service's vocabulary (and the plan's)
    is an optimizer step: with 4 batches accumulated, throughput x it was a quarter of the global batch, the case the
    service now leaves out of its calibration."""
    from lightning_srifty.profiling.recommendation import post_observation
    from predictor.documents.work import global_batch

    doc = copy.deepcopy(MINIMAL)
    doc["batch"] = {"per_device": 64, "accumulate_grad_batches": 4}
    doc["hardware"] = {**doc["hardware"], "instance_type": "p3.2xlarge"}
    profile = load_profile(doc)
    sent: dict = {}

    class Client:
        def observe(self, profile, fleet, throughput, **kw):
            sent.update(kw, fleet=fleet, throughput=throughput)
            return {"note": "counted"}

    post_observation(Client(), profile)
    assert sent["fleet"] == "p3.2xlarge:1" and sent["iteration_time_s"] == pytest.approx(4 * 0.31)
    assert sent["throughput"] * sent["iteration_time_s"] == pytest.approx(global_batch(profile)) == 256


# ------------------------------------------------------------------ Host check (DNS rebinding)


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:8000", 200),
        ("localhost", 200),
        ("[::1]:8000", 200),
        ("LOCALHOST:80", 200),
        ("srifty.internal:8000", 200),  # --allowed-host
        ("attacker.example:8000", 400),
        ("127.0.0.1.attacker.example", 400),
        ("localhost.attacker.example:8000", 400),
        ("", 400),
    ],
)
def test_host_headers_other_than_the_served_names_are_refused(tmp_path, catalog, host, status) -> None:
    app = _app(tmp_path, catalog, allowed_hosts=("srifty.internal",))
    with TestClient(app) as c:
        r = c.get("/healthz", headers={"host": host})
    assert r.status_code == status, r.text
    if status == 400:
        (detail,) = r.json()["detail"]
        assert detail["loc"] == ["header", "host"] and "--allowed-host" in detail["msg"]


# ------------------------------------------------------------------ no 500 for hostile input


def _deep(levels: int) -> bytes:
    return b'{"profile": {"notes": ' + b"[" * levels + b"]" * levels + b'}, "fleet": "p3.2xlarge"}'


@pytest.mark.parametrize(
    ("name", "path", "text", "field"),
    [
        ("lone surrogate in model.name", "/v1/predict", "surrogate-name", "name"),
        ("lone surrogate in fleet", "/v1/predict", "surrogate-fleet", "fleet"),
        ("lone surrogate in source", "/v1/observations", "surrogate-source", "source"),
        ("cv = 1e300", "/v1/predict", "cv", "cv"),
        ("400-digit parameter count", "/v1/predict", "params-400", "parameters"),
        ("10^15 parameters", "/v1/predict", "params-1e15", "parameters"),
        ("2^63 samples per device", "/v1/rank", "per-device", "per_device"),
        ("per_device x ranks over 2^30", "/v1/predict", "world", "batch"),
        ("NaN literal", "/v1/observations", "nan", "throughput_samples_s"),
        ("Infinity literal", "/v1/predict", "inf", "p50"),
        ("100,000 levels of nesting", "/v1/predict", "deep", "body"),
        ("a 5,000-digit integer literal", "/v1/predict", "digits", "body"),
        ("not UTF-8", "/v1/predict", "latin1", "body"),
    ],
)
def test_hostile_input_is_a_4xx_naming_the_field(tmp_path, catalog, name, path, text, field) -> None:
    obs = _observation()
    fleet_body = {"profile": copy.deepcopy(MINIMAL), "fleet": "p3.2xlarge:1"}
    bodies: dict[str, str | bytes] = {
        "surrogate-name": json.dumps({**fleet_body, "profile": _observation("X")["profile"]}).replace(
            '"X"', '"\\ud800"'
        ),
        "surrogate-fleet": json.dumps({**fleet_body, "fleet": "X"}).replace('"X"', '"\\udfff"'),
        "surrogate-source": json.dumps({**obs, "source": "X"}).replace('"X"', '"a\\ud800b"'),
        "cv": json.dumps({**fleet_body, "profile": {**MINIMAL, "timing": {"step_time_s": {"p50": 0.31, "cv": 1e300}}}}),
        "params-400": json.dumps(
            {**fleet_body, "profile": {**MINIMAL, "model": {**MINIMAL["model"], "parameters": 10**400 - 1}}}
        ),
        "params-1e15": json.dumps(
            {**fleet_body, "profile": {**MINIMAL, "model": {**MINIMAL["model"], "parameters": 10**15}}}
        ),
        "per-device": json.dumps(
            {"profile": {**MINIMAL, "batch": {"per_device": 2**63}}, "constraints": {"steps": 1000}}
        ),
        "world": json.dumps(
            {
                **fleet_body,
                "profile": {**MINIMAL, "batch": {"per_device": 2048}, "hardware": {"gpu": "A100", "world_size": 2**20}},
            }
        ),
        "nan": json.dumps({**obs, "throughput_samples_s": float("nan")}),
        "inf": json.dumps(fleet_body).replace("0.31", "Infinity"),
        "deep": _deep(100_000),
        "digits": json.dumps(fleet_body).replace("25557032", "9" * 5000),
        "latin1": json.dumps({**fleet_body, "fleet": "p3.2xlarge\xe9"}).encode("latin-1"),
    }
    with TestClient(_app(tmp_path, catalog, allow_unauthenticated_writes=True)) as c:
        r = _raw(c, path, bodies[text])
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
    detail = r.json()["detail"][0]
    assert field in [str(x) for x in detail["loc"]], (name, detail)
    assert "Traceback" not in r.text and len(r.text) < 5000


def test_a_profile_measured_on_over_4096_ranks_is_predicted(tmp_path, catalog) -> None:
    """E[max of n normals] took the asymptotic branch for a scalar n > 4096 and failed (a 500)."""
    profile = {**MINIMAL, "hardware": {**MINIMAL["hardware"], "world_size": 8192}}
    with TestClient(_app(tmp_path, catalog)) as c:
        r = c.post("/v1/predict", json={"profile": profile, "fleet": "p4d.24xlarge:2"})
    assert r.status_code == 200, r.text


def test_a_model_just_under_the_parameter_limit_is_predicted(tmp_path, catalog) -> None:
    profile = {**MINIMAL, "model": {**MINIMAL["model"], "parameters": 10**13 - 1}}
    with TestClient(_app(tmp_path, catalog)) as c:
        r = c.post("/v1/predict", json={"profile": profile, "fleet": "p4d.24xlarge:32"})
    assert r.status_code == 200, r.text
    assert r.json()["fits_memory"] is False


# ------------------------------------------------------------------ bounded heavy work


class _Gate:
    """Holds every ranking inside rank() until released (a scripted slow ranking)."""

    def __init__(self, monkeypatch) -> None:
        import predictor.service.app as service

        self.entered, self.release = threading.Semaphore(0), threading.Event()
        real = service.rank

        def slow_rank(*args, **kwargs):
            self.entered.release()
            self.release.wait(30)
            return real(*args, **kwargs)

        monkeypatch.setattr(service, "rank", slow_rank)


def _rank_body() -> dict:
    return {"profile": MINIMAL, "constraints": {"steps": 1000, "allow": ["g5.xlarge"], "max_instances": 1}}


def test_too_many_heavy_requests_at_once_get_429_with_retry_after(tmp_path, catalog, monkeypatch) -> None:
    gate = _Gate(monkeypatch)
    app = _app(tmp_path, catalog, max_concurrent=2, max_queued=1)
    answers: list[int] = []
    with TestClient(app) as c:
        threads = [threading.Thread(target=lambda: answers.append(c.post("/v1/rank", json=_rank_body()).status_code))]
        threads += [threading.Thread(target=lambda: answers.append(c.post("/v1/rank", json=_rank_body()).status_code))]
        for t in threads:
            t.start()
        assert gate.entered.acquire(timeout=20) and gate.entered.acquire(timeout=20)  # two are computing
        assert app.state.heavy.running() == 2
        waiting = threading.Thread(
            target=lambda: answers.append(
                c.post("/v1/predict", json={"profile": MINIMAL, "fleet": "g5.xlarge"}).status_code
            )
        )
        waiting.start()  # the third waits in the queue (max_queued=1)
        deadline = time.monotonic() + 20
        while not app.state.heavy._slots._waiters and time.monotonic() < deadline:
            time.sleep(0.01)
        r = c.post("/v1/rank", json=_rank_body())  # the fourth finds the queue full
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        assert "--max-concurrent" in r.json()["detail"][0]["msg"]
        gate.release.set()
        for t in (*threads, waiting):
            t.join(30)
    assert sorted(answers) == [200, 200, 200]  # the waiting one got its turn
    assert app.state.heavy.running() == 0


def test_a_request_past_the_timeout_gets_503_and_its_slot_is_freed_when_the_work_ends(
    tmp_path, catalog, monkeypatch
) -> None:
    gate = _Gate(monkeypatch)
    app = _app(tmp_path, catalog, max_concurrent=1, request_timeout_s=0.3)
    with TestClient(app) as c:
        r = c.post("/v1/rank", json=_rank_body())
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["detail"][0]["type"] == "timeout" and "--request-timeout-s" in r.text
        assert app.state.heavy.running() == 1  # the abandoned ranking still holds its slot: memory stays bounded
        r = c.post("/v1/predict", json={"profile": MINIMAL, "fleet": "g5.xlarge"})  # waits for it, times out
        assert r.status_code == 503 and "waiting for a free slot" in r.text
        gate.release.set()
        deadline = time.monotonic() + 20
        while app.state.heavy.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert app.state.heavy.running() == 0
        assert c.post("/v1/predict", json={"profile": MINIMAL, "fleet": "g5.xlarge"}).status_code == 200


def test_the_client_retries_after_a_429(tmp_path, catalog, monkeypatch) -> None:
    calls = []

    def answer(self, path, body, token=None):
        calls.append(path)
        if len(calls) == 1:
            raise ServiceError("busy", status=429, retry_after_s=0.01)
        return {"ok": True}

    monkeypatch.setattr(ServiceClient, "_post_once", answer)
    client = ServiceClient("http://127.0.0.1:1")
    assert client.predict(load_profile(copy.deepcopy(MINIMAL)), "g5.xlarge") == {"ok": True}
    assert calls == ["/v1/predict", "/v1/predict"]
    calls.clear()
    with pytest.raises(ServiceError, match="busy"):  # a write is never sent twice
        client.observe(load_profile(copy.deepcopy(MINIMAL)), "g5.xlarge:1", 1.0, iteration_time_s=None, source="")
    assert calls == ["/v1/observations"]


def test_settings_name_the_bad_parameter() -> None:
    from predictor.exceptions import ConfigError

    with pytest.raises(ConfigError, match="'max_concurrent' parameter of ServiceSettings"):
        ServiceSettings(max_concurrent=0)
    with pytest.raises(ConfigError, match=r"'token'.*non-empty"):
        ServiceSettings(token="  ")
    with pytest.raises(ConfigError, match=r"'token'.*at least 32 bytes.*Got 12") as short:
        ServiceSettings(token="s3cret-token")  # issue #23 item 5: a short token is guessable
    assert "s3cret" not in str(short.value)
    assert "tok" not in repr(ServiceSettings(token="tok-" + "9" * 40))


# ------------------------------------------------------------------ slow or heavy clients (issue #23 item 6)


def _served(tmp_path, catalog, **settings):
    """A real uvicorn server (what srifty serve runs) for the app with these settings."""
    from predictor.service.app import background_server

    app = create_app(catalog=catalog, observations=tmp_path / "obs.sqlite", settings=ServiceSettings(**settings))
    return background_server(app)


def _socket_to(url: str):
    import socket

    host, port = url.split("//")[1].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _exchange(url: str, request: bytes, timeout: float = 10.0) -> bytes:
    """Send ``request`` on a fresh connection; what the server answers until it closes (or ``timeout``)."""

    with _socket_to(url) as s:
        s.settimeout(timeout)
        s.sendall(request)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def _established(url: str) -> int:
    """Server-side TCP connections of the service's port that are open (from /proc/net/tcp)."""
    port = int(url.rsplit(":", 1)[1])
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for r in rows if int(r[1].split(":")[1], 16) == port and r[3] == "01")


def _until_closed(sockets: list, timeout: float) -> list[tuple[bytes, float]]:
    """What each socket received until the server closed it, and when (``time.monotonic``); fails past ``timeout``."""
    import selectors

    selector = selectors.DefaultSelector()
    got = {sock: b"" for sock in sockets}
    closed: dict = {}
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    while len(closed) < len(sockets):
        assert time.monotonic() < end, f"{len(sockets) - len(closed)} connections still open after {timeout} s"
        for key, _ in selector.select(timeout=0.1):
            try:
                data = key.fileobj.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                got[key.fileobj] += data
            else:
                closed[key.fileobj] = time.monotonic()
                selector.unregister(key.fileobj)
    selector.close()
    return [(got[sock], closed[sock]) for sock in sockets]


def test_a_chunked_body_over_the_limit_is_a_413(tmp_path, catalog) -> None:
    """No Content-Length to check first: the limit is counted as the chunks arrive (it was a 400, 'error parsing')."""
    body = json.dumps({"profile": {"notes": ["x" * 5000]}, "fleet": "p3.2xlarge:1"}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 500]), body[i : i + 500]) for i in range(0, len(body), 500))
    head = b"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with _served(tmp_path, catalog, max_body_bytes=1000) as url:
        answer = _exchange(url, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"type":"too_large"' in answer and b"over 1000 bytes" in answer


def test_a_body_that_stops_arriving_is_a_408_after_the_read_timeout(tmp_path, catalog) -> None:
    head = b"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with _served(tmp_path, catalog, read_timeout_s=1.0) as url:
        started = time.monotonic()
        answer = _exchange(url, head + b"Content-Length: 100\r\n\r\n{", timeout=10)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b'"type":"timeout"' in answer and b"--read-timeout-s" in answer and 0.9 < took < 5, took


def test_connections_are_capped_and_stalled_ones_closed(tmp_path, catalog) -> None:
    """400 connections that never sent a request stayed open; then (issue #36 L10) idle ones held the cap for the
    read timeout and /healthz was a 503 meanwhile. Past --max-connections a new connection closes the one idle the
    longest, and one that sends no request within --read-timeout-s is closed: the service always answers."""
    with _served(tmp_path, catalog, max_connections=20, read_timeout_s=3.0) as url:
        opened = time.monotonic()
        stalled = [_socket_to(url) for _ in range(60)]
        answer = _exchange(url, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answered = time.monotonic() - opened
        assert answer.startswith(b"HTTP/1.1 200 ") and answered < 2.5, (answer[:80], answered)  # not after 3 s
        ends = _until_closed(stalled, timeout=15)  # bounded: every connection is closed by the server, or this fails
        assert all(got == b"" for got, _ in ends), [got[:40] for got, _ in ends]  # closed, none refused
        early = [at for _, at in ends if at - opened < 2.5]
        assert len(early) >= 41  # the 40 oldest (and one more for /healthz) gave their places at once
        assert _established(url) == 0
        for s in stalled:
            s.close()


def test_a_connection_past_the_cap_is_refused_when_every_other_one_is_busy(tmp_path, catalog) -> None:
    """Only busy connections (a request in progress) are never closed for a newcomer: then it is a 503 at once."""
    head = b"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with _served(tmp_path, catalog, max_connections=3, read_timeout_s=5.0) as url:
        busy = [_socket_to(url) for _ in range(3)]
        for s in busy:  # each sends a head and then its body slowly: a request in progress
            s.sendall(head + b"Content-Length: 100\r\n\r\n{")
        time.sleep(0.5)
        with _socket_to(url) as newcomer:  # answered at once, before it sends anything
            newcomer.settimeout(5)
            answer = newcomer.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"--max-connections" in answer
        for s in busy:
            s.close()


def test_the_docs_page_needs_no_network(tmp_path, catalog) -> None:
    """/docs loaded Swagger UI from a CDN (a blank page offline): it is one self-contained page now."""
    client = TestClient(_app(tmp_path, catalog))
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    for path in ("/v1/predict", "/v1/rank", "/v1/observations", "/v1/catalog", "/healthz", "/openapi.json"):
        assert path in text, path
    assert "cdn" not in text.lower() and "<script" not in text.lower() and "://" not in text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert client.get("/redoc").status_code == 404  # it loads from a CDN too


def test_heavy_work_hands_its_memory_back(tmp_path, catalog, monkeypatch) -> None:
    """glibc kept 2.3 GB of a 3.3 GB peak after the largest rankings (BENCHMARKS.md, issue #23): once no heavy
    request runs, the heap is trimmed."""
    from predictor.service import guard as service_guard

    trimmed: list[int] = []
    monkeypatch.setattr(service_guard, "_malloc_trim", lambda: trimmed.append)
    client = TestClient(_app(tmp_path, catalog))
    r = client.post("/v1/rank", json={"profile": MINIMAL, "constraints": {"steps": 1000}})
    assert r.status_code == 200 and trimmed == [0]


def test_srifty_run_token_issues_a_token_a_job_posts_under(tmp_path, catalog, monkeypatch, capsys) -> None:
    """Issue #36 M5, as an operator would: `srifty run-token` (the service's token) prints a run token; a job given
    it (as $SRIFTY_SERVICE_TOKEN) posts observations counted under that run and cannot issue another."""
    from lightning_srifty.cli import main

    store = ObservationStore(tmp_path / "obs.sqlite")
    app = create_app(catalog=catalog, observations=store, settings=ServiceSettings(token=TOKEN))
    with background_server(app) as url:
        monkeypatch.setenv("SRIFTY_SERVICE_TOKEN", TOKEN)
        assert main(["run-token", "--service", url, "--days", "2"]) == 0
        out, err = capsys.readouterr()
        token = out.strip()
        assert token.startswith("srun.") and "accepted until" in err and token not in err
        monkeypatch.setenv("SRIFTY_SERVICE_TOKEN", token)  # the job's environment
        job = ServiceClient(url)
        profile = load_profile(copy.deepcopy(MINIMAL))
        answer = job.observe(profile, "g5.xlarge:1", 10.0, iteration_time_s=None, source="job", run="ignored")
        assert answer["run_id"] == token.split(".")[1] == store.list()[0].run_id
        with pytest.raises(ServiceError, match="needs the service's own token"):
            job.issue_run()
        assert main(["run-token", "--service", url]) == 2  # a job's run token cannot mint runs
        assert "holds a run token" in capsys.readouterr().err
