"""Capacity failover for real (issue #22 item 4): the AWS provider applies the generated root through a fault-
injecting proxy in front of moto's server, which answers the first fleet's launch the way EC2 does when it has no
capacity; srifty launch's bring-up destroys what that apply made, says so, and starts the next entry of the plan."""

from __future__ import annotations

import boto3
import pytest
from fault_proxy import FaultProxy

from _support import moto_network
from lightning_srifty.provision.generate import Options
from lightning_srifty.provision.launch import _up_or_next
from lightning_srifty.provision.terraform_fleet import TerraformProvisioner, capacity_code
from predictor.profile import load_profile
from predictor.rank import Constraints, rank

pytestmark = pytest.mark.slow


def test_capacity_codes_are_read_from_terraforms_error_text() -> None:
    text = "Error: creating EC2 Fleet: operation error EC2: CreateFleet, api error InsufficientInstanceCapacity: We"
    assert capacity_code(text) == "InsufficientInstanceCapacity"
    assert capacity_code("Error: VcpuLimitExceeded: You have requested more vCPU capacity") == "VcpuLimitExceeded"
    assert capacity_code("Error: creating IAM Role: AccessDenied") is None


def test_no_capacity_for_the_first_fleet_moves_to_the_next_and_leaves_nothing_behind(
    tf_env, moto_endpoint, tmp_path, catalog
) -> None:
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
    with FaultProxy(moto_endpoint, {refused_type}) as proxy:
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
        fleet, _ = _up_or_next(provisioner, plan, 0, (f"failover-{n}" for n in range(1, 9)), echo.append)
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
            assert types == [second.split(":")[0]], types
            templates = ec2.describe_launch_templates()["LaunchTemplates"]
            assert [t["LaunchTemplateName"].startswith("failover-2") for t in templates] == [True]
        finally:
            provisioner.down(fleet)
