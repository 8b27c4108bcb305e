"""``srifty launch``: the launcher's state machine (``launch``), what it watches (the spot guard: ``spot_guard``;
interrupts: ``signals``), and the providers that bring fleets up and down for it: processes on this machine
(``local``, with its instance-metadata stand-in ``imds_sim``) and the generated Terraform (``terraform_fleet``).

May import the provider interface (``provision.base``), ``provision.aws``, ``provision.terraform`` and
``provision.apply``; never the fleet operations, the pre-flight's CLI or the rehearsal.
"""
