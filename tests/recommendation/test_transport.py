"""A cluster without EFA: ``transport`` "tcp" prices every multi-node fleet with NCCL's sockets over each node's primary
interface (one vocabulary: predict(), srifty predict, the service, the ranking and its plan, srifty terraform), and
NCCL's sockets move a node no faster than they have been seen to (NVIDIA/nccl#398, #450)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest

from _support import MINIMAL
from lightning_srifty.provision.terraform.generate import Options, tfvars
from predictor.documents.plan import load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError
from predictor.model.network import DEFAULT_NETWORK, NetworkModel, inter_node_link
from predictor.model.predict import predict, predict_auto
from predictor.ranking import Constraints, rank

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profile():
    return load_profile(ROOT / "examples" / "profiles" / "resnet50-v100.json")


def test_a_cluster_without_efa_is_priced_over_sockets_and_says_so(profile, catalog) -> None:
    efa = predict(profile, "p4d.24xlarge:2", catalog=catalog)
    tcp = predict(profile, "p4d.24xlarge:2", catalog=catalog, transport="tcp")
    assert tcp.iteration_time_s > 2 * efa.iteration_time_s  # 37.6 Gbit/s of sockets against 400 Gbit/s of EFA
    (words,) = [a for a in tcp.assumptions if a.startswith("across nodes")]
    assert "(p4d.24xlarge: EFA not used, transport tcp)" in words
    assert "37.6 Gbit/s effective per node" in words and "NVIDIA/nccl#398" in words
    assert not any("across nodes: TCP" in a for a in efa.assumptions)
    # one node meets nobody: the transport changes nothing; nor on a type without EFA (its sockets either way)
    for fleet in ("p4d.24xlarge:1", "g4dn.xlarge:4"):
        one, other = predict(profile, fleet, catalog=catalog), predict(profile, fleet, catalog=catalog, transport="tcp")
        assert one.iteration_time_s == other.iteration_time_s
    # a Fleet parsed from the EFA catalog is priced over sockets too; predict_auto takes the same word
    from predictor.catalog.fleet import parse_fleet

    parsed = parse_fleet("p4d.24xlarge:2", catalog)
    assert predict(profile, parsed, catalog=catalog, transport="tcp").iteration_time_s == tcp.iteration_time_s
    assert predict_auto(profile, "p4d.24xlarge:2", catalog=catalog, transport="tcp").iteration_time_s > (
        predict_auto(profile, "p4d.24xlarge:2", catalog=catalog).iteration_time_s
    )
    with pytest.raises(ConfigError, match="transport") as e:
        predict(profile, "p4d.24xlarge:2", catalog=catalog, transport="infiniband")
    assert e.value.parameter == "transport"


def test_the_socket_ceiling_binds_only_above_the_rates_the_sockets_were_checked_at(catalog) -> None:
    """Below ~40 Gbit/s (every socket measurement the model was checked on, and every catalog type without EFA) the
    ceiling changes nothing; over TCP a 100 Gbit/s interface gives the ceiling, not 95 Gbit/s."""
    free = NetworkModel(socket_ceiling_gbps=1e9)
    tcp = catalog.over_tcp()
    for it in catalog:
        if it.cuda and not it.efa:
            assert inter_node_link(it).gbps == inter_node_link(it, free).gbps, it.name
            assert (it.provisioned_network_gbps() or 0) <= 25
    for name in ("p4d.24xlarge", "g5.48xlarge", "p5.48xlarge"):
        it = tcp.get(name)
        assert (it.efa, it.network_interfaces(True), it.provisioned_network_gbps()) == (False, 1, 100.0)
        assert inter_node_link(it).gbps == DEFAULT_NETWORK.socket_ceiling_gbps < inter_node_link(it, free).gbps
    g4 = tcp.get("g4dn.12xlarge")  # 50 Gbit/s, 4 GPUs staged through the host: under the ceiling
    assert inter_node_link(g4).gbps == pytest.approx(50 / 8 * 0.95 * DEFAULT_NETWORK.host_staged_efficiency)
    with pytest.raises(ConfigError, match="socket_ceiling_gbps"):
        NetworkModel(socket_ceiling_gbps=0)


def test_the_plan_records_the_transport_and_terraform_builds_what_was_priced(profile, catalog, tmp_path) -> None:
    asked = Constraints(steps=50_000, allow=("p4d.24xlarge",), max_instances=4, objective="time", transport="tcp")
    plan = rank(profile, asked, catalog=catalog)
    assert plan.constraints.transport == "tcp"
    assert any(n.startswith("transport tcp (asked)") for n in plan.notes)
    multi = [e for e in plan.entries if e.nodes > 1]
    assert multi
    for e in multi[:2]:
        alone = predict_auto(profile, e.fleet, catalog=catalog, transport="tcp")
        assert e.iteration_time_s == pytest.approx(alone.iteration_time_s, rel=1e-6)
    efa = rank(profile, dataclasses.replace(asked, transport="auto"), catalog=catalog)
    assert efa.constraints.transport is None  # auto is what plans before the field meant
    same = {e.fleet: e.iteration_time_s for e in efa.entries}
    assert all(e.iteration_time_s > same[e.fleet] for e in multi if e.fleet in same)
    saved = load_plan(plan.save(tmp_path / "plan.json"))
    assert Constraints.from_plan(saved.constraints).transport == "tcp"  # a re-plan keeps the cluster
    assert Constraints.from_plan(efa.constraints).transport == "auto"
    choice = plan.entries.index(multi[0])
    groups = tfvars(saved, choice, Options(name="tcp-fleet"), catalog)["groups"]
    assert [(g["efa"], g["network_interfaces"]) for g in groups] == [(False, 1)]
    efa_choice = next(i for i, e in enumerate(efa.entries) if e.nodes > 1)
    (efa_group,) = tfvars(efa, efa_choice, Options(name="efa-fleet"), catalog)["groups"]
    assert (efa_group["efa"], efa_group["network_interfaces"]) == (True, 4)
    with pytest.raises(ConfigError, match="transport") as e:
        rank(profile, Constraints(steps=10, transport="rdma"), catalog=catalog)
    assert e.value.parameter == "transport" and "'rdma'" in str(e.value)


def test_the_service_takes_the_transport(profile, catalog, tmp_path) -> None:
    from fastapi.testclient import TestClient

    from predictor.service.app import create_app
    from predictor.service.guard import ServiceSettings

    settings = ServiceSettings(allowed_hosts=("testserver",))
    client = TestClient(create_app(catalog=catalog, observations=tmp_path / "obs.sqlite", settings=settings))
    raw = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())
    body = {"profile": raw, "fleet": "p4d.24xlarge:2", "use_observations": False}
    auto, tcp = (client.post("/v1/predict", json={**body, "transport": t}) for t in ("auto", "tcp"))
    assert auto.status_code == tcp.status_code == 200
    assert tcp.json()["iteration_time_s"] > 2 * auto.json()["iteration_time_s"]
    bad = client.post("/v1/predict", json={**body, "transport": "rdma"})
    assert bad.status_code == 422 and "transport" in bad.text
    ranked = client.post(
        "/v1/rank",
        json={"profile": raw, "constraints": {"steps": 1000, "allow": ["p4d.24xlarge"], "transport": "tcp"}},
    )
    assert ranked.status_code == 200 and ranked.json()["constraints"]["transport"] == "tcp"


def test_srifty_predict_takes_the_transport(profile, capsys) -> None:
    from lightning_srifty.cli import main

    path = str(ROOT / "examples" / "profiles" / "resnet50-v100.json")
    steps = []
    for transport in ("auto", "tcp"):
        code = main(["predict", "--profile", path, "--fleet", "p4d.24xlarge:2", "--transport", transport,
                     "--format", "json"])  # fmt: skip
        assert code == 0
        steps.append(json.loads(capsys.readouterr().out)["iteration_time_s"])
    assert steps[1] > 2 * steps[0] and math.isfinite(steps[1])


def test_a_link_measured_over_efa_is_not_taken_for_the_sockets(catalog) -> None:
    """A profile measured across two p4d nodes over EFA (~10 GB/s) priced a tcp fleet of them at what EFA did, twice
    the ceiling its words cited (a review): faster than NCCL's sockets move a node, the measurement is of another
    transport, and transport tcp prices the sockets and says so. Under auto the measurement stands."""
    data = copy.deepcopy(MINIMAL)
    data["hardware"] = {"gpu": "A100-SXM4-40GB", "devices": 8, "nodes": 2, "instance_type": "p4d.24xlarge"}
    sizes = [data["model"]["parameters"]] * 4
    seconds = [2 * 15 / 16 * size / 10e9 + 1e-4 for size in sizes]
    buckets = [{"index": i, "bytes": int(b), "allreduce_s": {"p50": t}} for i, (b, t) in enumerate(zip(sizes, seconds))]
    data["communication"] = {"world_size": 16, "bucket_detail": buckets}
    profile = load_profile(data)
    auto = predict(profile, "p4d.24xlarge:2", catalog=catalog)
    tcp = predict(profile, "p4d.24xlarge:2", catalog=catalog, transport="tcp")
    assert any("rate the profile measured" in a for a in auto.assumptions)
    assert tcp.iteration_time_s > auto.iteration_time_s
    assert any("it ran over EFA, so transport tcp prices the sockets" in a for a in tcp.assumptions), tcp.assumptions
    assert any("37.6 Gbit/s effective per node" in a for a in tcp.assumptions)


def test_an_extra_merged_into_a_tcp_catalog_meets_over_tcp_too(catalog) -> None:
    from predictor.catalog.extra import load_extra

    extra = load_extra(ROOT / "tests" / "data" / "extra_example.yaml")
    merged = catalog.over_tcp().merged(extra)
    assert merged.transport == "tcp" and not any(it.efa for it in merged)
    assert any(it.efa for it in catalog.merged(extra))  # the extra has EFA types: the label is not enough


def test_the_words_name_the_ceiling_of_the_model_given_and_a_type_without_efa_as_such(catalog) -> None:
    profile = load_profile(ROOT / "examples" / "profiles" / "resnet50-v100.json")

    def across(fleet: str, **kw) -> str:
        (words,) = [a for a in predict(profile, fleet, catalog=catalog, transport="tcp", **kw).assumptions
                    if a.startswith("across nodes")]  # fmt: skip
        return words

    looser = across("p4d.24xlarge:2", network=NetworkModel(socket_ceiling_gbps=10))  # 61.5 Gbit/s under 80
    assert "61.48 Gbit/s effective per node" in looser and "NVIDIA/nccl#398" not in looser
    tighter = across("p4d.24xlarge:2", network=NetworkModel(socket_ceiling_gbps=4.0))
    assert "32 Gbit/s effective per node: the most NCCL's socket transport" in tighter
    assert "would allow 61.48 Gbit/s" in tighter
    assert "(g4dn.xlarge: no EFA)" in across("g4dn.xlarge:4")  # it has none to leave unused
    assert "(p4d.24xlarge: EFA not used, transport tcp)" in across("p4d.24xlarge:2")


def test_a_current_fleet_with_a_bad_count_is_named_as_the_current_fleet(profile, catalog, tmp_path) -> None:
    """ "The count ... in 'fleet' must be" for a ranking that has no field fleet (a review)."""
    with pytest.raises(ConfigError, match=r"in current_fleet must be a whole number") as e:
        rank(profile, Constraints(steps=10, current_fleet="p4d.24xlarge:0"), catalog=catalog)
    assert e.value.parameter == "current_fleet"


def test_the_python_client_sends_the_transport_only_when_asked(profile) -> None:
    from predictor.service.client import ServiceClient

    sent = []
    client = ServiceClient("http://127.0.0.1:9")
    client._post = lambda path, body, **kw: sent.append(body) or {}  # type: ignore[method-assign]
    client.predict(profile, "p4d.24xlarge:2")
    client.predict(profile, "p4d.24xlarge:2", transport="tcp", layout="fsdp:full_shard")
    assert "transport" not in sent[0]  # a service from before it answers as it did
    # the layout always: auto by default (srifty predict's), which a service from before it refuses by name rather
    # than answering plain DDP for a missing one
    assert sent[0]["layout"] == "auto"
    assert (sent[1]["transport"], sent[1]["layout"]) == ("tcp", "fsdp:full_shard")
    assert "transport" not in Constraints(steps=1).to_request()
    assert Constraints(steps=1, transport="tcp").to_request()["transport"] == "tcp"


def test_the_python_client_takes_a_profile_as_a_dict_or_a_path(profile, tmp_path) -> None:
    """A new user's trial: ServiceClient(url).rank(json.load(f), ...) failed with "'dict' object has no attribute
    'to_dict'"; docs/service.md never said the profile must come from load_profile. A dict or a path is read and
    checked here; a bad one is refused in the library's words before anything is sent."""
    import json

    from predictor.exceptions import ProfileSchemaError
    from predictor.service.client import ServiceClient

    sent = []
    client = ServiceClient("http://127.0.0.1:9")
    client._post = lambda path, body, **kw: sent.append(body) or {}  # type: ignore[method-assign]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile.to_dict()))
    for given in (profile, profile.to_dict(), str(path), path):
        client.predict(given, "g5.xlarge:1")
    assert all(body["profile"] == sent[0]["profile"] for body in sent)
    with pytest.raises(ProfileSchemaError):
        client.predict({"schema": "srifty.profile/v1"}, "g5.xlarge:1")
    assert len(sent) == 4
