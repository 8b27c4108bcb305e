"""Capacity failover for real (issue #22 item 4): the AWS provider applies the generated root through a fault-
injecting proxy in front of moto's server, which answers the first fleet's launch the way EC2 does when it has no
capacity; srifty launch's bring-up destroys what that apply made, says so, and starts the next entry of the plan."""

from __future__ import annotations

import boto3
import pytest
from fault_proxy import FaultProxy

from _support import moto_network
from lightning_srifty.provision.launcher.legs import up_or_next
from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner, capacity_code
from lightning_srifty.provision.terraform.generate import Options
from predictor.documents.profile import load_profile
from predictor.ranking import Constraints, rank

pytestmark = pytest.mark.slow


def test_capacity_codes_are_read_from_terraforms_error_text() -> None:
    text = "Error: creating EC2 Fleet: operation error EC2: CreateFleet, api error InsufficientInstanceCapacity: We"
    assert capacity_code(text) == "InsufficientInstanceCapacity"
    assert capacity_code("Error: VcpuLimitExceeded: You have requested more vCPU capacity") == "VcpuLimitExceeded"
    assert capacity_code("Error: creating IAM Role: AccessDenied") is None


# one case: the clean-up's answer lost too walks every step of the plain failover (its assertions are the same) and
# the destroy's second pass; the plain case alone cost the suite 177 s of a worker's time (BENCHMARKS, CI's time)
@pytest.mark.parametrize("lost", [("CreateFleet", "DeleteLaunchTemplate")])
def test_no_capacity_for_the_first_fleet_moves_to_the_next_and_leaves_nothing_behind(
    tf_env, moto_endpoint, tmp_path, catalog, lost
) -> None:
    """With the clean-up's DeleteLaunchTemplate answer lost too (a CI run's flake, made deterministic here): the
    SDK's retry finds the template gone. The AWS provider's delete takes EC2's InvalidLaunchTemplateId.NotFound as
    done, but moto answered InvalidLaunchTemplateName.NotFoundException, which only the provider's read takes as gone
    (hashicorp/terraform-provider-aws, internal/service/ec2: resourceLaunchTemplateDelete, findLaunchTemplates), so the
    destroy stopped. The proxy now answers as EC2 does (aws_rules), and the clean-up destroys once more where a first
    pass fails (tests/infra/test_operations.py): nothing is left."""
    from _support import MINIMAL

    profile = load_profile({**MINIMAL, "batch": {"per_device": 8}})
    c = Constraints(steps=100_000, market="on-demand", allow=("g5.xlarge", "g6.xlarge"), max_instances=1, top=5)
    plan = rank(profile, c, catalog=catalog)
    first, second = plan.entries[0].fleet, plan.entries[1].fleet
    refused_type = first.split(":")[0]
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    image = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])
    vpc_id, subnet_ids = moto_network(moto_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="failover-ckpt")
    echo: list[str] = []
    # and the second fleet's launch loses its first answer (EC2's 500 after the fleet started): the SDK's retry carries
    # the same ClientToken, which EC2 (and the proxy, for moto) answers with the first launch: one fleet, not two
    faults = FaultProxy(moto_endpoint, {refused_type}, lose=set(lost))
    with faults as proxy:
        options = Options(
            aws_endpoint=proxy,
            vpc_id=vpc_id,
            subnet_ids=subnet_ids,
            mode="fleet",
            ami=image["Images"][0]["ImageId"],
            setup_command="true",
            train_command="train.py",
        )
        provisioner = TerraformProvisioner(tmp_path, "s3://failover-ckpt/runs/f/", options, catalog=catalog)
        provisioner.echo = echo.append
        fleet, _ = up_or_next(provisioner, plan, 0, (f"failover-{n}" for n in range(1, 9)), echo.append)
        try:
            assert fleet.index == 1 and fleet.entry.fleet == second
            assert f"srifty launch: {first} (on-demand) could not start: InsufficientInstanceCapacity" in echo
            assert any(line.startswith(f"srifty launch: started entry 1 of the plan, {second}") for line in echo)
            assert any("terraform destroy of the partly applied failover-1" in line for line in echo)
            # the runner's own clean-up saw what the failed apply had created (terraform state list) and destroyed it
            assert any(
                "terraform apply failed" in line and "everything it had created was destroyed" in line for line in echo
            ), [line for line in echo if "failed" in line]
            # the refused apply left nothing: only the second fleet's instances run
            running = ec2.describe_instances(
                Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
            )["Reservations"]
            types = sorted(i["InstanceType"] for r in running for i in r["Instances"])
            said = (faults.lost, faults.replayed)
            assert sorted(faults.lost) == sorted(lost) and "CreateFleet" in faults.replayed, said
            assert types == [second.split(":")[0]], (types, echo)
            templates = ec2.describe_launch_templates()["LaunchTemplates"]
            assert [t["LaunchTemplateName"].startswith("failover-2") for t in templates] == [True]
        finally:
            provisioner.down(fleet)


def test_the_terraform_provisioner_tries_other_zones_that_offer_the_fleet_cheapest_first(
    moto_endpoint, tmp_path, catalog, monkeypatch
) -> None:
    """After a zonal refusal the provisioner names the zones of the region that offer every type of the fleet
    (moto's describe_instance_type_offerings by zone ID), not the zone tried, the cheapest measured spot price first,
    at most 2; nothing for a regional refusal or the user's own subnets; and a zone it is given is the subnet's."""
    import dataclasses
    import json

    import lightning_srifty.provision.launcher.terraform_fleet as tf_fleet
    from _support import MINIMAL
    from lightning_srifty.provision.aws import offered_zones
    from lightning_srifty.provision.terraform.generate import TFVARS
    from predictor.catalog import Catalog
    from predictor.catalog.instances import Price

    profile = load_profile({**MINIMAL, "batch": {"per_device": 8}})
    plan = rank(
        profile, Constraints(steps=100_000, market="spot", allow=("g5.xlarge",), max_instances=1), catalog=catalog
    )
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    offered = sorted(offered_zones(ec2, ["g5.xlarge"], by_id=True)["g5.xlarge"])
    assert len(offered) >= 4, offered
    a, b, c = offered[:3]
    g5 = catalog.get("g5.xlarge")
    kept = [p for p in g5.prices if not (p.region == "us-east-1" and p.market == "spot")]
    spot = [
        Price("us-east-1", "spot", 0.50, a),
        Price("us-east-1", "spot", 0.40, b),
        Price("us-east-1", "spot", 0.45, c),
    ]
    priced = dataclasses.replace(g5, prices=[*kept, *spot])
    zoned = Catalog.load(use_refreshed=False, use_env=False)
    monkeypatch.setattr(zoned, "get", lambda name: priced if name == "g5.xlarge" else catalog.get(name))
    echo: list[str] = []
    options = Options(aws_endpoint=moto_endpoint, setup_command="true", train_command="train.py")
    provisioner = TerraformProvisioner(tmp_path, "s3://zones/runs/z/", options, catalog=zoned, echo=echo.append)

    got = provisioner.zones_after(plan, 0, "InsufficientInstanceCapacity", [None])  # None: the plan's zone, b
    assert [z.zone for z in got] == [c, a]
    assert got[0].note == "its spot instances $0.450/h there, the plan used $0.400/h"
    after_c = provisioner.zones_after(plan, 0, "capacity-not-available", [None, c])
    assert [z.zone for z in after_c] == [a, offered[3]] and "no measured spot price" in after_c[1].note
    assert provisioner.zones_after(plan, 0, "VcpuLimitExceeded", [None]) == []  # a quota is the region's
    own = TerraformProvisioner(tmp_path, "s3://zones/runs/z/", dataclasses.replace(options, vpc_id="vpc-1",
                               subnet_ids=("subnet-1",)), catalog=zoned)  # fmt: skip
    assert own.zones_after(plan, 0, "InsufficientInstanceCapacity", [None]) == []  # the user's subnets fix the zone

    monkeypatch.setattr(tf_fleet, "apply", lambda folder, **kw: {})  # what the apply gets is what is checked
    same_prices = TerraformProvisioner(tmp_path, "s3://zones/runs/z/", options, catalog=catalog, echo=echo.append)
    fleet = same_prices.up(plan, 0, "zoned-1", c)  # (up checks the plan's prices against its catalog)
    values = json.loads((fleet.data["folder"] / TFVARS).read_text())
    assert f"if this launcher dies, release it at once with: srifty down --dir {fleet.data['folder']}" in echo[-1]
    assert values["network"] == {"create_vpc": True, "availability_zone_id": c}
