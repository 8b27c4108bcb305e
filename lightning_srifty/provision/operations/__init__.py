"""What runs once a fleet is up, from the cloud alone: ``srifty status`` and ``srifty down`` (``fleets``: the fleets
that carry the ``srifty:fleet`` tag, what they cost so far, their heartbeat and network notes) and ``srifty logs``
(``logs``: the nodes' logs under the checkpoint folder).

May import ``provision.aws``, ``provision.terraform`` (the money figures) and ``provision.apply`` (a root module's
outputs); never the launcher.
"""
