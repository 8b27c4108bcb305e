"""The ``terraform`` provisioner: each fleet of ``srifty launch`` is a root module written by ``srifty terraform``
(the reviewed ``training_fleet`` module) in ``<workdir>/fleets/<name>``, applied and destroyed with python-terraform.

All fleets of one launch share the checkpoint bucket and prefix (an existing bucket: destroying a fleet must not take
the checkpoints with it). Every instance boots, installs the environment and waits for ``HANDOVER-<name>.json``
under the prefix (``train.handover``): the launcher writes it once the previous fleet has left, with the checkpoint to
resume from and the per-rank batch sizes. So a new fleet can be brought up while the old one still trains
(voluntary moves), and the old one is destroyed only after the new one has its handover.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import time
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import numpy as np

from lightning_srifty import protocol, store
from lightning_srifty.provision.apply import apply, destroy
from lightning_srifty.provision.aws import client, offered_zones, split_s3
from lightning_srifty.provision.base import LaunchedFleet, ZoneChoice
from lightning_srifty.provision.terraform.command import check_bucket_name, check_env_names
from lightning_srifty.provision.terraform.generate import Options, generate, priced_zone
from predictor.catalog import Catalog
from predictor.catalog.zones import group_spot_prices, spot_table
from predictor.documents.plan import Plan
from predictor.exceptions import CapacityError, ConfigError, PreflightError, ProvisionError

# EC2's answers that mean "not now, not here": capacity, spot capacity, quotas, the type not offered in the zone
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html)
CAPACITY_CODES = (
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientCapacity",
    "capacity-not-available",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "Unsupported",
)


# refusals about one zone (capacity there, the type not offered there): the same fleet may start in another zone.
# Quotas, spot counts and prices are the region's: another zone changes nothing.
ZONAL_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "capacity-not-available",
        "Unsupported",
        "capacity-timeout",
        "preflight:offering",
    }
)
ZONE_RETRIES = 2  # other zones tried per fleet before the plan's next entry

LAUNCH_MAX_RETRIES = 4
CAPACITY_TIMEOUT_S = 600.0  # an Auto Scaling group that has not launched the fleet by then is given up
LIVE = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")
# an instance of a fleet EC2 no longer lists is taken for gone when it is still not listed this much later: EC2's API
# is eventually consistent ("the results of an API command you run might not be immediately visible to all subsequent
# commands", docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html)
VANISHED_CONFIRM_S = 10.0
FINISH_LOOK_S = 5.0  # how often the launch looks for the nodes' status records once the job's training finished
FINISH_SAY_S = 60.0  # and how often it says which nodes it still waits for


def wait_for_capacity(
    client: Any, group: str, nodes: int, *, timeout_s: float, poll_s: float = 10.0, echo: Any = print
) -> None:
    """Return once the Auto Scaling group ``group`` has ``nodes`` instances launched (pending or in service).

    Raises:
        CapacityError: a scaling activity failed for capacity or a quota (its code), or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        (found,) = client.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
        live = [i for i in found.get("Instances", []) if i.get("LifecycleState") in LIVE]
        if len(live) >= nodes:
            return
        for activity in client.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=20)["Activities"]:
            message = activity.get("StatusMessage") or ""
            code = capacity_code(message) if activity.get("StatusCode") in ("Failed", "Cancelled") else None
            if code:
                raise CapacityError(f"The Auto Scaling group {group} could not launch: {message[:300]}", code=code)
        if time.monotonic() > deadline:
            raise CapacityError(
                f"The Auto Scaling group {group} launched {len(live)} of {nodes} instances in {timeout_s:.0f} s",
                code="capacity-timeout",
            )
        echo(f"srifty launch: {group}: {len(live)} of {nodes} instances launched, waiting")
        time.sleep(poll_s)


def capacity_code(text: str) -> str | None:
    """The first of CAPACITY_CODES that an error's text names, or None."""
    found = [(text.find(code), code) for code in CAPACITY_CODES if code in text]
    return min(found)[1] if found else None


class Vanished(NamedTuple):
    """:meth:`TerraformProvisioner.vanished`'s answer: instance ids."""

    gone: list[str]  # gone without a word, on two looks
    up: list[str]  # listed, or not yet gone on two looks, and without a record of their end


def _spot_by_zone(entry: Any, catalog: Catalog) -> tuple[dict[str, float], float | None]:
    """(the fleet's spot instances' $/h in each zone that offers each of its spot types, the $/h the plan used:
    :mod:`predictor.catalog.zones`, its zone's); ({}, None) for a fleet without spot or of a type the catalog lacks.
    A review: the zones were ordered by the largest spot group's price alone, and the note's "the plan used" was
    that type's cheapest zone's, not the plan's."""
    buying = [g for g in entry.groups if g.spot]
    if not buying or any(g.instance_type not in catalog for g in buying):
        return {}, None
    zones, table = spot_table([catalog.get(g.instance_type) for g in buying], entry.region)
    usd = (table * np.array([[g.spot] for g in buying])).sum(axis=0)  # nan where a type is not offered
    prices = {z: float(u) for z, u in zip(zones, usd) if z is not None and u == u}
    _, planned = group_spot_prices(
        [catalog.get(g.instance_type) for g in buying], [g.spot for g in buying], entry.region
    )
    total = sum(g.spot * p for g, p in zip(buying, planned))
    return prices, (total if total == total else None)


class TerraformProvisioner:
    kind = "terraform"
    ranks_in_join_order = True  # each node's torchrun joins the rendezvous when it has booted

    def __init__(
        self,
        workdir: str | Path,
        checkpoint_uri: str,
        options: Options | None = None,
        *,
        catalog: Any = None,
        echo: Any = print,
    ) -> None:
        bucket, prefix = split_s3(checkpoint_uri)
        check_bucket_name(
            bucket, "checkpoint_uri"
        )  # before any client sees it (the launcher writes records there first)
        if not prefix:
            raise ConfigError(
                f"Give the checkpoints a prefix inside the bucket, e.g. s3://{bucket}/runs/resnet-1 (the instances may "
                "only touch keys under it).",
                parameter="checkpoint_uri",
                value=checkpoint_uri,
            )
        self.root = Path(workdir) / "fleets"
        self.checkpoint_uri = f"s3://{bucket}/{prefix}".rstrip("/")
        # a few SDK retries, not 25: a launch EC2 refuses for capacity fails in seconds, and the next entry is tried
        retries = (options.aws_max_retries if options else None) or LAUNCH_MAX_RETRIES
        self.options = dataclasses.replace(
            options or Options(), bucket=bucket, checkpoint_prefix=prefix, handover=True, aws_max_retries=retries
        )
        self.catalog, self.echo = catalog, echo
        self.capacity_timeout_s = CAPACITY_TIMEOUT_S
        self.finish_look_s = FINISH_LOOK_S
        # partly applied fleets whose destroy failed where the apply failed: the launcher's release destroys them
        # again at its end, whatever ended it (launch._release), so that nothing it made is left billing unnamed
        self.leftovers: list[LaunchedFleet] = []
        self._ec2: dict[str, Any] = {}  # region -> client, for vanished()

    def zones_after(self, plan: Plan, index: int, code: str, tried: list[str | None]) -> list[ZoneChoice]:
        """The zones (IDs) of the entry's region that offer every type of the fleet and were not tried, the spot
        fleet's cheapest measured price first, at most :data:`ZONE_RETRIES`. None when the refusal is regional, the
        subnets are the user's (``--vpc-id``) or the user named the zone (``--availability-zone``)."""
        if code not in ZONAL_CODES or self.options.vpc_id or self.options.availability_zone:
            return []
        entry = plan.entries[index]
        catalog = self.catalog or Catalog.load()
        done = {z if z is not None else priced_zone(catalog, entry, entry.region) for z in tried}
        types = sorted({g.instance_type for g in entry.groups})
        try:
            zones = offered_zones(client("ec2", entry.region, self.options.aws_endpoint), types, by_id=True)
        except Exception as exc:  # noqa: BLE001 - without the offerings, the next entry is the way on
            self.echo(f"srifty launch: the zones that offer {', '.join(types)} could not be read ({exc}): next entry")
            return []
        common = set.intersection(*(zones.get(t, set()) for t in types)) - done
        prices, planned = _spot_by_zone(entry, catalog)  # the fleet's spot part per zone, as the plan priced it
        ordered = sorted(common, key=lambda z: (z not in prices, prices.get(z, 0.0), z))[:ZONE_RETRIES]

        def note(zone: str) -> str:
            if planned is None:
                return "on-demand: the same price in every zone"
            if zone not in prices:
                return "no measured spot price of every spot type for that zone in the catalog"
            return f"its spot instances ${prices[zone]:.3f}/h there, the plan used ${planned:.3f}/h"

        return [ZoneChoice(z, note(z)) for z in ordered]

    def up(self, plan: Plan, index: int, name: str, zone: str | None = None) -> LaunchedFleet:
        folder = self.root / name
        opts = dataclasses.replace(self.options, name=name)
        if zone is not None:
            opts = dataclasses.replace(opts, availability_zone=zone)
        generate(plan, folder, choice=index, options=opts, catalog=self.catalog)
        self.echo(f"srifty launch: terraform apply of {plan.entries[index].fleet} ({name}) in {folder}")
        try:
            outputs = apply(folder, yes=True, echo=self.echo)
            group = (outputs.get("fleet") or {}).get("autoscaling_group_name")
            if group:  # an Auto Scaling group's apply ends before EC2 has launched anything: wait for that
                wait_for_capacity(
                    self._autoscaling(plan.entries[index].region), group, plan.entries[index].nodes,
                    timeout_s=self.capacity_timeout_s, echo=self.echo,
                )  # fmt: skip
            # inside the try: an interruption while this line is written (a blocked terminal or pipe) destroys the
            # fleet here, since the launcher never gets it back to release
            self.echo(
                f"srifty launch: {plan.entries[index].fleet} ({name}) is up; if this launcher dies, release it at "
                f"once with: srifty down --dir {shlex.quote(str(folder))}"
            )
        except PreflightError as exc:  # nothing was started
            failed = [f["check"] for f in exc.report.get("findings", []) if f["status"] == "fail"]
            if set(failed) <= {"quota", "offering"}:
                raise CapacityError(str(exc), code=f"preflight:{failed[0]}") from None
            raise
        except BaseException as exc:  # a failed or interrupted apply may have created some of it: leave nothing behind
            self.echo(f"srifty launch: terraform destroy of the partly applied {name}")
            try:
                destroy(folder, yes=True, echo=self.echo)
            except BaseException as gone:  # the apply's error is the one to raise, unless this is an interruption
                # kept for the launcher's release at its end, also when a signal interrupted this destroy
                self.leftovers.append(LaunchedFleet(plan, index, name, {"folder": folder, "outputs": {}}))
                self.echo(
                    f"srifty launch: destroying {name} failed ({gone!r}); tried again when the launch ends, or at "
                    f"once with: srifty down --dir {shlex.quote(str(folder))}"
                )
                if not isinstance(gone, Exception):
                    raise
            if isinstance(exc, CapacityError):
                raise
            code = capacity_code(str(exc)) if isinstance(exc, ProvisionError) else None
            if isinstance(exc, ProvisionError):
                self.echo(f"srifty launch: {str(exc).splitlines()[0]}")
            if code:
                raise CapacityError(f"EC2 could not start {plan.entries[index].fleet}: {code}", code=code) from exc
            raise
        return LaunchedFleet(plan, index, name, {"folder": folder, "outputs": outputs})

    def _autoscaling(self, region: str) -> Any:
        return client("autoscaling", region, self.options.aws_endpoint)

    def start(self, fleet: LaunchedFleet, env: dict[str, str]) -> None:
        check_env_names(env, "the handover's env")  # exported on every instance (which checks again)
        # a node that replaces one of this leg's (its group's, after a loss without a notice) re-reads this handover:
        # the newest checkpoint written since it, if any, is where the fleet was (LaunchEnv.resume_after)
        env = {**env, protocol.VARIABLES["resume_after"]: protocol.handover(fleet.name)}
        with contextlib.suppress(Exception):  # the nodes at the handover: vanished() knows them from the start
            fleet.data.setdefault("members", set()).update(self._live(fleet))
        launch_id = env.get(protocol.VARIABLES["launch_id"], "")
        # what an earlier launch's fleet of this name said of its nodes' ends: its nodes train only after the handover
        protocol.clear_node_verdicts(self.checkpoint_uri, fleet.name)
        written = protocol.write_record(
            self.checkpoint_uri, protocol.Handover(launch_id=launch_id, fleet=fleet.name, env=env)
        )
        self.echo(f"srifty launch: {fleet.entry.fleet} ({fleet.name}) handed over: {written}")

    def poll(self, fleet: LaunchedFleet) -> int | None:
        return None  # the job runs on the instances: the markers beside the checkpoints tell

    def wait_after_fit(self, fleet: LaunchedFleet, timeout: float) -> int | None:
        """Once the job's training has finished (``FINISHED.json``, written as its fit ends): wait until the script
        has ended on every node of the fleet, so that the destroy that follows cuts nothing the script does after its
        fit (a test, an export, a model's upload) nor what the boot script does then (the job's outputs and its log
        beside the checkpoints). Each node's boot script writes its status record (``status/<fleet>-<instance
        id>.json``) last of all (the module's ``on_exit``). The nodes waited for are the fleet's members EC2 still
        lists (all of them when EC2 refuses the listing, said once); one that goes away meanwhile is not waited for, nor
        one its group starts now. The worst of their exits
        (0 when every one ended well); None when some still ran ``timeout`` s later, their ids in ``fleet.data``'s
        ``still_running``."""
        start = time.monotonic()
        said = start - FINISH_SAY_S
        codes: dict[str, int] = {}
        unlisted = False
        while True:
            members = fleet.data.setdefault("members", set())
            try:
                live: set[str] | None = self._live(fleet)
            except Exception as exc:  # noqa: BLE001 - then the members known since the handover, all taken as up
                live = None
                if not unlisted:
                    unlisted = True
                    self.echo(
                        f"srifty launch: the instances of {fleet.name} could not be listed ({exc}): waiting for the "
                        "status records of the nodes known since the handover (ec2:DescribeInstances for the "
                        "launcher's credentials)"
                    )
            if not members and live:  # a fleet never listed since its handover: the nodes up now
                members.update(live)
            try:
                waiting = _look_after_fit(self, fleet, live, codes)
            except Exception as exc:  # noqa: BLE001 - unread this time: looked at again until the timeout
                waiting = [f"(the fleet's status records could not be read: {exc})"]
            if not waiting:
                fleet.data["failed_after_fit"] = sorted(i for i, code in codes.items() if code)
                return next((code for code in codes.values() if code), 0)
            now = time.monotonic()
            if now - said >= FINISH_SAY_S:  # the first look's too, however long it took
                said = now
                self.echo(
                    f"srifty launch: the job's training finished; waiting for its script to end on {len(waiting)} "
                    f"node(s) of {fleet.name} ({', '.join(waiting)}; {now - start:.0f} of {timeout:.0f} s), then the "
                    "fleet is destroyed"
                )
            if now - start >= timeout:
                fleet.data["still_running"] = waiting
                return None
            time.sleep(min(self.finish_look_s, max(0.0, timeout - (now - start))))  # a last look at the limit

    def node_verdicts(self, fleet: LaunchedFleet) -> list[int | None] | None:
        """What each node of the fleet said of its job's end (:func:`protocol.node_verdicts`): a one-node fleet's
        node too, which leaves to be replaced when its own GPU failed under the job."""
        return protocol.node_verdicts(self.checkpoint_uri, fleet.name)

    def vanished(self, fleet: LaunchedFleet) -> Vanished:
        """The fleet's nodes that went away without a word, and those still up (:class:`Vanished`). Its members are
        the instances EC2 listed since the handover (at the handover, and any its group started since); one is gone
        when EC2 no longer lists it (pending or running) on two looks at least :data:`VANISHED_CONFIRM_S` apart (its
        API is eventually consistent) and it wrote neither an exit record (a node whose job ended writes one at once,
        deciding) nor its boot script's status: a spot reclaim whose notice did not come, a host that failed. The
        others without a record are up: a survivor still running its job, or a replacement its group started. So a
        one-node fleet, or one that lost every node at once (a spot pool reclaimed), is seen (:class:`LostNodeWatch`
        decides): before, the launch waited for it with no end. Nothing gone when EC2 or the records cannot be read
        (said once)."""
        first_gone: dict[str, float] = fleet.data.setdefault("gone_since", {})
        try:
            live = self._live(fleet)
            members: set[str] = fleet.data.setdefault("members", set())
            members |= live
            records = protocol.node_records(self.checkpoint_uri, fleet.name)
            recorded = {str(r.get("instance_id")) for r in records} | self._statuses(fleet.name)
        except Exception as exc:  # noqa: BLE001 - the nodes' own verdicts still tell most losses
            if not fleet.data.get("unread"):
                fleet.data["unread"] = True
                self.echo(
                    f"srifty launch: the instances of {fleet.name} could not be listed, or their records read ({exc}); "
                    "a node lost without a notice is seen only by its peers until they can (ec2:DescribeInstances "
                    "for the launcher's credentials)"
                )
            return Vanished([], [])
        now = time.monotonic()
        gone = members - live - recorded
        for instance in list(first_gone):
            if instance not in gone:
                del first_gone[instance]  # listed again, or its record came: not gone
        for instance in gone:
            first_gone.setdefault(instance, now)
        confirmed = {i for i in gone if now - first_gone[i] >= VANISHED_CONFIRM_S}
        # up: every member that has not recorded an end and is not confirmed gone (one listing without it is not
        # enough: the same eventual consistency)
        return Vanished(sorted(confirmed), sorted(members - recorded - confirmed))

    def _live(self, fleet: LaunchedFleet) -> set[str]:
        """The fleet's instances EC2 lists pending or running: its ``srifty:fleet`` tag, and its Auto Scaling group's
        (``aws:autoscaling:groupName``) when the apply made one, so that another launch's fleet of the same name in
        the region is not this one (an EC2 Fleet's, ``capacity.mode = fleet``, is told by its name alone). Not its
        security group: moto does not give an Auto Scaling group's instances the groups of their launch template's
        network interfaces, which AWS does."""
        region = fleet.entry.region
        if region not in self._ec2:
            self._ec2[region] = client("ec2", region, self.options.aws_endpoint)
        filters = [
            {"Name": "tag:srifty:fleet", "Values": [fleet.name]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
        group = ((fleet.data.get("outputs") or {}).get("fleet") or {}).get("autoscaling_group_name")
        if group:  # the tag EC2 Auto Scaling gives every instance it launches
            filters.append({"Name": "tag:aws:autoscaling:groupName", "Values": [group]})
        pages = self._ec2[region].get_paginator("describe_instances").paginate(Filters=filters)
        return {i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]}

    def retire(self, fleet: LaunchedFleet) -> None:
        """The job left ``fleet``: its handover is withdrawn, so that a node its group starts in place of a lost one
        waits (until the fleet is destroyed) instead of taking up the job beside the next leg."""
        try:
            store.clear(self.checkpoint_uri, protocol.handover(fleet.name))
        except Exception as exc:  # noqa: BLE001 - the fleet is destroyed soon anyway
            self.echo(f"srifty launch: {protocol.handover(fleet.name)} could not be withdrawn ({exc})")

    def _statuses(self, fleet: str) -> set[str]:
        """The instances of ``fleet`` whose boot script wrote its exit status (``status/<fleet>-<instance id>.json``
        beside the checkpoints, whatever ended it)."""
        folder = store.path(self.checkpoint_uri, "status")
        fs = store.filesystem(folder)
        fs.invalidate_cache()
        try:
            names = [PurePosixPath(str(n)).name for n in fs.ls(folder.rstrip("/"), detail=False)]
        except FileNotFoundError:
            return set()
        head = f"{fleet}-"
        return {n[len(head) : -len(".json")] for n in names if n.startswith(head + "i-") and n.endswith(".json")}

    def node_faults(self, fleet: LaunchedFleet) -> list[str]:
        """What failed on the GPUs of the fleet's nodes that left for it (their exit records' ``gpu_fault``)."""
        records = protocol.node_records(self.checkpoint_uri, fleet.name)
        return [str(r["gpu_fault"]) for r in records if r.get("gpu_fault")]

    def stop(self, fleet: LaunchedFleet) -> None:
        pass  # destroying the fleet stops it

    def down(self, fleet: LaunchedFleet) -> None:
        self.echo(f"srifty launch: terraform destroy of {fleet.entry.fleet} ({fleet.name})")
        destroy(fleet.data["folder"], yes=True, echo=self.echo)


def _look_after_fit(
    provisioner: TerraformProvisioner, fleet: LaunchedFleet, live: set[str] | None, codes: dict
) -> list:
    """One look of :meth:`TerraformProvisioner.wait_after_fit`: each node's exit (``codes``) from its status record,
    once there, and what is still waited for: the fleet's members EC2 lists (``live``; None: not listed, then every
    member known since the handover), or, none known at all, as many records as the fleet has nodes. A node whose own
    watch killed its script, silent after its training, is named in ``fleet.data``'s ``hung_after_fit``."""
    members = fleet.data["members"]
    waiting: list[str] = []
    known = members if live is None else members & live
    if live is None and not members:
        known = provisioner._statuses(fleet.name)
        nodes = sum(g.count for g in fleet.entry.groups)
        if len(known) < nodes:
            waiting.append(f"its {nodes - len(known)} other node(s), whose ids could not be listed")
    for instance in sorted(known - set(codes)):
        status = store.read(provisioner.checkpoint_uri, f"status/{fleet.name}-{instance}.json")
        if isinstance(status, dict):
            codes[instance] = int(status.get("exit_code") or 0)
            if status.get("after_fit_hung"):
                fleet.data.setdefault("hung_after_fit", []).append(instance)
        else:
            waiting.append(instance)
    return waiting
