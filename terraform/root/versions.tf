# Written by `srifty terraform` (lightning-srifty); the values are in srifty.auto.tfvars.json, the resources in
# modules/training_fleet. Review `terraform plan` before applying.
terraform {
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.30, < 6.0"
    }
  }
}
