"""MigrationTriggers inside a real (1-process) Lightning run: the price trigger asks to move when the catalog is
refreshed with dearer prices, nothing happens while prices and speed are as planned, and bad setups are named."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import replace

import lightning.pytorch as pl
import pytest

from _support import MINIMAL
from helpers import TinyModel, loader, trainer
from lightning_srifty import protocol as markers
from lightning_srifty import store
from lightning_srifty.migrate.preemption import SpotPreemption
from lightning_srifty.migrate.triggers import MigrationTriggers
from predictor.catalog.catalog import Catalog, CatalogInfo
from predictor.catalog.instances import with_prices
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError
from predictor.ranking import Constraints, rank


class Slow(pl.Callback):
    def on_train_batch_end(self, *args) -> None:
        time.sleep(0.02)


@pytest.fixture(scope="module")
def setting(catalog):
    # a 10 ms step (~350 samples/s of batch 8 on the plan's T4): about what these CPU steps (20 ms sleep) measure
    timing = {"step_time_s": {"p50": 0.01}}
    profile = load_profile({**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}, "timing": timing})
    c = Constraints(steps=100_000, market="on-demand", allow=("g4dn.xlarge", "g5.xlarge"), max_instances=2)
    return profile, rank(profile, c, catalog=catalog)


def _refreshed(catalog: Catalog, itype: str, factor: float) -> Catalog:
    instances = {
        it.name: with_prices(it, [replace(p, usd_hr=p.usd_hr * factor) for p in it.prices]) if it.name == itype else it
        for it in catalog
    }
    return Catalog(instances, catalog.gpus, CatalogInfo("refreshed copy (test)", "2026-11-22"))


def _run(tmp_path, setting, catalog_loader) -> tuple[MigrationTriggers, SpotPreemption, pl.Trainer]:
    profile, plan = setting
    preemption = SpotPreemption(str(tmp_path), exit_process=False, handle_sigterm=False)
    triggers = MigrationTriggers(
        plan,
        0,
        str(tmp_path),
        profile=profile,
        first_check_steps=5,
        check_every_s=3600,
        drift_threshold=9.99,  # CPU steps are far off any GPU prediction: only prices decide here
        catalog_loader=catalog_loader,
        work_from="plan",
    )
    t = trainer([Slow(), preemption, triggers], max_steps=30)
    t.fit(TinyModel(), train_dataloaders=loader())
    triggers.wait(30)
    return triggers, preemption, t


def test_dearer_prices_ask_to_move_and_training_goes_on_until_the_launcher_answers(tmp_path, setting, catalog) -> None:
    plan = setting[1]
    current = plan.entries[0]
    dearer = _refreshed(catalog, current.groups[0].instance_type, 5.0)
    assert current.groups[0].instance_type == "g4dn.xlarge"
    triggers, preemption, t = _run(tmp_path, setting, lambda: dearer)
    request = markers.read_record(str(tmp_path), markers.MoveRequest)
    assert request is not None and request.why == "price" and request.from_fleet == current.fleet
    assert current.groups[0].instance_type not in request.to_fleet and request.savings > 0.15
    assert request.plan["catalog_source"] == "refreshed copy (test)"  # re-ranked at today's prices
    (decision,) = triggers.decisions
    assert decision.move and decision.target.fleet == request.to_fleet
    # nobody answered LEAVE: the run went on to its end and says so
    assert t.global_step == 30 and not preemption.preempted
    assert markers.read_record(str(tmp_path), markers.Finished) == markers.Finished(step=30)
    assert json.loads((tmp_path / "calibration.json").read_text())  # the measurement is kept for later fleets


def test_unchanged_prices_and_speed_within_the_threshold_do_nothing(tmp_path, setting, catalog) -> None:
    plan = setting[1]
    info = CatalogInfo(plan.catalog_source, plan.catalog_snapshot)
    same = Catalog({it.name: it for it in catalog}, catalog.gpus, info)
    triggers, _, t = _run(tmp_path, setting, lambda: same)
    assert triggers.decisions == [] and triggers.requested is None
    assert store.read(str(tmp_path), markers.MOVE_REQUEST) is None and t.global_step == 30


def test_setup_errors_name_the_fix(tmp_path, setting, monkeypatch) -> None:
    profile, plan = setting
    monkeypatch.delenv("SRIFTY_PLAN", raising=False)
    with pytest.raises(ConfigError, match="SRIFTY_PLAN"):
        MigrationTriggers()
    with pytest.raises(ConfigError, match="current=7 is not a fleet of the plan"):
        MigrationTriggers(plan, 7)
    with pytest.raises(ConfigError, match=r"The 'work_from' parameter of MigrationTriggers\(\) must be one of"):
        MigrationTriggers(plan, 0, work_from="epochs")
    with pytest.raises(ConfigError, match="add SpotPreemption"):
        trainer([MigrationTriggers(plan, 0, str(tmp_path), profile=profile)], max_steps=2).fit(
            TinyModel(), train_dataloaders=loader()
        )


def test_remaining_work_counts_optimizer_steps_of_the_global_batch_with_accumulation(tmp_path, catalog) -> None:
    # 8 per batch, 4 batches per optimizer step: the global batch is 32 samples, and 100 steps left are 3,200 samples
    data = {**copy.deepcopy(MINIMAL), "batch": {"per_device": 8, "accumulate_grad_batches": 4}}
    profile = load_profile({**data, "timing": {"step_time_s": {"p50": 0.01}}})
    c = Constraints(steps=100_000, market="on-demand", allow=("g4dn.xlarge", "g5.xlarge"), max_instances=2)
    plan = rank(profile, c, catalog=catalog)
    assert plan.entries[0].global_batch == 32
    dearer = _refreshed(catalog, plan.entries[0].groups[0].instance_type, 5.0)
    triggers = MigrationTriggers(
        plan, 0, str(tmp_path), profile=profile, drift_threshold=9.99, catalog_loader=lambda: dearer, work_from="plan"
    )

    class Trainer:  # what _check reads of a Trainer that accumulates 4 batches per optimizer step
        global_step, accumulate_grad_batches, callbacks = 10, 4, []

    triggers.poll_s = 0.01
    triggers._stop.set()  # do not wait for the launcher's answer
    triggers._check(Trainer(), 0.01, 100)
    (decision,) = triggers.decisions
    assert decision.remaining_samples == 100 * 32
    assert decision.measured_throughput_samples_s == pytest.approx(8 / 0.01)  # one batch of 8 per measured step


def test_a_leave_left_by_an_earlier_launch_is_not_taken_for_this_ones(tmp_path, setting, catalog, monkeypatch) -> None:
    from lightning_srifty.protocol import LaunchEnv, Leave, write_record

    for name, value in LaunchEnv(launch_id="L2", checkpoint_uri=str(tmp_path)).to_env().items():
        monkeypatch.setenv(name, value)
    write_record(str(tmp_path), Leave(launch_id="L1", to_fleet="g5.xlarge:1"))  # an earlier launch's answer
    dearer = _refreshed(catalog, setting[1].entries[0].groups[0].instance_type, 5.0)
    triggers, preemption, t = _run(tmp_path, setting, lambda: dearer)
    assert triggers.requested is not None and triggers.requested.launch_id == "L2"
    assert not preemption.preempted and t.global_step == 30  # nobody of this launch answered: it trained on


@pytest.mark.parametrize("again", [True, False])
def test_a_declined_move_ends_the_wait_and_the_triggers_check_again_or_stop_asking(tmp_path, catalog, again) -> None:
    """The launcher answers MOVE_DECLINED when it will not move (its fleet could not come up; --max-migrations): the
    waiting thread ends (it would otherwise wait for a LEAVE that never comes, and take a later one for its own),
    and the triggers ask again after their next check, or never again in this launch."""
    import threading
    import time

    from lightning_srifty.protocol import MoveDeclined, MoveRequest, read_record, write_record

    data = {**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}}
    profile = load_profile({**data, "timing": {"step_time_s": {"p50": 0.01}}})
    c = Constraints(steps=100_000, market="on-demand", allow=("g4dn.xlarge", "g5.xlarge"), max_instances=2)
    plan = rank(profile, c, catalog=catalog)
    dearer = _refreshed(catalog, plan.entries[0].groups[0].instance_type, 5.0)
    triggers = MigrationTriggers(
        plan, 0, str(tmp_path), profile=profile, drift_threshold=9.99, catalog_loader=lambda: dearer, work_from="plan"
    )
    triggers.poll_s = 0.01

    class Trainer:
        global_step, accumulate_grad_batches, callbacks = 10, 1, []

    waiting = threading.Thread(target=triggers._check, args=(Trainer(), 0.01, None), daemon=True)
    waiting.start()
    end = time.monotonic() + 20
    while read_record(str(tmp_path), MoveRequest) is None:
        assert time.monotonic() < end and waiting.is_alive(), "no move was requested"
        time.sleep(0.01)
    assert triggers.requested is not None
    write_record(str(tmp_path), MoveDeclined(to_fleet=triggers.requested.to_fleet, reason="no capacity", again=again))
    waiting.join(10)
    assert not waiting.is_alive()  # the answer ended the wait
    assert read_record(str(tmp_path), MoveDeclined) is None  # taken
    assert (triggers.requested is None) is again  # asks again after the next check, or never in this launch


def test_a_fleet_behind_its_deadline_asks_to_move_though_its_drift_is_under_the_threshold(tmp_path, catalog) -> None:
    """10 % slower than predicted is no drift at the 20 % threshold, but on a plan with little to spare it finishes
    after the deadline: the deadline trigger re-ranks what is left and asks for a fleet that meets it."""
    profile = load_profile(
        {**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}, "timing": {"step_time_s": {"p50": 0.01}}}
    )
    c = dict(steps=2_000_000, market="on-demand", allow=("g4dn.xlarge", "g5.xlarge"), max_instances=2, confidence=0.5)
    free = rank(profile, Constraints(**c), catalog=catalog).entries[0]
    plan = rank(profile, Constraints(**c, deadline_h=free.time_h * 1.02), catalog=catalog)
    entry = plan.entries[0]
    same = Catalog(
        {it.name: it for it in catalog}, catalog.gpus, CatalogInfo(plan.catalog_source, plan.catalog_snapshot)
    )
    triggers = MigrationTriggers(plan, 0, str(tmp_path), profile=profile, catalog_loader=lambda: same, work_from="plan")

    class Trainer:
        global_step, accumulate_grad_batches, callbacks = 0, 1, []

    triggers.poll_s = 0.01
    triggers._stop.set()  # do not wait for the launcher's answer
    step_s = entry.global_batch / (0.9 * entry.throughput_samples_s)
    triggers._check(Trainer(), step_s, None)
    (decision,) = triggers.decisions
    request = markers.read_record(str(tmp_path), markers.MoveRequest)
    assert decision.why == "deadline" and decision.move and "are left of the deadline" in decision.reason
    assert request is not None and request.why == "deadline" and request.to_fleet != entry.fleet
    # on time at the same speed (a deadline with room): nothing asked
    roomy = replace(plan, constraints=replace(plan.constraints, deadline_h=free.time_h * 2))
    calm = MigrationTriggers(
        roomy, 0, str(tmp_path / "calm"), profile=profile, catalog_loader=lambda: same, work_from="plan"
    )
    calm._check(Trainer(), step_s, None)
    assert calm.decisions == []
