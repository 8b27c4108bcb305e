"""The tests' name for the proxy that keeps real AWS's rules in front of moto (and injects capacity errors and lost
answers): :mod:`lightning_srifty.provision.rehearsal.aws_rules`, which ``srifty rehearse`` runs too."""

from lightning_srifty.provision.rehearsal.aws_rules import USER_DATA_LIMIT, AwsRulesProxy, user_data_sizes

FaultProxy = AwsRulesProxy
__all__ = ["USER_DATA_LIMIT", "FaultProxy", "user_data_sizes"]
