"""What a profiler does once its window is measured, for a Trainer's :class:`~.callback.SriftyCallback` and a Fabric
loop's :class:`~.fabric.FabricProfiler` alike: every rank's payload gathered, the checkpoint's cost measured, the
profile built and written (rank 0, atomically), shown, and the fleets ranked for the whole run beside it.

A profiler reads its run through what a Trainer has (``strategy``, ``is_global_zero``, ``world_size``,
``save_checkpoint``...): the callback passes the Trainer, the Fabric profiler a view of the Fabric
(:class:`~.fabric.FabricView`). Nothing here may stop training: a failure is logged with its fix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lightning_srifty.profiling.assemble import RankPayload
from lightning_srifty.profiling.checkpoint_cost import measure_checkpoint
from lightning_srifty.profiling.recommendation import recommend_for_run
from lightning_srifty.profiling.window import DONE
from predictor.documents.atomic import check_writable
from predictor.documents.profile import Profile

if TYPE_CHECKING:
    from lightning_srifty.profiling.window import ProfileWindow
    from predictor.ranking.constraints import Constraints

log = logging.getLogger("lightning_srifty")

DEFAULT_OUTPUT = "srifty/profile.json"


class WindowResults:
    """The profile, plan and report of one window (the profilers' shared end). The profiler sets, before the window
    ends: ``owner`` (its name in messages), ``output``, ``measure_checkpoint``, ``recommend``, ``report``,
    ``constraints``, ``service``, ``_post_observation``, ``verbose``, ``max_series`` and ``model_name``."""

    owner = "SriftyCallback"
    kept_in = "callback.profile"  # where a profile that could not be written stays, in the caller's words
    output: Path | None
    measure_checkpoint: bool
    recommend: bool
    report: bool
    constraints: Constraints
    service: Any
    _post_observation: bool
    verbose: bool
    max_series: int
    model_name: str | None

    def _results_init(self) -> None:
        self.plan: Any = None
        self.written: dict[str, Path] = {}  # what rank 0 wrote: "profile", "plan", "report" -> path
        self.profiled = False
        self.profile: Profile | None = None
        self._output_ok = True
        self._imds: Any = None

    def _finish_window(self, run: Any, module: Any, window: ProfileWindow, *, truncated: bool) -> None:
        """The window is over (every rank calls it): gather, measure a checkpoint, build, write and rank."""
        window.stop()
        self.profiled = True
        payloads = gather(window.payload(run), run)
        checkpoint = measure_checkpoint(run, window.notes, self.owner) if self.measure_checkpoint else None
        if run.is_global_zero:
            try:
                meta = self._imds.result(wait=0.5) if self._imds is not None else None  # off EC2: already over
                self.profile = window.profile(
                    run, module, payloads, truncated, checkpoint, meta, self.model_name, self.max_series
                )
                self._save_and_recommend(run)
            except Exception as exc:  # noqa: BLE001 - never crash training because of the profiler
                log.error("%s could not build the profile: %s", self.owner, exc)
        if window.timer is not None:
            window.timer.reset()

    def _cut_short(self, run: Any, window: ProfileWindow, *, unit: str, longer: str) -> bool:
        """The run ended inside the window: False when fewer than 2 steps ran (nothing to profile: said on rank 0,
        in ``unit`` with the ``longer`` run to train), else True with the warm-up's note when it ended there (the
        caller then finishes the window, truncated)."""
        if window.recorder.steps == 0:
            window.phase = DONE
            if run.is_global_zero:
                log.error(
                    f"{self.owner}: no profile written: {window.seen} {unit} ran and at least 2 are needed (the first "
                    f"only anchors the timing). Train longer, e.g. {longer}."
                )
            return False
        if window.first_step is None:  # still warming up
            warmup = window.warmup_steps
            window.notes.append(
                f"The run ended during warm-up ({window.seen} steps, warmup_steps={warmup}): steps "
                f"1-{window.seen - 1} were profiled instead; expect start-up noise in these figures."
            )
        return True

    def _save_and_recommend(self, run: Any) -> None:
        """Write the profile (rank 0), show it, and rank fleets for the whole run when ``recommend``."""
        assert self.profile is not None
        written = None
        if self.output is not None and self._output_ok:
            try:
                target = kept_beside(self.output, self.profile, self.owner)
                written = self.written["profile"] = self.profile.save(target)
            except OSError as exc:
                log.error(
                    "%s could not write the profile to %s (%s); it is kept in %s.",
                    self.owner,
                    self.output,
                    exc.strerror or exc,
                    self.kept_in,
                )
        if self.verbose:
            from lightning_srifty.console import print_profile

            print_profile(self.profile, written)
        if not self.recommend:
            return
        beside = self.output is not None and self._output_ok
        plan_path = not_the_launchs_plan(self.output.with_name("plan.json")) if beside and self.output else None
        result = recommend_for_run(
            self.profile,
            self.constraints,
            run,
            service=self.service,
            post=self._post_observation,
            plan_path=plan_path,
            report_path=plan_path.with_name("report.html") if plan_path is not None and self.report else None,
            owner=self.owner,
        )
        if result is None:
            return
        self.plan = result.plan
        self.written.update({k: v for k, v in result.written.items() if k != "plot"})
        if self.verbose:
            from lightning_srifty.console import console, plan_table

            console().print(plan_table(self.plan))
            rest = {k: v for k, v in self.written.items() if k != "profile"}  # the profile's panel said where it went
            for line in summary_lines(rest, self.plan, self.profile, self.owner):
                print(line)  # plain: a path must not be wrapped

    def _check_output(self) -> bool:
        """Whether rank 0 can write the profile to ``output`` (said, with the fix, when it cannot: it is then kept
        in memory)."""
        if self.output is None:
            return True
        try:
            check_writable(self.output)
        except OSError as exc:
            log.error(
                "%s cannot write the profile to %s (%s). Training continues and the profile is kept in memory "
                "(%s); pass output= a writable path to get the file.",
                self.owner,
                self.output,
                exc.strerror or exc,
                self.kept_in,
            )
            return False
        return True

    def summary(self) -> list[str]:
        """Where the profile, plan and report went, and how far to trust GPU figures that come from a CPU profile
        (what ``srifty demo`` and a user's own run both say at the end of profiling)."""
        return summary_lines(self.written, self.plan, self.profile, self.owner)


def gather(payload: RankPayload, run: Any) -> list[RankPayload]:
    """Every rank's payload on every rank (rank order), or just this one outside a process group."""
    dist = torch.distributed
    if run.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return [payload]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, payload)
    return sorted(gathered, key=lambda p: p.rank)


def launch_output() -> str | None:
    """Under ``srifty launch``: the launch's own profile path, so that a job on the user's machine (the local
    provisioner runs in the project folder) never writes over the profile the launch's plan was made from."""
    from lightning_srifty.protocol import LaunchEnv

    try:
        launch = LaunchEnv.from_env()
    except Exception:  # noqa: BLE001 - another protocol version: SpotPreemption says so; keep the default here
        return None
    return f"srifty/launch-{launch.launch_id}/profile.json" if launch is not None and launch.launch_id else None


def not_the_launchs_plan(path: Path) -> Path:
    """``path``, or under ``srifty launch`` (or on a srifty fleet) the launch's own folder's plan: a script that gives
    ``output="srifty/x.json"`` wrote its run's plan over ``srifty/plan.json``, the plan the user launched with (the
    launcher runs a copy of it, so the job cannot tell that file from another: a new user's trial's later
    ``--resume --plan srifty/plan.json`` and ``srifty replay`` read another plan). Under a launch every run's plan goes
    to ``srifty/launch-<launch id>/``, where its profile goes by default."""
    from lightning_srifty.protocol import LaunchEnv

    try:
        launch = LaunchEnv.from_env()
    except Exception:  # noqa: BLE001 - another protocol version: SpotPreemption says so
        return path
    if launch is None or not launch.launch_id:
        return path
    return Path(f"srifty/launch-{launch.launch_id}/plan.json")


def summary_lines(
    written: dict[str, Path], plan: Any, profile: Profile | None, owner: str = "SriftyCallback"
) -> list[str]:
    """:meth:`WindowResults.summary`'s lines (``owner``: the profiler the GPU advice names)."""
    lines = [f"{what} written to {path}" for what, path in written.items()]
    if "report" in written:
        lines[-1] += " (open it in a browser)"
    hw = profile.hardware if profile is not None else None
    if plan is not None and hw is not None and not hw.gpu and (hw.accelerator or "cpu") == "cpu":
        lines.append(
            "note: this profile ran on the CPU: every GPU figure above (times, costs, the ranking) is "
            "extrapolated from CPU timings through the performance model, and can be off by a wide margin. "
            f"Profile on one GPU (srifty demo --accelerator gpu, or {owner} in your own run) for a "
            "prediction to act on."
        )
    return lines


def kept_beside(output: Path, profile: Profile, owner: str) -> Path:
    """Where a profile is written: ``output``, except a truncated one (the run ended inside the window, a smoke run's)
    where ``output`` holds a complete one, which it never replaces: it goes beside it, ``<stem>.truncated.json`` (a
    trial's one-step smoke run replaced a 40-step profile with one ``srifty recommend`` refused)."""
    if not profile.timing.window or not profile.timing.window.truncated or not output.is_file():
        return output
    try:
        there = json.loads(output.read_text())
        complete = there.get("timing", {}).get("window", {}).get("truncated") is False
    except (OSError, ValueError, AttributeError):
        return output
    if not complete:
        return output
    beside = output.with_name(f"{output.stem}.truncated.json")
    log.warning(
        "%s: this run ended inside the profile window; %s holds a complete profile, which is kept: this one is "
        "written to %s (delete %s to profile anew with a run this short)",
        owner,
        output,
        beside,
        output,
    )
    return beside
