# The module validates every value; see modules/training_fleet/README.md for the fields of each object.

variable "region" {
  description = "AWS region of the fleet (the plan's region)."
  type        = string
}

variable "aws_endpoint" {
  description = "A local AWS-compatible endpoint such as http://127.0.0.1:5000 for offline tests; null for AWS."
  type        = string
  default     = null
}

variable "aws_max_retries" {
  description = "How often the AWS SDK retries a failed call; null: the provider's default (25)."
  type        = number
  default     = null
}

variable "name" {
  description = "Name of the training run."
  type        = string
}

variable "network" {
  description = "Existing VPC and subnets, or create_vpc = true."
  type        = any
  default     = { create_vpc = true }
}

variable "ssh_cidr_blocks" {
  description = "CIDR blocks allowed to SSH; empty opens no SSH port."
  type        = list(string)
  default     = []
}

variable "key_name" {
  description = "EC2 key pair, or null."
  type        = string
  default     = null
}

variable "groups" {
  description = "The fleet's instance types with on-demand and spot counts, GPUs per instance and weighted capacity."
  type        = any
}

variable "capacity" {
  description = "How the fleet is bought (asg or fleet mode, spot allocation, on-demand base)."
  type        = any
  default     = {}
}

variable "ami" {
  description = "AMI id, or the SSM parameter of the Deep Learning AMI."
  type        = any
  default     = {}
}

variable "root_volume_gb" {
  description = "Root volume size in GiB."
  type        = number
  default     = 200
}

variable "checkpoints" {
  description = "The checkpoint bucket and prefix."
  type        = any
  default     = {}
}

variable "allow_wide_ssh" {
  description = "Let ssh_cidr_blocks cover more than a /8 worth of addresses (srifty terraform --allow-wide-ssh)."
  type        = bool
  default     = false
}

variable "secrets" {
  description = "Environment variables the instances read at boot from SSM Parameter Store or Secrets Manager, by name (srifty terraform --secret-env)."
  type        = any
  default     = []
}

variable "enable_ssm" {
  description = "Allow SSM Session Manager."
  type        = bool
  default     = false
}

variable "enable_cloudwatch" {
  description = "Allow the CloudWatch agent."
  type        = bool
  default     = false
}

variable "train" {
  description = "Setup command, training command, node count, rendezvous port, checkpoint to resume from."
  type        = any
}

variable "max_life_h" {
  description = "Hard cap on every instance's life, in hours from boot."
  type        = number
  default     = 72
}

variable "watchdog" {
  description = "The instance-side watchdog: heartbeat, interval_s, grace_s, max_age_s."
  type        = any
  default     = {}
}

variable "limits" {
  description = "Money guards: max_instances, max_hourly_usd."
  type        = any
  default     = { max_instances = 16 }
}

variable "predicted" {
  description = "The plan's prediction for this fleet."
  type        = any
  default     = null
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}
