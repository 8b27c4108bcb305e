"""``srifty launch``: the launcher's state machine (``launch``: :class:`LauncherSettings`, :func:`launch` and the
:class:`Launcher` answering each poll), what every leg needs (``legs``: a fleet brought up or the plan's next entries,
the job started with its settings, each move measured and reported), what it watches (``watches``: its heartbeat, a
fleet that never reports, another launch in the same folder), the spot guard (``spot_guard`` decides,
``steering`` brings its choice up), and the providers that bring fleets up and down for it: processes on this
machine (``local``) and the generated Terraform (``terraform_fleet``).

May import the provider interface (``provision.base``), ``provision.aws``, ``provision.terraform`` and
``provision.apply``; never the fleet operations, the pre-flight's CLI or the rehearsal.
"""
