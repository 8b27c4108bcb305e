"""Provisioning the planned fleet with Terraform (torch-free): :mod:`.generate` writes a root module from a plan,
:mod:`.runner` runs terraform through python-terraform."""
