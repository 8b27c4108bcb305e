"""srifty serve: the HTTP API (in-process and over a real socket), its errors, and the observations feedback loop."""

from __future__ import annotations

import copy
import json
import math
import sqlite3
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _support import MINIMAL
from predictor.documents.plan import load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError
from predictor.model.predict import predict
from predictor.service.app import ServiceSettings, background_server, create_app
from predictor.service.observations import ObservationStore, model_key

TOKEN = "test-token-4b9f-" + "z" * 24  # at least 32 bytes


@pytest.fixture
def client(tmp_path, catalog):
    settings = ServiceSettings(max_body_bytes=200_000, token=TOKEN, allowed_hosts=("testserver",))
    app = create_app(catalog=catalog, observations=tmp_path / "obs.sqlite", settings=settings)
    with TestClient(app, headers={"authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def test_health_catalog_and_openapi(client, catalog) -> None:
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["catalog_snapshot"] == catalog.info.snapshot
    body = client.get("/v1/catalog", params={"gpu": "A100", "region": "us-east-1"}).json()
    names = {t["instance_type"] for t in body["instance_types"]}
    assert "p4d.24xlarge" in names and all(t["gpu"].startswith("A100") for t in body["instance_types"])
    spec = client.get("/openapi.json").json()
    assert {"/v1/predict", "/v1/rank", "/v1/catalog", "/v1/observations", "/healthz"} <= set(spec["paths"])
    # the profile in the request bodies is documented by the published JSON Schema
    assert "srifty.profile/v1" in json.dumps(spec["components"]["schemas"]["PredictRequest"])


def test_predict_and_rank_answer_what_the_library_answers(client, catalog) -> None:
    r = client.post("/v1/predict", json={"profile": MINIMAL, "fleet": "p3.8xlarge:2"})
    assert r.status_code == 200, r.text
    one = predict(load_profile(copy.deepcopy(MINIMAL)), "p3.8xlarge:2", catalog=catalog)
    assert r.json()["iteration_time_s"] == pytest.approx(one.iteration_time_s)
    assert r.json()["interval"]["iteration_time_s"] == pytest.approx(list(one.interval["iteration_time_s"]))
    r = client.post(
        "/v1/rank", json={"profile": MINIMAL, "constraints": {"steps": 100_000, "deadline_h": 12, "max_types": 2}}
    )
    assert r.status_code == 200, r.text
    plan = load_plan(r.json())
    assert plan.constraints.max_types == 2 and plan.entries[0].time_h <= 12


def test_predict_says_which_types_cannot_run_the_training(client) -> None:
    """The service's answer carries the same "cannot run" reasons srifty predict prints and srifty recommend leaves
    types out by (bf16 before Ampere; a mixed fleet names only its type that cannot), priced all the same."""
    raw = copy.deepcopy(MINIMAL)
    raw["model"]["precision"] = "bf16-mixed"
    r = client.post("/v1/predict", json={"profile": raw, "fleet": "p3.2xlarge:1,g5.xlarge:1"})
    assert r.status_code == 200, r.text
    assert r.json()["cannot_run"] == ["p3.2xlarge: no bf16 on the GPU (compute capability < 8.0)"]
    assert r.json()["iteration_time_s"] > 0
    r = client.post("/v1/predict", json={"profile": raw, "fleet": "g5.xlarge:2"})
    assert r.json()["cannot_run"] == []
    r = client.post("/v1/predict", json={"profile": MINIMAL, "fleet": "p3.2xlarge:1"})  # its own precision: runs
    assert r.json()["cannot_run"] == []


def test_rank_answers_in_the_words_asked(client) -> None:
    """The plan's prose names the constraints as the JSON fields by default, as srifty recommend's flags on asking
    (issue #39: the ranking's words from its declared flags, not a regex on the answer)."""
    asked = {"profile": MINIMAL, "constraints": {"steps": 100_000, "deadline_h": 0.5, "market": "on-demand"}}
    fields = load_plan(client.post("/v1/rank", json=asked).json())
    flags = load_plan(client.post("/v1/rank", json={**asked, "words": "flags"}).json())
    assert any("override with startup_s" in n for n in fields.notes), fields.notes
    assert any("override with --startup" in n for n in flags.notes), flags.notes
    assert client.post("/v1/rank", json={**asked, "words": "yaml"}).status_code == 422


def test_a_refusal_says_the_value_and_the_advice_once(client) -> None:
    """A trial: market "spotty" read "Got 'spotty'. ... ; got 'spotty'", and an unknown GPU the catalog-extra advice
    twice."""
    r = client.post("/v1/rank", json={"profile": MINIMAL, "constraints": {"steps": 10, "market": "spotty"}})
    msg = r.json()["detail"][0]["msg"]
    assert msg.lower().count("got 'spotty'") == 1 and "Did you mean 'spot'?" in msg
    gpu = {**MINIMAL, "hardware": {"gpu": "H200X", "devices": 1}}
    msg = client.post("/v1/predict", json={"profile": gpu, "fleet": "g5.xlarge:1"}).json()["detail"][0]["msg"]
    assert msg.count("catalog extra file") == 1 and "Did you mean 'H200-SXM'" in msg


def test_a_body_sent_as_a_form_is_told_to_send_json(client) -> None:
    """A trial's `curl -X POST .../v1/rank -d '{...}'` (curl sends a form by default) got "Input should be a valid
    dictionary or object ... got b'{...}'"."""
    body = json.dumps({"profile": MINIMAL, "constraints": {"steps": 10}})
    r = client.post("/v1/rank", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    (detail,) = r.json()["detail"]
    assert r.status_code == 422 and "send JSON with Content-Type: application/json" in detail["msg"]


def test_a_newer_releases_profile_is_answered_and_a_step_without_gpu_work_refused_in_words(client, caplog) -> None:
    """The schemathesis run under another seed: a profile with a field of a newer release made the service raise its
    own NewerDocumentWarning (warnings are errors in the tests: 500), and a profile whose only operator is an empty
    optimizer step divided by its zero time a sample. The first is answered (the ignored field said in the service's
    log), the second refused by the prediction's own words."""
    import logging

    newer = {**MINIMAL, "from_a_newer_release": 1}
    with caplog.at_level(logging.WARNING, logger="predictor.service.app"):
        r = client.post("/v1/predict", json={"profile": newer, "fleet": "g5.xlarge:1"})
    assert r.status_code == 200 and "from_a_newer_release" in caplog.text
    # and in the answer, where a caller over HTTP reads it (a trial found it ignored without a word)
    (said,) = [a for a in r.json()["assumptions"] if "from_a_newer_release" in a]
    assert said.startswith("request: Profile: 1 field(s) this lightning-srifty does not know were ignored")
    plan = client.post("/v1/rank", json={"profile": newer, "constraints": {"steps": 10}}).json()
    assert plan["notes"][0] == said
    assert not [a for a in client.post("/v1/predict", json={"profile": MINIMAL, "fleet": "g5.xlarge:1"}).json()[
        "assumptions"] if a.startswith("request:")]  # fmt: skip
    empty = {**MINIMAL, "batch": {"per_device": 1}, "timing": {"step_time_s": {"p50": 0.0}}, "hardware": {"devices": 1},
             "ops": {"device": "cpu", "samples": 1, "ops": [{"op": "", "phase": "optimizer", "count": 1, "shapes": [],
                                                            "dtypes": [], "flops": 0.0, "bytes_read": 0.0,
                                                            "bytes_written": 0.0}]}}  # fmt: skip
    r = client.post("/v1/predict", json={"profile": empty, "fleet": "p3.8xlarge:2"})
    assert r.status_code == 422 and "every GPU needs at least one sample" in r.text


@pytest.mark.parametrize(
    ("path", "body", "loc", "text"),
    [
        (
            "/v1/predict",
            {"profile": {**MINIMAL, "batch": {"per_device": 0}}, "fleet": "p3.2xlarge"},
            "per_device",
            ">= 1",
        ),
        ("/v1/predict", {"profile": MINIMAL, "fleet": "p3.2xlarg:1"}, None, "Did you mean 'p3.2xlarge'"),
        ("/v1/predict", {"profile": MINIMAL, "fleet": "p3.2xlarge:0"}, "fleet", "whole number from 1 to 10,000"),
        ("/v1/predict", {"profile": MINIMAL}, "fleet", "Field required"),
        ("/v1/rank", {"profile": MINIMAL, "constraints": {}}, "steps", "exactly one of"),
        ("/v1/rank", {"profile": MINIMAL, "constraints": {"steps": 10, "objective": "cots"}}, "objective", "cost"),
        (
            "/v1/rank",
            {"profile": MINIMAL, "constraints": {"steps": 10**9, "deadline_h": 0.001}},
            "constraints",
            "binds",
        ),
        (
            "/v1/observations",
            {"profile": MINIMAL, "fleet": "g5.xlarge:1", "throughput_samples_s": -1},
            "throughput_samples_s",
            "greater than 0",
        ),
    ],
)
def test_bad_input_is_a_422_naming_the_field(client, path, body, loc, text) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"][:1]
    assert text in detail["msg"]
    if loc:
        assert loc in [str(x) for x in detail["loc"]]


@pytest.mark.parametrize(
    ("method", "path", "body", "loc"),
    [
        ("post", "/v1/rank", {"profile": MINIMAL, "constraints": {}}, ["body", "constraints", "steps"]),
        ("post", "/v1/rank", {"profile": MINIMAL, "constraints": {"steps": 9, "allow": ["p9"]}},
         ["body", "constraints", "allow"]),
        ("post", "/v1/rank", {"profile": MINIMAL, "constraints": {"steps": 9, "regions": ["mars-1"]}},
         ["body", "constraints", "regions"]),
        ("post", "/v1/rank", {"profile": MINIMAL, "constraints": {"steps": 9, "current_fleet": "p9.big:1"}},
         ["body", "constraints", "current_fleet"]),
        ("post", "/v1/predict", {"profile": MINIMAL, "fleet": "p3.2xlarg:1"}, ["body", "fleet"]),
        ("get", "/v1/catalog?gpu=A1000", None, ["query", "gpu"]),
    ],
)  # fmt: skip
def test_a_refused_value_is_located_where_the_request_has_it(client, method, path, body, loc) -> None:
    """A trial found the library's refusals at ["body", name] or ["body"] whatever the field: a generated client
    maps ``loc`` to its form's field, as it does pydantic's own errors."""
    r = client.post(path, json=body) if method == "post" else client.get(path)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc


def test_the_market_takes_a_spot_share_as_its_description_says(client) -> None:
    """``spot:0.75`` (mixed, with that spot share) as srifty recommend --market takes it: the service refused what
    its own schema's description offered."""
    asked = {"profile": MINIMAL, "constraints": {"steps": 1000, "market": "spot:0.75"}}
    plan = client.post("/v1/rank", json=asked).json()
    assert (plan["constraints"]["market"], plan["constraints"]["spot_share"]) == ("mixed", 0.75)
    for bad, words in (("spot:1.5", "write e.g. 'spot:0.75'"), ("spt", "Did you mean 'spot'?")):
        r = client.post("/v1/rank", json={**asked, "constraints": {"steps": 1000, "market": bad}})
        (detail,) = r.json()["detail"]
        assert r.status_code == 422 and detail["loc"] == ["body", "constraints", "market"] and words in detail["msg"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"steps": 9, "deadline_h": -5}, "greater than 0; got -5 (deadline_h: wall-time limit, in hours)"),
        ({"steps": 9, "deadline_h": "24h"}, 'a JSON number is needed, got "24h" (deadline_h: wall-time limit, in'),
        # a trial: text and true were taken as numbers ("1000" as 1,000 steps, true as 1) and "yes" as true
        ({"steps": "1000"}, 'a JSON number is needed, got "1000": send 1000 without the quotes (steps: optimizer'),
        ({"steps": True}, "a JSON number is needed, got true (steps: "),
        ({"steps": 9, "allow_arm64": "yes"}, 'true or false (a JSON boolean) is needed, got "yes" (allow_arm64: '),
        ({"steps": 9, "move_if_late": 1}, "true or false (a JSON boolean) is needed, got 1 (move_if_late: "),
        ({"steps": 9, "max_instances": "4"}, 'got "4": send 4 without the quotes (max_instances: largest fleet'),
        # 1e30 steps: the bound, not "Unable to parse input string as an integer"
        ({"steps": 1e30}, "less than or equal to 1000000000000; got 1e+30 (steps: "),
        # a choice's refusal lists the choices, the spot:SHARE form among them, once
        ({"steps": 9, "market": "spto"}, "'market' must be one of on-demand, spot, mixed, any, or spot:SHARE"),
        ({"steps": 9, "deadline": 5}, "there is no field 'deadline'. Did you mean 'deadline_h'?"),
        ({"steps": 9, "max_types": 3}, "got 3 (max_types: instance types per fleet: 1 = homogeneous only"),
    ],
)
def test_a_request_that_does_not_validate_says_what_was_given_and_what_the_field_means(client, body, words) -> None:
    """pydantic's own words named the field only ("Input should be greater than 0"; "Extra inputs are not
    permitted"): the service adds the value, the constraint's meaning and unit, and the closest name."""
    r = client.post("/v1/rank", json={"profile": MINIMAL, "constraints": body})
    assert r.status_code == 422 and words in r.json()["detail"][0]["msg"], r.text
    assert not r.json()["detail"][0]["msg"].startswith("Value error") and r.text.count("capacity markets") <= 1
    typo = client.post("/v1/predict", json={"profile": MINIMAL, "fleet": "g5.xlarge:1", "scalling": "weak"})
    assert "there is no field 'scalling'. Did you mean 'scaling'?" in typo.json()["detail"][0]["msg"]


def test_a_whole_number_written_with_a_fraction_of_zero_is_taken_as_json_schema_counts_it(client) -> None:
    """JSON Schema's integer is any number whose fraction is zero: 1e3 steps is 1,000, as 1000 is."""
    asked = [{"profile": MINIMAL, "constraints": {"steps": n}} for n in (1e3, 1000)]
    plans = [client.post("/v1/rank", json=body).json() for body in asked]
    assert plans[0]["constraints"]["work_samples"] == plans[1]["constraints"]["work_samples"] > 0
    r = client.post("/v1/rank", json={"profile": MINIMAL, "constraints": {"steps": 1000.5}})
    assert r.status_code == 422 and "fractional part" in r.text


def test_a_name_given_twice_in_one_object_is_refused(client) -> None:
    """A trial: {"steps": 10, "steps": 20} ranked 20 steps without a word (Python's parser keeps the last). I-JSON
    (RFC 7493, 2.3) requires unique names; the service refuses the body, naming the name."""
    profile = json.dumps(MINIMAL)
    body = f'{{"profile": {profile}, "constraints": {{"steps": 10, "steps": 20}}}}'
    r = client.post("/v1/rank", content=body, headers={"content-type": "application/json"})
    (detail,) = r.json()["detail"]
    assert r.status_code == 422 and "the name 'steps' is given twice in one object: give it once" in detail["msg"]
    once = f'{{"profile": {profile}, "constraints": {{"steps": 10}}}}'
    assert client.post("/v1/rank", content=once, headers={"content-type": "application/json"}).status_code == 200


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/v1/catalog?regoin=us-east-1", "there is no query parameter 'regoin' on /v1/catalog. Did you mean 'region'?"),
        ("/v1/observations?model_ky=x", "Did you mean 'model_key'?"),
    ],
)
def test_a_query_parameter_the_route_does_not_take_is_refused_with_the_closest(client, path, said) -> None:
    """A trial: ``GET /v1/catalog?regoin=us-east-1`` listed every region's types, the typo ignored."""
    r = client.get(path)
    (detail,) = r.json()["detail"]
    assert r.status_code == 422 and detail["loc"] == ["query", path.split("?")[1].split("=")[0]], r.text
    assert said in detail["msg"]
    assert client.get(path.split("?")[0]).status_code == 200


def test_a_query_parameter_given_twice_is_refused_and_a_liveness_check_takes_any(client) -> None:
    """``?region=a&region=b`` was read as b alone; a monitor's cache-busting ``/healthz?_=<time>`` was a 422, the
    service marked down. A route that takes no query still refuses one (the POST routes)."""
    r = client.get("/v1/catalog?region=us-east-1&region=eu-west-1")
    (detail,) = r.json()["detail"]
    assert r.status_code == 422 and detail["loc"] == ["query", "region"], r.text
    assert "the query parameter 'region' is given 2 times on /v1/catalog: give it once" in detail["msg"]
    assert client.get("/healthz?_=1765000000&verbose=1").status_code == 200
    r = client.post("/v1/rank?verbose=1", json={"profile": MINIMAL, "constraints": {"steps": 10}})
    (detail,) = r.json()["detail"]
    assert r.status_code == 422 and "there is no query parameter 'verbose' on /v1/rank (it takes none)" in detail["msg"]


def test_an_unknown_region_of_the_catalog_is_refused_as_the_ranking_refuses_it(client) -> None:
    r = client.get("/v1/catalog?region=eu-west-9")  # an empty listing before, a 422 from /v1/rank
    (detail,) = r.json()["detail"]
    assert r.status_code == 422 and detail["loc"] == ["query", "region"]
    assert "no prices in region 'eu-west-9'" in detail["msg"] and "us-east-1" in detail["msg"]
    assert client.get("/v1/catalog?region=us-east-1").json()["instance_types"]


def test_oversized_and_malformed_bodies(client) -> None:
    big = {"profile": {**MINIMAL, "notes": ["x" * 1000] * 300}, "fleet": "p3.2xlarge"}
    r = client.post("/v1/predict", json=big)
    assert r.status_code == 413 and "over 200000 bytes" in r.json()["detail"][0]["msg"]
    r = client.post("/v1/predict", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_a_store_deleted_or_replaced_while_the_service_runs_is_not_a_500(client, tmp_path) -> None:
    """Issue #36 L5: /v1/observations and /v1/rank answered 500 when the observations file was deleted or replaced
    while the service ran. A deleted store is made again (empty); one that is not a database now is a 503 naming it."""
    body = {"profile": MINIMAL, "constraints": {"steps": 1000, "allow": ["g5.xlarge"], "max_instances": 1}}
    post = {"profile": MINIMAL, "fleet": "g5.xlarge:1", "throughput_samples_s": 100.0, "source": "run-a"}
    store = tmp_path / "obs.sqlite"
    store.unlink()
    assert client.post("/v1/rank", json=body).status_code == 200
    assert client.post("/v1/observations", json=post).status_code == 201
    store.unlink()
    store.write_bytes(b"not a database, " * 100)
    for r in (client.post("/v1/rank", json=body), client.post("/v1/observations", json=post)):
        assert r.status_code == 503, r.text
        assert "obs.sqlite' cannot be used now" in r.json()["detail"][0]["msg"] and "Restore it" in r.text


def test_observations_calibrate_the_next_rank(client, tmp_path, catalog) -> None:
    """Three runs that agree move the A10G's factor, shrunk toward the model (issue #23 item 5: one post, or many
    from one run, steer nothing)."""
    profile = load_profile(copy.deepcopy(MINIMAL))
    predicted = predict(profile, "g5.xlarge:1", catalog=catalog).throughput_samples_s
    body = {"profile": MINIMAL, "constraints": {"steps": 100_000, "allow": ["g5.xlarge"], "max_instances": 1}}
    before = load_plan(client.post("/v1/rank", json=body).json())
    assert before.calibration is None

    def post(ratio: float, source: str) -> dict:
        run = client.post("/v1/runs", json={}).json()  # each run's jobs hold their own run token
        r = client.post(
            "/v1/observations",
            json={
                "profile": MINIMAL,
                "fleet": "g5.xlarge:1",
                "throughput_samples_s": ratio * predicted,
                "source": source,
            },
            headers={"authorization": f"Bearer {run['token']}"},
        )
        assert r.status_code == 201, r.text
        assert r.json()["run_id"] == run["run_id"]
        return r.json()

    ratios = (0.70, 0.72, 0.75)  # the A10G ran slower than predicted, in three runs
    first = post(ratios[0], "run-a")
    assert first["calibration"] == {} and first["note"].startswith("counted under")
    # one 10x off says it is left out (a trial read "counted under" and saw the factor never move)
    off = post(0.1, "run-x")
    assert off["note"].startswith("stored, but left out of every calibration: it is x0.1 the model's throughput")
    assert post(ratios[1], "run-b")["calibration"] == {}  # two runs: not yet
    factor = post(ratios[2], "run-c")["calibration"]["A10G"]
    geo = math.exp(sum(math.log(r) for r in ratios) / 3)
    assert factor == pytest.approx(geo ** (3 / 6))  # shrunk: the model counts as 3 runs at 1.0
    after = load_plan(client.post("/v1/rank", json=body).json())
    assert after.calibration[0].gpu == "A10G" and after.calibration[0].observations == 3
    assert after.entries[0].throughput_samples_s == pytest.approx(
        before.entries[0].throughput_samples_s * factor, rel=0.02
    )
    listed = client.get("/v1/observations", params={"model_key": model_key(profile)}).json()["observations"]
    stored = [*reversed(ratios[1:]), 0.1, ratios[0]]  # newest first: the 10x-off one is stored and listed too
    assert [o["throughput_samples_s"] for o in listed] == pytest.approx([r * predicted for r in stored])
    # a different model is not calibrated by these
    other = {**copy.deepcopy(MINIMAL), "model": {**MINIMAL["model"], "name": "vit"}}
    assert load_plan(client.post("/v1/rank", json={**body, "profile": other}).json()).calibration is None
    # the store is plain SQLite
    rows = sqlite3.connect(tmp_path / "obs.sqlite").execute("SELECT fleet, gpu FROM observations").fetchall()
    assert rows == [("g5.xlarge:1", "A10G")] * 4


def test_one_post_many_posts_of_one_run_or_disagreeing_runs_steer_nothing(tmp_path, catalog) -> None:
    """The probe of issue #23 item 5: one authenticated post at 4.9x predicted changed the top fleet."""
    from predictor.service.observations import calibrated_log_factor

    store = ObservationStore(tmp_path / "o.sqlite")
    profile = load_profile(copy.deepcopy(MINIMAL))
    predicted = predict(profile, "g5.xlarge:1", catalog=catalog).throughput_samples_s
    store.add(profile, "g5.xlarge:1", 4.9 * predicted, source="attacker", catalog=catalog)
    assert store.calibration(profile, catalog) is None
    for _ in range(5):  # the same run, again and again
        store.add(profile, "g5.xlarge:1", 4.9 * predicted, source="attacker", catalog=catalog)
    assert store.calibration(profile, catalog) is None
    assert calibrated_log_factor([math.log(0.5), 0.0, math.log(2.0)]) is None  # three runs that disagree
    # agreeing runs: bounded by 10% per run however far they say
    log_f, n = calibrated_log_factor([math.log(4.0)] * 3)
    assert n == 3 and math.exp(log_f) == pytest.approx(1.1**3)


def _observe(client, ratio: float, predicted: float, token: str, source: str = "") -> dict:
    r = client.post(
        "/v1/observations",
        json={"profile": MINIMAL, "fleet": "g5.xlarge:1", "throughput_samples_s": ratio * predicted, "source": source},
        headers={"authorization": f"Bearer {token}"},
    )
    assert r.status_code == 201, r.text
    return r.json()


def test_invented_sources_steer_nothing_only_issued_runs_count(client, catalog) -> None:
    """Issue #36 M5: four authenticated posts with invented `source` names ("3 distinct runs" that were
    self-declared strings) flipped the top pick. A run is now what the service issued: posts with the service's own
    token count toward no run, four posts under one run token are one run, and a run token cannot issue runs."""
    profile = load_profile(copy.deepcopy(MINIMAL))
    predicted = predict(profile, "g5.xlarge:1", catalog=catalog).throughput_samples_s
    body = {"profile": MINIMAL, "constraints": {"steps": 100_000, "allow": ["g5.xlarge", "g4dn.xlarge"]}}
    before = client.post("/v1/rank", json=body).json()
    for i in range(4):  # the probe: invented names, the service's token
        answer = _observe(client, 4.5, predicted, TOKEN, source=f"run-{i}")
        assert answer["run_id"] is None and "counted toward no run" in answer["note"]
    run = client.post("/v1/runs", json={}).json()
    for _ in range(4):  # one run, however many posts
        assert _observe(client, 4.5, predicted, run["token"])["calibration"] == {}
    after = client.post("/v1/rank", json=body).json()
    assert "calibration" not in after and after["entries"][0]["fleet"] == before["entries"][0]["fleet"]
    # a run token posts observations only: it cannot mint runs
    r = client.post("/v1/runs", json={}, headers={"authorization": f"Bearer {run['token']}"})
    assert r.status_code == 403 and "needs the service's own token" in r.json()["detail"][0]["msg"]
    # forged, tampered or expired tokens are refused by what is wrong
    head, run_id, expires, signature = run["token"].split(".")
    forged = [
        (f"{head}.r-{'0' * 16}.{expires}.{signature}", "signature does not match"),
        (f"{head}.{run_id}.{int(expires) + 86400}.{signature}", "signature does not match"),
        (f"{head}.{run_id}.{expires}", "not a run token"),
    ]
    for token, why in forged:
        r = client.post(
            "/v1/observations",
            json={"profile": MINIMAL, "fleet": "g5.xlarge:1", "throughput_samples_s": 1.0},
            headers={"authorization": f"Bearer {token}"},
        )
        assert r.status_code == 401 and why in r.json()["detail"][0]["msg"], (token, r.text)
    assert len(client.get("/v1/observations").json()["observations"]) == 8  # nothing forged was stored
    # three issued runs that agree do move it (the documented rule: MIN_RUNS = 3)
    for _ in range(2):
        last = _observe(client, 0.7, predicted, client.post("/v1/runs", json={}).json()["token"])
    assert last["calibration"] == {}  # the first run said 4.5x, these two 0.7x: they disagree
    last = _observe(client, 0.7, predicted, client.post("/v1/runs", json={}).json()["token"])
    assert set(last["calibration"]) == {"A10G"} and last["calibration"]["A10G"] < 1


def test_run_tokens_expire_outlive_a_restart_and_die_with_the_services_token(tmp_path, catalog) -> None:
    from predictor.service.runs import RunTokens

    issued = RunTokens(TOKEN).issue(60, now=1_000_000)
    assert RunTokens(TOKEN).verify(issued.token, now=1_000_030) == issued.run_id  # another process, same token
    with pytest.raises(Exception, match="expired at"):
        RunTokens(TOKEN).verify(issued.token, now=1_000_061)
    with pytest.raises(Exception, match="signature does not match"):
        RunTokens(TOKEN + "-rotated").verify(issued.token, now=1_000_030)
    with pytest.raises(Exception, match="ttl_s"):
        RunTokens(TOKEN).issue(10)


def test_a_store_from_before_runs_is_upgraded_and_its_rows_count_nowhere(tmp_path, catalog) -> None:
    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old)
    db.executescript(
        "CREATE TABLE observations (id INTEGER PRIMARY KEY AUTOINCREMENT, model_key TEXT NOT NULL, model TEXT NOT "
        "NULL, fleet TEXT NOT NULL, gpu TEXT NOT NULL, throughput_samples_s REAL NOT NULL, iteration_time_s REAL, "
        "source TEXT NOT NULL DEFAULT '', created_at TEXT NOT NULL);"
    )
    profile = load_profile(copy.deepcopy(MINIMAL))
    predicted = predict(profile, "g5.xlarge:1", catalog=catalog).throughput_samples_s
    for name in ("a", "b", "c"):
        db.execute(
            "INSERT INTO observations (model_key, model, fleet, gpu, throughput_samples_s, source, created_at) "
            "VALUES (?, ?, 'g5.xlarge:1', 'A10G', ?, ?, '2026-01-01')",
            (model_key(profile), profile.model.name, 0.7 * predicted, name),
        )
    db.commit()
    db.close()
    store = ObservationStore(old)
    assert [o.run_id for o in store.list()] == [None] * 3 and store.calibration(profile, catalog) is None
    for run in ("r-1", "r-2", "r-3"):
        store.add(profile, "g5.xlarge:1", 0.7 * predicted, run_id=run, catalog=catalog)
    assert store.calibration(profile, catalog).observations == {"A10G": 3}


def test_a_run_over_tcp_is_not_read_as_a_slow_gpu(tmp_path, catalog) -> None:
    """Three runs of p4d.24xlarge:2 over TCP (a tcp plan's fleet, as MigrationTriggers posts its drift) measure what
    the sockets give: priced as they met, the A100 keeps its factor; priced on EFA, as every observation was before
    the transport was recorded (a review), they read as an A100 at 0.3-0.5x and slowed every fleet of it."""
    profile = load_profile(copy.deepcopy(MINIMAL))
    over_tcp = predict(profile, "p4d.24xlarge:2", catalog=catalog, transport="tcp").throughput_samples_s
    recorded, unsaid = ObservationStore(tmp_path / "a.sqlite"), ObservationStore(tmp_path / "b.sqlite")
    for run in ("r-1", "r-2", "r-3"):
        recorded.add(profile, "p4d.24xlarge:2", over_tcp, run_id=run, catalog=catalog, transport="tcp")
        unsaid.add(profile, "p4d.24xlarge:2", over_tcp, run_id=run, catalog=catalog)
    assert recorded.calibration(profile, catalog).factors["A100-SXM-40GB"] == pytest.approx(1.0, abs=0.01)
    assert unsaid.calibration(profile, catalog).factors["A100-SXM-40GB"] < 0.9
    assert [o.transport for o in recorded.list()] == ["tcp"] * 3 and unsaid.list()[0].transport is None
    with pytest.raises(ConfigError, match="transport"):
        recorded.add(profile, "p4d.24xlarge:2", 1.0, catalog=catalog, transport="rdma")


LLAMA_7B = Path(__file__).resolve().parents[2] / "examples" / "profiles" / "llama-7b-bf16-captured.json"


def test_runs_that_met_the_plan_of_a_model_ddp_cannot_hold_leave_its_gpu_as_it_was(tmp_path, catalog) -> None:
    """A trial: a 7B model on p4d.24xlarge:2 over TCP runs FSDP (the ranking's layout); three issued runs that
    measured exactly what srifty predict said were compared with plain DDP's prediction (which does not fit: 205
    GiB a GPU), read as an A100 at 2.75x, and moved its factor by the whole bound (1.33x). The observed fleet is
    priced in the layout the ranking runs it with."""
    profile = load_profile(json.loads(LLAMA_7B.read_text()))
    planned = predict(profile, "p4d.24xlarge:2", catalog=catalog, transport="tcp", layout="auto")
    assert planned.layout.startswith("fsdp") and planned.fits_memory
    store = ObservationStore(tmp_path / "o.sqlite")
    for run in ("r-1", "r-2", "r-3"):
        store.add(profile, "p4d.24xlarge:2", planned.throughput_samples_s, run_id=run, catalog=catalog, transport="tcp")
    calibration = store.calibration(profile, catalog)
    assert calibration is not None and calibration.factors["A100-SXM-40GB"] == pytest.approx(1.0, abs=0.01)


def test_predict_takes_the_layout_srifty_predict_takes_by_default(client, catalog, capsys) -> None:
    """One vocabulary: /v1/predict answered plain DDP (19.2 samples/s, "does not fit") where srifty predict, whose
    default is auto, answered the FSDP layout the ranking runs (18.3, fits), and refused ``auto`` by name."""
    from lightning_srifty.cli import main

    raw = json.loads(LLAMA_7B.read_text())
    answers = {
        layout: client.post("/v1/predict", json={"profile": raw, "fleet": "p4d.24xlarge:2", **extra}).json()
        for layout, extra in (("default", {}), ("auto", {"layout": "auto"}), ("ddp", {"layout": "ddp"}))
    }
    assert main(["predict", "--profile", str(LLAMA_7B), "--fleet", "p4d.24xlarge:2", "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert answers["default"]["layout"] == answers["auto"]["layout"] == cli["layout"] and cli["layout"] != "ddp"
    assert answers["default"]["throughput_samples_s"] == pytest.approx(cli["throughput_samples_s"])
    assert answers["ddp"]["layout"] == "ddp" and not answers["ddp"]["fits_memory"]


def test_a_mixed_fleets_observation_says_it_counts_nowhere(client, catalog) -> None:
    """The docs say a fleet mixing GPU types does not calibrate, and its answer's note says why; a trial's note said
    "counted under r-...", as for a fleet of one GPU type."""
    run = client.post("/v1/runs", json={}).json()
    body = {"profile": MINIMAL, "fleet": "g5.xlarge:1,p3.2xlarge:1", "throughput_samples_s": 300.0}
    r = client.post("/v1/observations", json=body, headers={"authorization": f"Bearer {run['token']}"})
    assert r.status_code == 201, r.text
    assert r.json()["note"].startswith("stored, but left out of every calibration: g5.xlarge:1,p3.2xlarge:1 mixes")


def test_store_ignores_mixes_and_absurd_ratios(tmp_path, catalog) -> None:
    store = ObservationStore(tmp_path / "o.sqlite")
    profile = load_profile(copy.deepcopy(MINIMAL))
    store.add(profile, "g5.xlarge:1,p3.2xlarge:1", 100.0, catalog=catalog)  # a mix: which GPU was off?
    store.add(profile, "g5.xlarge:1", 1e9, catalog=catalog)  # 1e9 samples/s: a unit mistake
    assert store.calibration(profile, catalog) is None
    with pytest.raises(Exception, match="Did you mean"):
        store.add(profile, "g5.xlargee:1", 10.0, catalog=catalog)


def test_real_socket_on_localhost(tmp_path, catalog) -> None:
    app = create_app(catalog=catalog, observations=tmp_path / "obs.sqlite")
    with background_server(app) as url:
        assert url.startswith("http://127.0.0.1:")
        request = urllib.request.Request(
            url + "/v1/rank",
            data=json.dumps({"profile": MINIMAL, "constraints": {"steps": 1000}}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert json.load(response)["schema"] == "srifty.plan/v1"


def test_an_observation_whose_step_is_not_the_profiled_trainings_is_said_and_counted_nowhere(client, catalog) -> None:
    """A trial's observation had its ``iteration_time_s`` taken on trust. Throughput x the optimizer step's time is
    the run's global batch (MINIMAL's 256): a GPU's throughput posted for a fleet of 8 (or a batch's time for a
    step's) implies 32 samples a step, and is stored, said, and left out of the calibration, as the x0.2-5 rule does;
    one that agrees is counted."""
    profile = load_profile(copy.deepcopy(MINIMAL))
    predicted = predict(profile, "p3.16xlarge:1", catalog=catalog).throughput_samples_s

    def post(throughput: float, step_s: float) -> dict:
        run = client.post("/v1/runs", json={}).json()
        body = {"profile": MINIMAL, "fleet": "p3.16xlarge:1", "throughput_samples_s": throughput,
                "iteration_time_s": step_s}  # fmt: skip
        r = client.post("/v1/observations", json=body, headers={"authorization": f"Bearer {run['token']}"})
        assert r.status_code == 201, r.text
        return r.json()

    per_gpu = predicted / 8
    said = post(per_gpu, 256 / predicted)["note"]  # one GPU's samples per second, the fleet's step
    assert said.startswith("stored, but left out of every calibration: throughput x iteration_time_s is 32 samples")
    assert "global batch is 256" in said and "whole fleet's samples per second" in said
    # three runs that agree at 0.75x, each posting a batch's time of 8 accumulated for the step's: counted nowhere
    for _ in range(3):
        answer = post(0.75 * predicted, 256 / (0.75 * predicted) / 8)
    assert answer["calibration"] == {} and "left out of every calibration" in answer["note"]
    assert post(0.8 * predicted, 256 / (0.8 * predicted))["note"].startswith("counted under")


def test_the_librarys_constraints_through_the_client_rank_as_the_library_does(tmp_path, catalog) -> None:
    """An audit: ``ServiceClient(url).rank(profile, Constraints(steps=..., market="spot"))`` was refused (422): the
    request carried the mixed market's default share as if given. Every market now ranks through the service as
    the library ranks it."""
    from predictor.ranking import Constraints, rank
    from predictor.service.client import ServiceClient

    app = create_app(catalog=catalog, observations=tmp_path / "obs.sqlite")
    with background_server(app) as url:
        for market in ("spot", "on-demand", "mixed", "any"):
            asked = Constraints(steps=1000, market=market, max_instances=4)
            served = ServiceClient(url).rank(MINIMAL, asked)
            local = rank(load_profile(copy.deepcopy(MINIMAL)), asked, catalog=catalog)
            assert [e.fleet for e in served.entries] == [e.fleet for e in local.entries], market
            assert served.constraints == local.constraints, market


def test_a_body_over_the_limit_is_said_as_such_not_as_a_service_that_is_down(tmp_path, catalog) -> None:
    """A trial: ServiceClient.predict with a 2 MB profile said "Cannot reach the predictor ... Is srifty serve
    running there?": the guard answers 413 from the length alone and closes while urllib still sends. The client
    says it was most likely the body limit, with the size and the flag."""
    from predictor.exceptions import ServiceError
    from predictor.service.client import ServiceClient

    settings = ServiceSettings(max_body_bytes=100_000)
    app = create_app(catalog=catalog, observations=tmp_path / "obs.sqlite", settings=settings)
    big = copy.deepcopy(MINIMAL)
    big["notes"] = ["x" * 1000] * 4000  # 4 MB
    with background_server(app) as url:
        with pytest.raises(ServiceError) as refused:
            ServiceClient(url).predict(big, "p3.8xlarge:2")
        assert ServiceClient(url).predict(MINIMAL, "p3.8xlarge:2")["fleet"] == "p3.8xlarge:2"  # it was up
    said = str(refused.value)  # either way the connection went: the 413 read, or the send cut off
    assert refused.value.status == 413 and "--max-body" in said and "running there" not in said, said


def test_a_request_cut_off_while_it_is_sent_names_the_body_limit() -> None:
    """The cut-off itself, deterministic: a server that reads the request's head and closes (as the guard does
    after answering 413 from the length alone) leaves urllib with a broken pipe mid-send."""
    import socket
    import threading

    from predictor.exceptions import ServiceError
    from predictor.service.client import ServiceClient

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_once() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)  # the head and a little of the body
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
        conn.close()

    thread = threading.Thread(target=serve_once, daemon=True)
    thread.start()
    big = copy.deepcopy(MINIMAL)
    big["notes"] = ["x" * 1000] * 8000  # 8 MB: the send is still going when the server resets
    with pytest.raises(ServiceError) as cut:
        ServiceClient(f"http://127.0.0.1:{port}").predict(big, "p3.8xlarge:2")
    thread.join(5)
    listener.close()
    said = str(cut.value)
    assert cut.value.status == 413 and "closed the connection while the" in said and "--max-body" in said, said


def test_the_apps_worker_threads_end_with_it(tmp_path, catalog) -> None:
    """Each app's pool of ranking threads outlived it: a process that started many (the tests' ran 40) kept them."""
    app = create_app(
        catalog=catalog, observations=tmp_path / "obs.sqlite", settings=ServiceSettings(allowed_hosts=("testserver",))
    )
    with TestClient(app) as c:
        assert c.post("/v1/predict", json={"profile": MINIMAL, "fleet": "g5.xlarge:1"}).status_code == 200
        threads = list(app.state.heavy._pool._threads)
        assert threads and all(t.is_alive() for t in threads)
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/runs", '{"ttl_s": 1' + "0" * 400 + "}", "got an integer of 401 digits"),
        ("/v1/rank", '{"profile": PROFILE, "constraints": {"steps": 1' + "0" * 400 + "}}", "an integer of 401 digits"),
        ("/v1/rank", '{"profile": PROFILE, "constraints": {"steps": 1e400}}', "got inf (a number beyond 1.8e308"),
        ("/v1/rank", '{"profile": PROFILE, "constraints": {"steps": "' + "9" * 150_000 + '"}}', '"99999999'),
        ("/v1/rank", '{"profile": PROFILE, "constraints": {"steps": "1_000"}}', 'got "1_000" ('),
    ],
)
def test_a_refusal_of_a_huge_value_is_a_short_422(client, path, body, said) -> None:
    """A review: a 401-digit integer made the refusal's own formatting raise (a 500), and a 150,000-character text
    came back whole in the message (over 150 KB). Each is a 422 that says what was sent in a few words; "1_000"
    (Python's number, not JSON's) gets no hint to drop the quotes."""
    r = client.post(
        path, content=body.replace("PROFILE", json.dumps(MINIMAL)), headers={"content-type": "application/json"}
    )
    (detail,) = r.json()["detail"]
    assert r.status_code == 422 and said in detail["msg"] and len(r.content) < 2_000, r.text[:500]
    assert "without the quotes" not in detail["msg"]


def test_an_app_started_again_answers_as_the_first_time(tmp_path, catalog) -> None:
    """A review: its lifespan ended the app's pool for good, so a second start answered every ranking with 500."""
    app = create_app(
        catalog=catalog, observations=tmp_path / "o.sqlite", settings=ServiceSettings(allowed_hosts=("testserver",))
    )
    for _ in range(2):
        with TestClient(app) as c:
            assert c.post("/v1/predict", json={"profile": MINIMAL, "fleet": "g5.xlarge:1"}).status_code == 200


def test_a_confidence_in_percent_is_said_as_the_cli_says_it(client) -> None:
    """An audit: ``"confidence": 95`` got pydantic's "<= 0.999" alone, where the CLI and the library say it is a
    percentage and give the fraction."""
    said = client.post("/v1/rank", json={"profile": MINIMAL, "constraints": {"steps": 100, "confidence": 95}})
    msg = said.json()["detail"][0]["msg"]
    assert said.status_code == 422 and "not a percentage: 95 % is" in msg and "0.95" in msg, msg
    past = client.post("/v1/rank", json={"profile": MINIMAL, "constraints": {"steps": 100, "confidence": 1.5}})
    assert "percentage" not in past.json()["detail"][0]["msg"]  # not a percentage: no such hint
