# Every input of modules/training_fleet, typed attribute for attribute as the module declares it (checked by
# tests/infra/test_terraform_types.py). The object attributes that may be left out are optional() here without a default:
# an attribute left out reaches the module as null, and the module puts its own default in (declared there once).
# The module validates every value it receives, with sentences that name the field; the root validates only its own
# inputs (region, aws_endpoint, aws_max_retries). modules/training_fleet/README.md describes every field.

variable "region" {
  description = "AWS region of the fleet (the plan's region)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]+$", var.region))
    error_message = "The region must be an AWS region code such as us-east-1 or eu-central-1."
  }
}

variable "aws_endpoint" {
  description = "A local AWS-compatible endpoint such as http://127.0.0.1:5000 for offline tests; null for AWS."
  type        = string
  default     = null

  validation {
    condition     = var.aws_endpoint == null ? true : can(regex("^https?://[^[:space:]]+$", var.aws_endpoint))
    error_message = "The aws_endpoint must be an http:// or https:// URL without spaces, such as http://127.0.0.1:5000 (or null for AWS itself)."
  }
}

variable "aws_max_retries" {
  description = "How often the AWS SDK retries a failed call; null: the provider's default (25)."
  type        = number
  default     = null

  validation {
    condition     = var.aws_max_retries == null ? true : var.aws_max_retries >= 0 && floor(var.aws_max_retries) == var.aws_max_retries
    error_message = "The aws_max_retries must be a whole number of at least 0 (or null for the provider's 25)."
  }
}

variable "name" {
  description = "Name of the training run."
  type        = string
}

variable "network" {
  description = "Existing VPC and subnets, or create_vpc = true (a minimal VPC, in availability_zone or availability_zone_id)."
  type = object({
    create_vpc           = optional(bool)
    vpc_id               = optional(string)
    subnet_ids           = optional(list(string))
    vpc_cidr             = optional(string)
    availability_zone    = optional(string)
    availability_zone_id = optional(string)
  })
  default = { create_vpc = true }
}

variable "ssh_cidr_blocks" {
  description = "CIDR blocks allowed to SSH; empty opens no SSH port."
  type        = list(string)
  default     = []
}

variable "allow_wide_ssh" {
  description = "Let ssh_cidr_blocks cover more than a /8 worth of addresses (srifty terraform --allow-wide-ssh)."
  type        = bool
  default     = false
}

variable "key_name" {
  description = "EC2 key pair, or null."
  type        = string
  default     = null
}

variable "groups" {
  description = "The fleet's instance types with on-demand and spot counts, GPUs per instance, weighted capacity, architecture and EFA interfaces."
  type = list(object({
    instance_type      = string
    on_demand          = number
    spot               = number
    gpus_per_instance  = number
    weighted_capacity  = number
    arch               = optional(string)
    efa                = optional(bool)
    network_interfaces = optional(number)
  }))
}

variable "capacity" {
  description = "How the fleet is bought (asg or fleet mode, spot allocation, on-demand base, capacity rebalance, placement group)."
  type = object({
    mode                            = optional(string)
    spot_allocation_strategy        = optional(string)
    on_demand_base_capacity         = optional(number)
    on_demand_percentage_above_base = optional(number)
    capacity_rebalance              = optional(bool)
    placement_group                 = optional(bool)
  })
  default = {}
}

variable "ami" {
  description = "AMI id, or (id = null) the SSM parameters of the Deep Learning AMI per architecture."
  type = object({
    id             = optional(string)
    ssm_parameters = optional(map(string))
  })
  default = {}
}

variable "root_volume_gb" {
  description = "Root volume size in GiB."
  type        = number
  default     = 200
}

variable "metadata_hop_limit" {
  description = "IMDSv2 response hop limit: 1 for training on the instance, and in srifty's container (it runs on the host's network); 2 for a container on a bridge network of its own that must reach the instance metadata."
  type        = number
  default     = 1
}

variable "checkpoints" {
  description = "The checkpoint bucket (new or existing), the prefix the instances may touch, and the bucket's settings."
  type = object({
    create_bucket   = optional(bool)
    bucket          = optional(string)
    prefix          = optional(string)
    force_destroy   = optional(bool)
    kms_key_arn     = optional(string)
    noncurrent_days = optional(number)
    tls_only        = optional(bool)
  })
  default = {}
}

variable "enable_ssm" {
  description = "Allow SSM Session Manager."
  type        = bool
  default     = false
}

variable "secrets" {
  description = "Environment variables the instances read at boot from SSM Parameter Store or Secrets Manager, by name (srifty terraform --secret-env)."
  type = list(object({
    name   = string
    source = string
    id     = string
  }))
  default = []
}

variable "data" {
  description = "Training data the instances read from S3, read-only, each as an environment variable (srifty terraform --data, --data-copy)."
  type = list(object({
    name = string
    uri  = string
    copy = optional(bool)
  }))
  default = []
}

variable "secret_kms_key_arns" {
  description = "Customer-managed KMS keys the secrets are encrypted with (srifty terraform --secret-kms-key)."
  type        = list(string)
  default     = []
}

variable "data_kms_key_arns" {
  description = "The customer-managed KMS keys the data buckets encrypt with (srifty terraform --data-kms-key)."
  type        = list(string)
  default     = []
}

variable "iam_permissions_boundary" {
  description = "A managed policy's ARN set as the instance role's permissions boundary (the module's; null: none)."
  type        = string
  default     = null
}

variable "iam_path" {
  description = "IAM path of the instance role and its instance profile (the module's)."
  type        = string
  default     = "/"
}

variable "enable_cloudwatch" {
  description = "Allow the CloudWatch agent."
  type        = bool
  default     = false
}

variable "metadata_tags" {
  description = "Let each instance read its tags from the instance metadata; EC2 then restricts instance tag keys (letters, digits and + - = . , _ : @; the module refuses others at plan)."
  type        = bool
  default     = false
}

variable "train" {
  description = "Setup command, torchrun's argv, node count, rendezvous port, checkpoint to resume from, handover, environment, container image and code snapshot."
  type = object({
    setup_command        = optional(string)
    argv                 = list(string)
    nnodes               = number
    rdzv_port            = optional(number)
    rendezvous_timeout_s = optional(number)
    resume_from          = optional(string)
    handover             = optional(bool)
    env                  = optional(map(string))
    image                = optional(string)
    code = optional(object({
      source = string
      sha256 = string
    }))
  })
}

variable "max_life_h" {
  description = "Hard cap on the fleet's life, in hours from its first launch (each instance's own shutdown at this long after its boot holds whatever else fails)."
  type        = number
  default     = 72
}

variable "watchdog" {
  description = "The instance-side watchdog: heartbeat, interval_s, grace_s, max_age_s, stall_s (the hang watch; 0: off), after_fit_s (a script silent this long after its training ends the fleet; 0: no limit)."
  type = object({
    heartbeat   = optional(bool)
    interval_s  = optional(number)
    grace_s     = optional(number)
    max_age_s   = optional(number)
    stall_s     = optional(number)
    after_fit_s = optional(number)
  })
  default = {}
}

variable "limits" {
  description = "Money guards: max_instances, max_hourly_usd (null: no hourly limit)."
  type = object({
    max_instances  = number
    max_hourly_usd = optional(number)
  })
  default = { max_instances = 16 }
}

variable "predicted" {
  description = "The plan's prediction for this fleet."
  type = object({
    throughput_samples_s      = number
    usd_per_hour              = number
    time_h                    = number
    cost_usd                  = number
    samples_per_capacity_unit = number
  })
  default = null
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}
