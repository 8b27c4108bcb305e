"""The Terraform a fleet is made of, written for review: ``srifty terraform``'s root module (``generate``), the code
snapshot the nodes run (``snapshot``) with the node's own bootstrap script (``bootstrap``, shipped as a file, run by
cloud-init), the torch build for the node's driver and GPU (``cuda``), the training command's rules (``command``) and
the plan's money limits (``money``).

Imports only ``provision.aws`` of its own package (the zone IDs and the bucket's TLS rule), plus ``protocol`` and
``predictor``: the pre-flight, apply/destroy, the launcher and the fleet operations build on it, never the reverse.
"""
