"""``srifty rehearse``: a root module's fleet played on this machine against a local AWS before any money is spent
(:mod:`.walk`); the local AWS (:mod:`.local_aws`) and the rules of real AWS it keeps (:mod:`.aws_rules`); one node
(:mod:`.node`)."""
