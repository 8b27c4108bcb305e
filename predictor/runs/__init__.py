"""What a run pays besides its steps, and what it risks under a deadline: start-up and billing minimums
(:mod:`.startup`), spot interruptions (:mod:`.spot`), spot capacity as the traces recorded it (:mod:`.traces`), spot
under a deadline (:mod:`.deadline`: the tick model, the policies, the trace replay, the hindsight optimum, a plan as
a job), and what the ranking asks of a run under a deadline (:mod:`.odds`: the expectation with the on-demand
fallback, the chance of finishing in time).

Imports the documents, the catalog and the model's uncertainty (the regimes' widths), never the step model's
terms, the ranking or the service.
"""

from predictor.runs.deadline import POLICIES, Job, replay
from predictor.runs.odds import SpotStats, deadline_odds
from predictor.runs.startup import fleet_startup_s
from predictor.runs.traces import Trace, read_trace

__all__ = ["POLICIES", "Job", "SpotStats", "Trace", "deadline_odds", "fleet_startup_s", "read_trace", "replay"]
