"""The documents that cross a boundary, and how they are read and written:

- :mod:`~predictor.documents.profile`: what ``SriftyCallback`` measured (``srifty.profile/v1``);
- :mod:`~predictor.documents.plan`: the ranked fleets (``srifty.plan/v1``), which ``srifty terraform`` and the
  launcher act on;
- :mod:`~predictor.documents.work`: the request vocabulary (samples, batches, optimizer steps, accumulation);
- :mod:`~predictor.documents.schema`: the dataclass fields behind both schemas and their reference pages;
- :mod:`~predictor.documents.atomic`: atomic writes and bounded reads (a reader sees the old file or the new one);
- :mod:`~predictor.documents.checks`: parameter checks with one message shape everywhere.

Imports nothing of the predictor but :mod:`predictor.exceptions`.
"""

from predictor.documents.plan import Plan, PlanEntry, load_plan
from predictor.documents.profile import Profile, load_profile, profile_from_dict
from predictor.documents.work import Work, global_batch

__all__ = ["Plan", "PlanEntry", "Profile", "Work", "global_batch", "load_plan", "load_profile", "profile_from_dict"]
