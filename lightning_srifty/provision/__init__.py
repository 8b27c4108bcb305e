"""Outside the training job, torch-free: everything between a plan and a fleet that trains, one room per concept.

Rooms, each importing only those below it (tests/house/test_package.py holds the order; ``python bench/house.py`` counts
rooms and floors):

1. ``base`` (the provider interface: a launched fleet, what a provisioner does, the interrupt guard) and ``aws``
   (boto3 clients, botocore's errors in words, zone facts, S3 folder URIs, a local instance-metadata stand-in);
2. ``terraform/``: the root module ``srifty terraform`` writes, the code snapshot and the node's bootstrap, the torch
   build for the node's driver, the training command's rules, the plan's money limits;
3. ``preflight``: what must hold before a fleet is paid for (``srifty check``);
4. ``apply``: python-terraform's apply and destroy, pre-flight first (``srifty apply`` / ``destroy``);
5. ``launcher/`` (``srifty launch``: the state machine, the spot guard, the local and Terraform providers),
   ``operations/`` (``srifty status`` / ``logs`` / ``down``) and ``rehearsal/`` (``srifty rehearse``).

May import ``protocol``, ``console`` and ``predictor``; never torch, lightning, ``profiling``, ``ddp`` or
``migrate``. A project import inside a function is not used here: only the optional extras (boto3,
python-terraform, pathspec) are deferred, so that commands that do not need them start without them.
"""
