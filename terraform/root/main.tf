provider "aws" {
  region = var.region
  # how often the AWS SDK retries a failed call (null: the provider's 25); srifty launch sets a few, so that a launch
  # EC2 refuses for capacity fails in seconds and the next entry of the plan is tried
  max_retries = var.aws_max_retries

  # a local AWS-compatible endpoint (tests, moto's server): no real credentials or account behind it
  skip_credentials_validation = var.aws_endpoint != null
  skip_requesting_account_id  = var.aws_endpoint != null
  skip_metadata_api_check     = var.aws_endpoint != null
  s3_use_path_style           = var.aws_endpoint != null

  dynamic "endpoints" {
    for_each = var.aws_endpoint == null ? [] : [var.aws_endpoint]
    content {
      autoscaling = endpoints.value
      ec2         = endpoints.value
      iam         = endpoints.value
      s3          = endpoints.value
      ssm         = endpoints.value
      sts         = endpoints.value
    }
  }

  # no default_tags: the module tags every resource it makes with var.tags itself, and default tags would reach its S3
  # objects too, where S3 takes at most 10 ("You can associate up to 10 tags with an object",
  # https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-tagging.html)
}

module "fleet" {
  source = "./modules/training_fleet"

  name                     = var.name
  network                  = var.network
  ssh_cidr_blocks          = var.ssh_cidr_blocks
  allow_wide_ssh           = var.allow_wide_ssh
  key_name                 = var.key_name
  groups                   = var.groups
  capacity                 = var.capacity
  ami                      = var.ami
  root_volume_gb           = var.root_volume_gb
  metadata_hop_limit       = var.metadata_hop_limit
  metadata_tags            = var.metadata_tags
  checkpoints              = var.checkpoints
  enable_ssm               = var.enable_ssm
  enable_cloudwatch        = var.enable_cloudwatch
  iam_permissions_boundary = var.iam_permissions_boundary
  iam_path                 = var.iam_path
  secrets                  = var.secrets
  data                     = var.data
  data_kms_key_arns        = var.data_kms_key_arns
  secret_kms_key_arns      = var.secret_kms_key_arns
  train                    = var.train
  max_life_h               = var.max_life_h
  watchdog                 = var.watchdog
  limits                   = var.limits
  predicted                = var.predicted
  tags                     = var.tags
}
