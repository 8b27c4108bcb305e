"""Observed throughput of real runs, stored in SQLite, and the calibration they give the next prediction.

A run profiled on its real fleet (the callback on the chosen fleet, or any run a user reports) posts what it measured:
the model, the fleet, samples per second. The next ranking of a similar profile (same model name, parameter count,
precision and per-GPU batch) predicts every observed fleet from *its own* profile, and the geometric mean of
measured/predicted per GPU type becomes a factor on that GPU's compute (:class:`predictor.ranking.Calibration`). Only
single-GPU-type fleets calibrate (a mix cannot say which GPU was off). This closes the loop between the
recommendation and what the fleet then did.

Stored in one SQLite file (default ``$SRIFTY_OBSERVATIONS``, else ``~/.cache/srifty/observations.sqlite``); every write
is one transaction, so a crash leaves either the whole observation or none.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from predictor.catalog.catalog import Catalog
from predictor.catalog.fleet import parse_fleet
from predictor.documents.atomic import file_kind
from predictor.documents.checks import check_choice, check_number
from predictor.documents.plan import TRANSPORTS
from predictor.documents.profile import MODEL_NAME_MAX, Profile
from predictor.documents.work import global_batch
from predictor.exceptions import ConfigError, ServiceError, SriftyError
from predictor.ranking import Calibration

FACTOR_LIMITS = (0.2, 5.0)  # an observation further off than 5x is a mistake (wrong fleet, wrong unit), not a signal
# Throughput x the optimizer step's time is the samples of a step, the run's global batch: an integer the training
# fixes, measured here through two figures (a mean and a median of the same steps agree to a few %). Further off than
# this, one of them is of another training or in another unit (a GPU's throughput, not the fleet's; a batch's time,
# not the step's): the observation is stored, said, and counted in no calibration.
STEP_SAMPLES_LIMIT = 1.5
# Observations cannot steer alone (issue #23 item 5): a GPU's factor moves only when MIN_RUNS distinct runs agree
# within AGREE of their median; the factor is shrunk toward the model as if the model were PRIOR_RUNS runs at 1.0, and
# moves at most STEP per agreeing run. A run is one the service issued (issue #36 M5): an observation posted with a
# run token (predictor.service.runs) is counted under that token's run; one posted with the service's own token, or
# without one, is stored and listed and counts toward no run (its ``source`` is a label anybody can write).
MIN_RUNS = 3
AGREE = 1.25
PRIOR_RUNS = 3.0
STEP = 1.10

_SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model_key TEXT NOT NULL,
    model TEXT NOT NULL,
    fleet TEXT NOT NULL,
    gpu TEXT NOT NULL,
    throughput_samples_s REAL NOT NULL,
    iteration_time_s REAL,
    source TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    run_id TEXT
);
CREATE INDEX IF NOT EXISTS observations_model ON observations (model_key);
"""


def default_path() -> Path:
    env = os.environ.get("SRIFTY_OBSERVATIONS")
    if env:
        return Path(env)
    base = os.environ.get("SRIFTY_CACHE_DIR") or os.path.join(Path.home(), ".cache", "srifty")
    return Path(base) / "observations.sqlite"


def model_key(profile: Profile) -> str:
    """What makes two profiles 'the same model' for calibration."""
    m = profile.model
    return f"{m.name}|{m.parameters}|{m.precision}|{profile.batch.per_device:g}"


@dataclass(frozen=True)
class Observation:
    id: int
    model_key: str
    model: str
    fleet: str
    gpu: str  # comma-separated GPU keys of the fleet (one for a homogeneous fleet)
    throughput_samples_s: float
    iteration_time_s: float | None
    source: str
    created_at: str
    run_id: str | None = None  # the issued run it counts under (None: posted without a run token; counts nowhere)
    # how its nodes met (predictor.documents.plan.TRANSPORTS: the plan's, where the job had one); None: not recorded,
    # priced as "auto" (EFA where the type has it), as every observation before the field was
    transport: str | None = None


_COLUMNS = ", ".join(Observation.__dataclass_fields__)


class ObservationStore:
    """Observations in one SQLite file (created on first use)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        fix = (
            "Give --observations (or $SRIFTY_OBSERVATIONS) the path of an SQLite file in a folder you can write; it is "
            "created when missing."
        )
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:  # e.g. a parent that is a file
            raise ConfigError(
                f"The observations store {str(self.path)!r} cannot be reached: {exc.strerror or exc}. {fix}",
                parameter="observations",
                value=str(self.path),
            ) from None
        if mode is not None and not stat.S_ISREG(mode):  # sqlite3 on a FIFO or a folder: a traceback, or a hang
            raise ConfigError(
                f"The observations store {str(self.path)!r} is {file_kind(mode)}, not a regular file. {fix}",
                parameter="observations",
                value=str(self.path),
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:  # not a database, no permission, a full disk
            raise ConfigError(
                f"The observations store {str(self.path)!r} cannot be opened as an SQLite database: {exc}. {fix}",
                parameter="observations",
                value=str(self.path),
            ) from None

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One transaction on the store. A store deleted while the service runs is made again (empty: the schema is
        ensured on every connection); one replaced by something that is not an SQLite database, or unreadable, is
        a :class:`ServiceError` (503) that names it, not a 500."""
        try:
            db = sqlite3.connect(self.path, timeout=10)
        except sqlite3.Error as exc:
            raise self._unusable(exc) from None
        try:
            with db:  # one transaction: committed on success, rolled back on error
                db.executescript(_SCHEMA)
                columns = {row[1] for row in db.execute("PRAGMA table_info(observations)")}
                for column in ("run_id", "transport"):  # a store from before runs, before transports
                    if column not in columns:
                        db.execute(f"ALTER TABLE observations ADD COLUMN {column} TEXT")
                yield db
        except sqlite3.DatabaseError as exc:
            raise self._unusable(exc) from None
        finally:
            db.close()

    def _unusable(self, exc: Exception) -> ServiceError:
        return ServiceError(
            f"The observations store {str(self.path)!r} cannot be used now ({exc}): it was replaced or damaged while "
            "the service ran. Restore it, or restart the service with another observations file (`srifty serve "
            "--observations`).",
            status=503,
        )

    def add(
        self,
        profile: Profile,
        fleet: str,
        throughput_samples_s: float,
        *,
        iteration_time_s: float | None = None,
        source: str = "",
        run_id: str | None = None,
        catalog: Catalog | None = None,
        transport: str | None = None,
    ) -> Observation:
        """Record a measurement; the fleet must parse against the catalog (unknown types get "did you mean").
        ``run_id``: the run a verified run token was issued for (the service passes it; None counts nowhere);
        ``transport``: how the fleet's nodes met (its plan's; None: not said, priced as "auto")."""
        if transport is not None:
            check_choice("observation", "transport", transport, TRANSPORTS)
        check_number("observation", "throughput_samples_s", throughput_samples_s, minimum=0, exclusive=True)
        if iteration_time_s is not None:
            check_number("observation", "iteration_time_s", iteration_time_s, minimum=0, exclusive=True)
        if len(source) > 200:
            raise ConfigError("The observation's 'source' is limited to 200 characters.", parameter="source")
        if not profile.model.name:
            raise ConfigError(
                "The profile has no model.name: observations are matched to later profiles by the model's name. "
                "Name it (SriftyCallback(model_name=...)).",
                parameter="profile.model.name",
            )
        if len(profile.model.name) > MODEL_NAME_MAX:  # a trial's name had no limit: the store keeps it for good
            raise ConfigError(
                f"The profile's model.name is {len(profile.model.name):,} characters; observations keep at most "
                f"{MODEL_NAME_MAX}. Name it shorter (SriftyCallback(model_name=...)).",
                parameter="profile.model.name",
                value=f"{len(profile.model.name):,} characters",
            )
        parsed = parse_fleet(fleet, catalog or Catalog.load())
        gpu = ",".join(sorted({g.instance.gpu or g.instance.name for g in parsed.groups}))
        created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        row = (model_key(profile), profile.model.name, str(parsed), gpu, float(throughput_samples_s))
        with self._connect() as db:
            cur = db.execute(
                "INSERT INTO observations (model_key, model, fleet, gpu, throughput_samples_s, iteration_time_s, "
                "source, created_at, run_id, transport) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, iteration_time_s, source, created, run_id, transport),
            )
            new_id = int(cur.lastrowid or 0)
        return Observation(new_id, *row, iteration_time_s, source, created, run_id, transport)

    def list(self, key: str | None = None, limit: int = 1000) -> list[Observation]:
        query = (
            f"SELECT {_COLUMNS} FROM observations"
            + (" WHERE model_key = ?" if key else "")
            + " ORDER BY id DESC LIMIT ?"
        )
        with self._connect() as db:
            rows = db.execute(query, (key, limit) if key else (limit,)).fetchall()
        return [Observation(*row) for row in rows]

    def calibration(self, profile: Profile, catalog: Catalog | None = None) -> Calibration | None:
        """Factors by GPU from the observations of this model (None when no GPU has enough agreeing runs).

        Per GPU: each issued run's median log(measured / predicted) (observations without a run count nowhere);
        the runs within a factor
        :data:`AGREE` of the median run; with at least :data:`MIN_RUNS` of them, their mean shrunk toward 0 (the
        model) as ``n / (n + PRIOR_RUNS)`` and bounded by ``n * log(STEP)``. One post, or many from one run, or runs
        that disagree, change nothing."""

        catalog = catalog or Catalog.load()
        runs: dict[str, dict[str, list[float]]] = {}
        for obs in self.list(model_key(profile)):
            if obs.run_id is None:
                continue  # not posted with a run token: anybody's label, not evidence
            if "," in obs.gpu:
                continue  # a mix: cannot tell which GPU was off
            ratio = measured_over_predicted(profile, obs, catalog)
            if ratio is not None and FACTOR_LIMITS[0] <= ratio <= FACTOR_LIMITS[1] and step_samples_agree(profile, obs):
                runs.setdefault(obs.gpu, {}).setdefault(obs.run_id, []).append(math.log(ratio))
        factors, counts = {}, {}
        for gpu, by_run in runs.items():
            found = calibrated_log_factor([_median(v) for v in by_run.values()])
            if found is not None:
                factors[gpu], counts[gpu] = math.exp(found[0]), found[1]
        return Calibration(factors, counts) if factors else None


def measured_over_predicted(profile: Profile, obs: Observation, catalog: Catalog) -> float | None:
    """An observation's throughput over the model's for its fleet, as its nodes met (a multi-node run over TCP is not
    a slow GPU on EFA) and in the layout srifty recommend runs it with (``predict(layout="auto")``); None when the
    fleet is no longer in the catalog or the profile cannot predict it."""
    from predictor.model.predict import AUTO, predict

    try:
        # the layout the ranking runs this fleet with (a model too large for DDP was compared with DDP's prediction,
        # which does not fit: runs that met the plan exactly moved the factor by the step's bound)
        predicted = predict(profile, obs.fleet, catalog=catalog, transport=obs.transport or "auto", layout=AUTO)
    except SriftyError:
        return None
    return obs.throughput_samples_s / predicted.throughput_samples_s


def step_samples(profile: Profile, obs: Observation) -> float | None:
    """The samples of a step the observation implies (throughput x its optimizer step's time) over the profile's
    global batch; None without a step time."""
    if obs.iteration_time_s is None:
        return None
    return obs.throughput_samples_s * obs.iteration_time_s / global_batch(profile)


def step_samples_agree(profile: Profile, obs: Observation) -> bool:
    """The observation's throughput and step time describe the profiled training's step, within
    :data:`STEP_SAMPLES_LIMIT` (or it has no step time)."""
    ratio = step_samples(profile, obs)
    return ratio is None or 1 / STEP_SAMPLES_LIMIT <= ratio <= STEP_SAMPLES_LIMIT


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def calibrated_log_factor(run_logs: list[float]) -> tuple[float, int] | None:
    """The log factor the runs' log ratios give (and how many runs agreed), or None without :data:`MIN_RUNS` runs
    agreeing within :data:`AGREE` of their median."""
    if len(run_logs) < MIN_RUNS:
        return None
    centre = _median(run_logs)
    agreeing = [v for v in run_logs if abs(v - centre) <= math.log(AGREE)]
    n = len(agreeing)
    if n < MIN_RUNS:
        return None
    shrunk = sum(agreeing) / n * n / (n + PRIOR_RUNS)
    bound = n * math.log(STEP)
    return max(-bound, min(bound, shrunk)), n
