"""The IMDSv2-compatible test server is the package's own local metadata service (token endpoint, token check,
metadata paths, requests recorded)."""

from lightning_srifty.provision.aws import LocalIMDS as FakeIMDS

__all__ = ["FakeIMDS"]
