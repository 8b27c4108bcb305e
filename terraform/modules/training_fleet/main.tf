data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

# The image follows each type's architecture (an x86_64 image does not launch on Graviton g5g, nor an arm64 one on
# g5): one public SSM parameter of the AWS Deep Learning AMI per architecture the fleet uses, "Finding the ID of a
# DLAMI", https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html
# (/aws/service/deeplearning/ami/<x86_64|arm64>/<ami type>/latest/ami-id).
data "aws_ssm_parameter" "ami" {
  for_each = var.ami.id == null ? toset([for g in var.groups : g.arch]) : toset([])
  name     = var.ami.ssm_parameters[each.key]
}

# each image the groups boot, for its root device's name (an image not visible to the account fails the plan here)
data "aws_ami" "image" {
  for_each = toset([for g in var.groups : var.ami.id != null ? var.ami.id : local.ami_ids[g.arch]])

  filter {
    name   = "image-id"
    values = [each.value]
  }
}

locals {
  # each group's image, and the size of its root snapshot in GiB (0 where the image says none)
  group_image = { for k, g in local.groups : k => var.ami.id != null ? var.ami.id : local.ami_ids[g.arch] }
  image_root_gb = { for k, id in local.group_image : k => max(0, [
    for m in data.aws_ami.image[id].block_device_mappings : tonumber(lookup(m.ebs, "volume_size", "0"))
    if m.device_name == data.aws_ami.image[id].root_device_name
  ]...) }
  # the instances' tag keys EC2 refuses when their tags are in the instance metadata (metadata_tags)
  imds_bad_tag_keys = [for k in keys(local.fleet_tags) : k if !can(regex("^[A-Za-z0-9+=.,_:@-]+$", k)) || contains([".", "..", "_index"], k)]
}

locals {
  fleet_tags = merge(var.tags, { "srifty:fleet" = var.name })
  ami_ids    = { for arch, p in data.aws_ssm_parameter.ami : arch => p.insecure_value }
  vpc_id     = var.network.create_vpc ? aws_vpc.this[0].id : var.network.vpc_id
  # EC2 gives no public IP to an instance with several network interfaces (one EFA interface per card): in the
  # minimal VPC such a fleet runs in a private subnet behind a NAT gateway
  multi_nic  = anytrue([for g in var.groups : g.efa && g.network_interfaces > 1])
  private    = var.network.create_vpc && local.multi_nic
  subnet_ids = var.network.create_vpc ? [local.private ? aws_subnet.private[0].id : aws_subnet.this[0].id] : var.network.subnet_ids
  # EFA's OS-bypass traffic does not leave its subnet ("EFA OS-bypass traffic is limited to a single subnet", Amazon
  # EC2 User Guide, Elastic Fabric Adapter, limitations; AWS ParallelCluster: "with other instances in the same
  # subnet"): a fleet with EFA groups is launched into the first subnet only, so NCCL's EFA transport, which the
  # prediction prices, reaches every node; without EFA the group may spread over every subnet given
  efa = anytrue([for g in var.groups : g.efa])
  # a cluster placement group is in one Availability Zone: an Auto Scaling group given one with subnets of several
  # zones is refused ("You cannot specify multiple Availability Zones and a cluster placement group",
  # CreateAutoScalingGroup's PlacementGroup, Amazon EC2 Auto Scaling API reference): the first subnet only then too
  asg_subnets = local.efa || var.capacity.placement_group ? slice(local.subnet_ids, 0, 1) : local.subnet_ids
  # the training command as shell words: every argument single-quoted (a quote inside becomes '\''), after a "--"
  # that ends torchrun's own options (after -m for a module): torchrun's parser reads every word of the line for its
  # options' abbreviations, and refused the whole line for a script's "--log" (--log-dir, --logs-specs) or "--max"
  train_words = try(var.train.argv[0], "") == "-m" ? concat(["-m", "--"], slice(var.train.argv, 1, length(var.train.argv))) : concat(["--"], var.train.argv)
  train_argv  = join(" ", [for a in local.train_words : "'${replace(a, "'", "'\\''")}'"])
  bucket      = var.checkpoints.create_bucket ? aws_s3_bucket.checkpoints[0].bucket : var.checkpoints.bucket
  bucket_arn  = "arn:${data.aws_partition.current.partition}:s3:::${local.bucket}"
  # the code snapshot (srifty terraform), content-addressed under the checkpoint prefix
  code_key = var.train.code == null ? "" : "${var.checkpoints.prefix}code/${var.train.code.sha256}.tar.gz"
  # launch-template priority: the order of var.groups (srifty terraform lists the cheapest on-demand type first)
  groups         = { for i, g in var.groups : g.instance_type => merge(g, { priority = i }) }
  nodes          = sum([for g in var.groups : g.on_demand + g.spot])
  capacity_units = sum([for g in var.groups : (g.on_demand + g.spot) * g.weighted_capacity])
  # a mixed Auto Scaling group fills its capacity in units with whatever mix of its types AWS finds (not
  # necessarily the plan's counts): its nodes' rendezvous counts the live members whose units cover it
  # (https://docs.aws.amazon.com/autoscaling/ec2/userguide/asg-instance-weighting.html: the allocation strategy, not
  # the weights, picks the types, and the group launches until the capacity is met, overage included)
  mixed_asg = var.capacity.mode == "asg" && length(var.groups) > 1
  # the ARNs of the named secrets (srifty terraform --secret-env), in the fleet's account and region
  arn_prefix      = "arn:${data.aws_partition.current.partition}"
  account_region  = "${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}"
  ssm_secret_arns = [for s in var.secrets : "${local.arn_prefix}:ssm:${local.account_region}:parameter/${trimprefix(s.id, "/")}" if s.source == "ssm"]
  sm_secret_arns  = [for s in var.secrets : startswith(s.id, "arn:") ? s.id : "${local.arn_prefix}:secretsmanager:${local.account_region}:secret:${s.id}-??????" if s.source == "secretsmanager"]
  # the training data (srifty terraform --data, --data-copy): each folder's bucket and prefix, read-only
  data = [for d in var.data : merge(d, {
    bucket = split("/", trimprefix(d.uri, "s3://"))[0]
    prefix = join("/", slice(split("/", trimprefix(d.uri, "s3://")), 1, length(split("/", trimprefix(d.uri, "s3://")))))
  })]
}

# ---------------------------------------------------------------------------------------------------------------------
# Network: an optional minimal VPC, and the fleet's security group
# ---------------------------------------------------------------------------------------------------------------------

resource "aws_vpc" "this" {
  count                = var.network.create_vpc ? 1 : 0
  cidr_block           = var.network.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = merge(local.fleet_tags, { Name = "${var.name}-vpc" })
  # checkov:skip=CKV2_AWS_11:A short-lived training VPC; pass network.vpc_id of a long-lived VPC with flow logs for audited runs.
}

resource "aws_default_security_group" "this" {
  count  = var.network.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id
  tags   = merge(local.fleet_tags, { Name = "${var.name}-default-deny" })
}

resource "aws_internet_gateway" "this" {
  count  = var.network.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id
  tags   = merge(local.fleet_tags, { Name = "${var.name}-igw" })
}

resource "aws_subnet" "this" {
  count                = var.network.create_vpc ? 1 : 0
  vpc_id               = aws_vpc.this[0].id
  cidr_block           = cidrsubnet(var.network.vpc_cidr, 4, 0)
  availability_zone    = var.network.availability_zone
  availability_zone_id = var.network.availability_zone_id
  # checkov:skip=CKV_AWS_130:Instances with one network interface need egress (packages, S3) and the minimal VPC gives them no NAT gateway (fleets with several EFA interfaces per instance run in its private subnet behind one); inbound traffic is still limited to fleet members and ssh_cidr_blocks by the security group.
  map_public_ip_on_launch = true
  tags                    = merge(local.fleet_tags, { Name = "${var.name}-subnet" })
}

resource "aws_route_table" "this" {
  count  = var.network.create_vpc ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this[0].id
  }

  tags = merge(local.fleet_tags, { Name = "${var.name}-public" })
}

resource "aws_route_table_association" "this" {
  count          = var.network.create_vpc ? 1 : 0
  subnet_id      = aws_subnet.this[0].id
  route_table_id = aws_route_table.this[0].id
}

resource "aws_eip" "nat" {
  count  = local.private ? 1 : 0
  domain = "vpc"
  tags   = merge(local.fleet_tags, { Name = "${var.name}-nat" })
}

resource "aws_nat_gateway" "this" {
  count         = local.private ? 1 : 0
  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.this[0].id
  tags          = merge(local.fleet_tags, { Name = "${var.name}-nat" })
  depends_on    = [aws_internet_gateway.this]
}

resource "aws_subnet" "private" {
  count             = local.private ? 1 : 0
  vpc_id            = aws_vpc.this[0].id
  cidr_block        = cidrsubnet(var.network.vpc_cidr, 4, 1)
  availability_zone = aws_subnet.this[0].availability_zone # beside the public subnet and its NAT gateway
  tags              = merge(local.fleet_tags, { Name = "${var.name}-private" })
}

resource "aws_route_table" "private" {
  count  = local.private ? 1 : 0
  vpc_id = aws_vpc.this[0].id

  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.this[0].id
  }

  tags = merge(local.fleet_tags, { Name = "${var.name}-private" })
}

resource "aws_route_table_association" "private" {
  count          = local.private ? 1 : 0
  subnet_id      = aws_subnet.private[0].id
  route_table_id = aws_route_table.private[0].id
}

# S3 through a gateway endpoint in the minimal VPC: the code snapshot, the training environment's wheels (some GB a
# node) and every checkpoint go to and from S3, and through the NAT gateway of a private subnet each GB would cost
# its processing charge; a gateway endpoint has none ("Amazon VPC pricing": NAT gateway data processing; "Gateway
# endpoints for Amazon S3": "There is no additional charge for using gateway endpoints"), and S3 traffic leaves the
# public subnet's internet gateway path too
resource "aws_vpc_endpoint" "s3" {
  count             = var.network.create_vpc ? 1 : 0
  vpc_id            = aws_vpc.this[0].id
  service_name      = "${data.aws_partition.current.reverse_dns_prefix}.${data.aws_region.current.name}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = concat([aws_route_table.this[0].id], aws_route_table.private[*].id)
  tags              = merge(local.fleet_tags, { Name = "${var.name}-s3" })
}

resource "aws_security_group" "fleet" {
  name_prefix = "${var.name}-fleet-"
  description = "Training fleet ${var.name}: all traffic between members (NCCL, gloo, torchrun rendezvous), SSH only from the given CIDR blocks"
  vpc_id      = local.vpc_id
  tags        = merge(local.fleet_tags, { Name = "${var.name}-fleet" })

  ingress {
    description = "Every protocol and port between fleet members (NCCL, EFA, gloo, c10d rendezvous)"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }

  dynamic "ingress" {
    for_each = length(var.ssh_cidr_blocks) > 0 ? [1] : []
    content {
      description = "SSH from the operator networks (ssh_cidr_blocks)"
      from_port   = 22
      to_port     = 22
      protocol    = "tcp"
      cidr_blocks = var.ssh_cidr_blocks
    }
  }

  egress {
    description = "Every protocol and port to fleet members (EFA requires an all-traffic self egress rule)"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }

  egress {
    # checkov:skip=CKV_AWS_382:The only all-protocol egress is to the fleet's own members (self: EFA requires it); egress to the internet is TCP 443 and 80 only (packages, datasets, S3), restrict it further with a VPC endpoint policy or a proxy where required.
    description = "HTTPS to package indexes, S3 and the AWS APIs"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  egress {
    description = "HTTP for OS package mirrors"
    from_port   = 80
    to_port     = 80
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_placement_group" "this" {
  count    = var.capacity.placement_group ? 1 : 0
  name     = "${var.name}-cluster"
  strategy = "cluster"
  tags     = local.fleet_tags
}

# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints: an encrypted, versioned, private bucket (or an existing one)
# ---------------------------------------------------------------------------------------------------------------------

resource "aws_s3_bucket" "checkpoints" {
  count         = var.checkpoints.create_bucket ? 1 : 0
  bucket        = coalesce(var.checkpoints.bucket, "${var.name}-checkpoints-${data.aws_caller_identity.current.account_id}")
  force_destroy = var.checkpoints.force_destroy
  tags          = local.fleet_tags
  # checkov:skip=CKV_AWS_18:Access logs need a second, long-lived log bucket; the fleet's role reaches only its prefix, and other principals of the account only as their own IAM policies grant S3 (CloudTrail data events log object access where required).
  # checkov:skip=CKV_AWS_144:Checkpoints are reproducible training state, not data of record; cross-region replication doubles their cost.
  # checkov:skip=CKV2_AWS_62:No consumer of bucket events; the orchestrator polls the checkpoint prefix.

  lifecycle {
    # "Bucket names must be between 3 (min) and 63 (max) characters long"
    # (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html): the bucket named after the run
    # adds 25 (-checkpoints- and the 12-digit account id) to the name's 3 to 40
    precondition {
      condition     = var.checkpoints.bucket != null || length(var.name) <= 38
      error_message = "The checkpoint bucket the module creates is named ${var.name}-checkpoints-<account id>, ${length(var.name) + 25} characters, but S3 bucket names are at most 63: give a name of at most 38 characters, or name the bucket in checkpoints.bucket."
    }
  }
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  count  = var.checkpoints.create_bucket ? 1 : 0
  bucket = aws_s3_bucket.checkpoints[0].id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  count  = var.checkpoints.create_bucket ? 1 : 0
  bucket = aws_s3_bucket.checkpoints[0].id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.checkpoints.kms_key_arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  count                   = var.checkpoints.create_bucket ? 1 : 0
  bucket                  = aws_s3_bucket.checkpoints[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "checkpoints" {
  count  = var.checkpoints.create_bucket ? 1 : 0
  bucket = aws_s3_bucket.checkpoints[0].id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  count  = var.checkpoints.create_bucket ? 1 : 0
  bucket = aws_s3_bucket.checkpoints[0].id

  rule {
    id     = "old-checkpoint-versions"
    status = "Enabled"

    filter {
      prefix = var.checkpoints.prefix
    }

    noncurrent_version_expiration {
      noncurrent_days = var.checkpoints.noncurrent_days
    }
  }

  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }

  depends_on = [aws_s3_bucket_versioning.checkpoints]
}

data "aws_iam_policy_document" "tls_only" {
  count = var.checkpoints.create_bucket && var.checkpoints.tls_only ? 1 : 0

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "checkpoints" {
  count      = var.checkpoints.create_bucket && var.checkpoints.tls_only ? 1 : 0
  bucket     = aws_s3_bucket.checkpoints[0].id
  policy     = data.aws_iam_policy_document.tls_only[0].json
  depends_on = [aws_s3_bucket_public_access_block.checkpoints]
}

# ---------------------------------------------------------------------------------------------------------------------
# Identity: the instances may read and write the checkpoint prefix and find their peers, nothing else
# ---------------------------------------------------------------------------------------------------------------------

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

# the boot script of each group (templates/user_data.sh.tftpl: the log, the watchdog, the code and environment, the
# secrets, the setup command, the rendezvous, torchrun), content-addressed under the checkpoint prefix; user_data
# fetches it and checks its sha256. Values reach the shell base64-encoded in single quotes (checkpoint URI, the
# watchdog script), single-quoted word by word (argv, resume_from), or validated to a safe alphabet (name, numbers)
locals {
  # the nodes' watch of their job (0: none), never shorter than the job's grace (which bounds a save: a save that fits
  # in it is not a hang)
  watch_s = var.watchdog.stall_s == 0 ? 0 : max(var.watchdog.stall_s, var.watchdog.grace_s)
  # and, in it, how long a job's processes may outlive every rank's script's end (a hung teardown): at most 5 min, since
  # only the interpreter's own exit is left after the mark (the exit handlers ran before it; torchrun waits 30 s for a
  # failed worker's peers), so that a launcher's after-fit limit (30 min) finds the job ended, not hung
  teardown_s = min(local.watch_s, 300)
  # and, in it, how long a training may stay silent (none under srifty launch: the launcher watches the training)
  stall_s = var.watchdog.heartbeat ? 0 : local.watch_s
  # and how long a script may stay silent once its training has finished (an export, an upload): the launcher cannot
  # see that silence, so under srifty launch too
  after_fit_s = local.watch_s == 0 ? 0 : var.watchdog.after_fit_s
  boot_scripts = { for k, g in local.groups : k => templatefile("${path.module}/templates/user_data.sh.tftpl", {
    name                 = var.name
    setup_command        = var.train.setup_command
    argv                 = local.train_argv
    nnodes               = var.train.nnodes
    weights_json         = local.mixed_asg ? jsonencode({ for t in var.groups : t.instance_type => t.weighted_capacity }) : "{}"
    units                = local.capacity_units
    nproc_per_node       = g.gpus_per_instance
    group                = k
    efa                  = g.efa
    rdzv_port            = var.train.rdzv_port
    rendezvous_timeout_s = var.train.rendezvous_timeout_s
    checkpoint_uri_b64   = base64encode("s3://${local.bucket}/${var.checkpoints.prefix}")
    code_sha256          = var.train.code == null ? "" : var.train.code.sha256
    image_b64            = var.train.image == null ? "" : base64encode(var.train.image)
    code_uri_b64         = var.train.code == null ? "" : base64encode("s3://${local.bucket}/${local.code_key}")
    resume_from          = var.train.resume_from == null ? "" : "'${replace(var.train.resume_from, "'", "'\\''")}'"
    handover             = var.train.handover
    env_count            = length(var.train.env)
    env_b64              = base64encode(jsonencode(var.train.env))
    max_life_s           = ceil(var.max_life_h * 3600)
    max_life_min         = ceil(var.max_life_h * 60)
    heartbeat            = var.watchdog.heartbeat
    watchdog_b64         = filebase64("${path.module}/templates/watchdog.sh")
    watchdog_interval_s  = var.watchdog.interval_s
    watchdog_grace_s     = var.watchdog.grace_s
    watchdog_max_age_s   = var.watchdog.max_age_s
    watch_s              = local.watch_s
    teardown_s           = local.teardown_s
    stall_s              = local.stall_s
    after_fit_s          = local.after_fit_s
    watchdog_asg         = var.capacity.mode == "asg" ? 1 : 0
    secrets              = var.secrets
    data                 = var.data
  }) }
  # one object per group (groups of the same GPU count have the same script, under their own keys)
  boot_keys = { for k, text in local.boot_scripts : k => "${var.checkpoints.prefix}boot/${var.name}/${k}-${sha256(text)}.sh" }
}

resource "aws_s3_object" "boot" {
  for_each = local.groups

  bucket       = local.bucket
  key          = local.boot_keys[each.key]
  content      = local.boot_scripts[each.key]
  content_type = "text/x-shellscript"
  # the fleet's tag only: S3 takes at most 10 tags on an object ("You can associate up to 10 tags with an object",
  # https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-tagging.html), and tags may hold 47
  tags = { "srifty:fleet" = var.name }

  depends_on = [aws_s3_bucket_server_side_encryption_configuration.checkpoints, aws_s3_bucket_policy.checkpoints]
}

# the user's code and environment (srifty terraform's snapshot): every instance fetches it and checks its sha256
resource "aws_s3_object" "code" {
  count = var.train.code == null ? 0 : 1

  bucket      = local.bucket
  key         = local.code_key
  source      = "${path.root}/${var.train.code.source}"
  source_hash = var.train.code.sha256
  tags        = { "srifty:fleet" = var.name } # S3 takes at most 10 tags on an object (above)

  depends_on = [aws_s3_bucket_server_side_encryption_configuration.checkpoints, aws_s3_bucket_policy.checkpoints]
}

resource "aws_iam_role" "instance" {
  name_prefix          = "${substr(var.name, 0, 30)}-node-"
  path                 = var.iam_path
  permissions_boundary = var.iam_permissions_boundary
  assume_role_policy   = data.aws_iam_policy_document.assume.json
  tags                 = local.fleet_tags
}

data "aws_iam_policy_document" "instance" {
  statement {
    sid       = "ListCheckpointPrefix"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [var.checkpoints.prefix, "${var.checkpoints.prefix}*"]
    }
  }

  statement {
    sid       = "ReadWriteCheckpoints"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = ["${local.bucket_arn}/${var.checkpoints.prefix}*"]
  }

  statement {
    sid       = "FindFleetPeers"
    actions   = ["ec2:DescribeInstances"]
    resources = ["*"] # DescribeInstances supports no resource-level permissions
  }

  dynamic "statement" {
    for_each = var.capacity.mode == "asg" ? [1] : []
    content {
      sid       = "FindOwnAutoScalingGroup"
      actions   = ["autoscaling:DescribeAutoScalingInstances"]
      resources = ["*"] # Describe* actions support no resource-level permissions
    }
  }

  # the watchdog takes its instance out of the fleet's Auto Scaling group (launches suspended, min 0, detach with the
  # desired capacity decremented) so that the group does not replace an instance that stopped itself; only groups of
  # this fleet
  dynamic "statement" {
    for_each = var.capacity.mode == "asg" ? [1] : []
    content {
      sid       = "LeaveOwnAutoScalingGroup"
      actions   = ["autoscaling:SuspendProcesses", "autoscaling:DetachInstances"]
      resources = ["arn:${data.aws_partition.current.partition}:autoscaling:*:${data.aws_caller_identity.current.account_id}:autoScalingGroup:*:autoScalingGroupName/${var.name}-*"]

      condition {
        test     = "StringEquals"
        variable = "autoscaling:ResourceTag/srifty:fleet"
        values   = [var.name]
      }
    }
  }

  # the watchdog's one update is the minimum size to 0 (so that it may leave): nothing on the node (the job's own
  # code, its dependencies) may raise the group's size with the role. The Service Authorization Reference lists
  # autoscaling:MinSize, MaxSize and DesiredCapacity as numeric condition keys of UpdateAutoScalingGroup; Null true:
  # the request does not set them
  dynamic "statement" {
    for_each = var.capacity.mode == "asg" ? [1] : []
    content {
      sid       = "LowerOwnAutoScalingGroupMinimum"
      actions   = ["autoscaling:UpdateAutoScalingGroup"]
      resources = ["arn:${data.aws_partition.current.partition}:autoscaling:*:${data.aws_caller_identity.current.account_id}:autoScalingGroup:*:autoScalingGroupName/${var.name}-*"]

      condition {
        test     = "StringEquals"
        variable = "autoscaling:ResourceTag/srifty:fleet"
        values   = [var.name]
      }

      condition {
        test     = "NumericEquals"
        variable = "autoscaling:MinSize"
        values   = ["0"]
      }

      condition {
        test     = "Null"
        variable = "autoscaling:MaxSize"
        values   = ["true"]
      }

      condition {
        test     = "Null"
        variable = "autoscaling:DesiredCapacity"
        values   = ["true"]
      }
    }
  }

  # --secret-env: exactly the named parameters and secrets (a secret name matches its ARN's random 6-character suffix)
  dynamic "statement" {
    for_each = length(local.ssm_secret_arns) > 0 ? [1] : []
    content {
      sid       = "ReadNamedParameters"
      actions   = ["ssm:GetParameter"]
      resources = local.ssm_secret_arns
    }
  }

  dynamic "statement" {
    for_each = length(local.sm_secret_arns) > 0 ? [1] : []
    content {
      sid       = "ReadNamedSecrets"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = local.sm_secret_arns
    }
  }

  # --data / --data-copy: list exactly each data folder (a whole bucket: the bucket) and read the objects under it; no
  # write, no delete. S3 authorizes a ListObjectsV2 of the folder by s3:prefix (the S3 User Guide's "Amazon S3
  # condition key examples"), which the boot's check and copy send as the folder itself
  dynamic "statement" {
    for_each = { for i, d in local.data : i => d }
    content {
      sid       = "ListData${statement.key}"
      actions   = ["s3:ListBucket"]
      resources = ["arn:${data.aws_partition.current.partition}:s3:::${statement.value.bucket}"]

      dynamic "condition" {
        for_each = statement.value.prefix == "" ? [] : [1]
        content {
          test     = "StringLike"
          variable = "s3:prefix"
          values   = [statement.value.prefix, "${statement.value.prefix}*"]
        }
      }
    }
  }

  dynamic "statement" {
    for_each = length(local.data) > 0 ? [1] : []
    content {
      sid       = "ReadData"
      actions   = ["s3:GetObject"]
      resources = distinct([for d in local.data : "arn:${data.aws_partition.current.partition}:s3:::${d.bucket}/${d.prefix}*"])
    }
  }

  # customer-managed keys, each decrypted through its service only: a data bucket's through S3, and --secret-env's
  # through SSM and Secrets Manager ("any principal that retrieves the decrypted value must have kms:Decrypt permission
  # on that key", https://docs.aws.amazon.com/systems-manager/latest/userguide/ps-restrict-decryption.html)
  dynamic "statement" {
    for_each = {
      for sid, d in {
        DecryptData    = { keys = var.data_kms_key_arns, via = ["s3.*.amazonaws.com"] }
        DecryptSecrets = { keys = var.secret_kms_key_arns, via = ["ssm.*.amazonaws.com", "secretsmanager.*.amazonaws.com"] }
      } : sid => d if length(d.keys) > 0
    }
    content {
      sid       = statement.key
      actions   = ["kms:Decrypt"]
      resources = statement.value.keys

      condition {
        test     = "StringLike"
        variable = "kms:ViaService"
        values   = statement.value.via
      }
    }
  }

  dynamic "statement" {
    for_each = var.checkpoints.kms_key_arn != null ? [1] : []
    content {
      sid       = "CheckpointKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [var.checkpoints.kms_key_arn]

      # through S3 only, as the data keys are: the bucket's SSE-KMS is the key's one use here
      condition {
        test     = "StringLike"
        variable = "kms:ViaService"
        values   = ["s3.*.amazonaws.com"]
      }
    }
  }
}

resource "aws_iam_role_policy" "instance" {
  name_prefix = "checkpoints-"
  role        = aws_iam_role.instance.id
  policy      = data.aws_iam_policy_document.instance.json

  lifecycle {
    # "Role policy size cannot exceed 10,240 characters" for a role's inline policies together, white space not
    # counted (IAM and AWS STS quotas, https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html);
    # each data folder adds a statement and each secret a resource. moto takes any size
    precondition {
      condition     = local.inline_policy_chars <= 10240
      error_message = "The instance role's inline policies come to ${local.inline_policy_chars} characters (white space not counted), but IAM allows a role 10,240 in all: give fewer data folders (a common parent folder lists and reads what they do) or fewer secrets."
    }
  }
}

# Session Manager only when asked (enable_ssm): the actions the SSM Agent needs to register and open a session,
# "Step 2: Verify or add instance permissions for Session Manager",
# https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-getting-started-instance-profile.html;
# not AmazonSSMManagedInstanceCore, which also grants ssm:GetParameter* on every parameter of the account
data "aws_iam_policy_document" "ssm_session" {
  count = var.enable_ssm ? 1 : 0
  # checkov:skip=CKV_AWS_111:The ssmmessages channel actions of Session Manager support no resource-level permissions; they open a session channel only for the instance calling them and read no data.
  # checkov:skip=CKV_AWS_356:Only the ssmmessages channel actions (no resource types in the service authorization reference) have resources = "*"; ssm:UpdateInstanceInformation is limited to this account's instances in this region.

  statement {
    sid       = "SessionManagerRegister"
    actions   = ["ssm:UpdateInstanceInformation"]
    resources = ["${local.arn_prefix}:ec2:${local.account_region}:instance/*"]
  }

  statement {
    sid = "SessionManagerChannels"
    actions = [
      "ssmmessages:CreateControlChannel",
      "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel",
      "ssmmessages:OpenDataChannel",
    ]
    resources = ["*"] # these actions support no resource-level permissions
  }
}

locals {
  inline_policy_chars = length(replace(data.aws_iam_policy_document.instance.json, "/\\s/", "")) + (var.enable_ssm ? length(replace(data.aws_iam_policy_document.ssm_session[0].json, "/\\s/", "")) : 0)
}

resource "aws_iam_role_policy" "ssm_session" {
  count       = var.enable_ssm ? 1 : 0
  name_prefix = "ssm-session-"
  role        = aws_iam_role.instance.id
  policy      = data.aws_iam_policy_document.ssm_session[0].json
}

resource "aws_iam_role_policy_attachment" "cloudwatch" {
  count      = var.enable_cloudwatch ? 1 : 0
  role       = aws_iam_role.instance.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/CloudWatchAgentServerPolicy"
}

resource "aws_iam_instance_profile" "instance" {
  name_prefix = "${substr(var.name, 0, 30)}-node-"
  path        = var.iam_path
  role        = aws_iam_role.instance.name
  tags        = local.fleet_tags
}

# ---------------------------------------------------------------------------------------------------------------------
# Capacity: one launch template per instance type, bought by an Auto Scaling group or EC2 Fleets
# ---------------------------------------------------------------------------------------------------------------------

resource "aws_launch_template" "group" {
  for_each = local.groups
  # checkov:skip=CKV_AWS_88:Only with network.create_vpc and one interface per instance (a minimal VPC without NAT gateway) do instances get a public IP, for egress; inbound stays limited to the fleet and ssh_cidr_blocks. Pass private subnets with a NAT to avoid it.

  name_prefix            = "${var.name}-${replace(each.key, ".", "-")}-"
  description            = "${var.name}: ${each.key}, ${each.value.gpus_per_instance} GPU(s) per node"
  image_id               = local.group_image[each.key]
  instance_type          = each.key
  key_name               = var.key_name
  update_default_version = true
  ebs_optimized          = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.instance.arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = var.metadata_hop_limit
    instance_metadata_tags      = var.metadata_tags ? "enabled" : "disabled"
  }

  monitoring {
    enabled = true
  }

  # an EC2 Fleet takes its instances' placement group from the launch template (its overrides have none); an Auto
  # Scaling group is given its own (placement_group below)
  dynamic "placement" {
    for_each = var.capacity.mode == "fleet" && var.capacity.placement_group ? [aws_placement_group.this[0].name] : []
    content {
      group_name = placement.value
    }
  }

  # the image's own root device (the Ubuntu Deep Learning AMIs' /dev/sda1, Amazon Linux's /dev/xvda): a mapping of
  # another name adds a volume and leaves the root at the image's size and encryption ("Block device mappings",
  # Amazon EC2 User Guide: the root's entry takes the AMI's root device name; a trial's --ami)
  block_device_mappings {
    device_name = data.aws_ami.image[local.group_image[each.key]].root_device_name

    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.checkpoints.kms_key_arn
      delete_on_termination = true
    }
  }

  # one interface per network card: with efa, every EFA interface the type supports (p4d.24xlarge 4, p5.48xlarge 32),
  # which is the bandwidth the predictor assumed; "Maximize network bandwidth on accelerated instance types",
  # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html
  dynamic "network_interfaces" {
    for_each = range(each.value.efa ? each.value.network_interfaces : 1)
    content {
      network_card_index          = network_interfaces.value
      device_index                = network_interfaces.value == 0 ? 0 : 1
      security_groups             = [aws_security_group.fleet.id]
      delete_on_termination       = true
      interface_type              = each.value.efa ? "efa" : null
      associate_public_ip_address = var.network.create_vpc && !local.private ? true : null
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.fleet_tags, { Name = "${var.name}-${each.key}", "srifty:group" = each.key })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.fleet_tags, { "srifty:group" = each.key })
  }

  # the interfaces too (an EFA node has one per network card): a team's cost and clean-up reports go by tags, and an
  # interface left by a failed launch is found by them ("instance | volume | network-interface |
  # spot-instances-request", LaunchTemplateTagSpecificationRequest, Amazon EC2 API Reference:
  # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_LaunchTemplateTagSpecificationRequest.html)
  tag_specifications {
    resource_type = "network-interface"
    tags          = merge(local.fleet_tags, { "srifty:group" = each.key })
  }

  # the instance terminates when it shuts itself down (the watchdog, the life cap): nothing is left stopped and billing
  # for its volumes, and an Auto Scaling group sees it gone
  instance_initiated_shutdown_behavior = "terminate"

  # EC2 takes at most 16,384 bytes of user data (raw, before base64: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html),
  # and the boot script with its watchdog, secrets, handover and setup command can pass that: user_data is a small
  # fixed first stage (templates/boot.sh.tftpl) that arms the life cap, fetches this group's boot script from the
  # bucket, checks its sha256 and runs it
  user_data = base64encode(templatefile("${path.module}/templates/boot.sh.tftpl", {
    name         = var.name
    max_life_min = ceil(var.max_life_h * 60)
    boot_uri_b64 = base64encode("s3://${local.bucket}/${local.boot_keys[each.key]}")
    boot_sha256  = sha256(local.boot_scripts[each.key])
  }))

  tags = local.fleet_tags

  lifecycle {
    # "You can specify a volume size that is equal to or larger than the snapshot size" (EbsBlockDevice, Amazon EC2
    # API Reference: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html): a root volume
    # smaller than the image's root snapshot fails every launch (InvalidBlockDeviceMapping), which moto launches
    precondition {
      condition     = var.root_volume_gb >= local.image_root_gb[each.key]
      error_message = "The root volume (root_volume_gb = ${var.root_volume_gb} GiB) is smaller than the root snapshot of ${each.key}'s image ${local.group_image[each.key]} (${local.image_root_gb[each.key]} GiB): EC2 refuses every launch of it. Give a root_volume_gb of at least ${local.image_root_gb[each.key]} (srifty terraform --root-volume-gb)."
    }

    # with tags in the instance metadata, "instance tag keys are subject to specific restrictions. Non-compliance will
    # result in failed launches for new instances" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/work-with-tags-in-IMDS.html):
    # letters, digits and + - = . , _ : @, no spaces or /, not . or .. or _index. moto launches them all
    precondition {
      condition     = !var.metadata_tags || length(local.imds_bad_tag_keys) == 0
      error_message = "With metadata_tags, EC2 fails every launch of an instance whose tag key has a space or a / or a character other than letters, digits and + - = . , _ : @ (or is . or .. or _index), and these are: ${join(", ", [for k in local.imds_bad_tag_keys : format("%q", k)])}. Rename them in tags, or leave metadata_tags false."
    }

    precondition {
      condition     = var.ami.id == null || length(distinct([for g in var.groups : g.arch])) == 1
      error_message = "The ami.id is one image for every group, but the groups mix x86_64 and arm64 types: leave ami.id null (the Deep Learning AMI of each architecture) or keep the fleet to one architecture."
    }

    precondition {
      condition     = local.nodes <= var.limits.max_instances
      error_message = "The groups add up to ${local.nodes} instances, more than limits.max_instances (${var.limits.max_instances}): lower the counts or raise the limit (srifty terraform --max-instances)."
    }

    precondition {
      condition     = var.limits.max_hourly_usd == null || var.predicted == null ? true : var.predicted.usd_per_hour <= var.limits.max_hourly_usd
      error_message = "The fleet costs more per hour (predicted.usd_per_hour) than limits.max_hourly_usd: choose a cheaper fleet or raise the limit (srifty terraform --max-hourly)."
    }
  }
}

resource "aws_autoscaling_group" "fleet" {
  count = var.capacity.mode == "asg" ? 1 : 0
  # no instance boots before its code and boot script are in the bucket, nor before S3's route through its endpoint
  depends_on = [aws_s3_object.code, aws_s3_object.boot, aws_vpc_endpoint.s3]

  name_prefix               = "${var.name}-"
  vpc_zone_identifier       = local.asg_subnets
  desired_capacity          = local.capacity_units
  min_size                  = local.capacity_units
  max_size                  = local.capacity_units
  desired_capacity_type     = "units"
  capacity_rebalance        = var.capacity.capacity_rebalance
  placement_group           = var.capacity.placement_group ? aws_placement_group.this[0].id : null
  wait_for_capacity_timeout = "0"

  mixed_instances_policy {
    instances_distribution {
      on_demand_allocation_strategy            = "prioritized"
      on_demand_base_capacity                  = var.capacity.on_demand_base_capacity
      on_demand_percentage_above_base_capacity = var.capacity.on_demand_percentage_above_base
      spot_allocation_strategy                 = var.capacity.spot_allocation_strategy
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.group[var.groups[0].instance_type].id
        version            = "$Latest"
      }

      dynamic "override" {
        for_each = var.groups
        content {
          instance_type     = override.value.instance_type
          weighted_capacity = tostring(override.value.weighted_capacity)

          launch_template_specification {
            launch_template_id = aws_launch_template.group[override.value.instance_type].id
            version            = "$Latest"
          }
        }
      }
    }
  }

  dynamic "tag" {
    for_each = local.fleet_tags
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}

resource "aws_ec2_fleet" "group" {
  for_each   = var.capacity.mode == "fleet" ? local.groups : {}
  depends_on = [aws_s3_object.code, aws_s3_object.boot, aws_vpc_endpoint.s3] # code and boot script in the bucket, S3's route

  type                = "instant"
  terminate_instances = true

  launch_template_config {
    launch_template_specification {
      launch_template_id = aws_launch_template.group[each.key].id
      version            = aws_launch_template.group[each.key].latest_version
    }

    override {
      instance_type = each.key
      subnet_id     = local.subnet_ids[0]
    }
  }

  target_capacity_specification {
    default_target_capacity_type = each.value.spot > 0 ? "spot" : "on-demand"
    total_target_capacity        = each.value.on_demand + each.value.spot
    on_demand_target_capacity    = each.value.on_demand
    spot_target_capacity         = each.value.spot
  }

  spot_options {
    allocation_strategy = replace(var.capacity.spot_allocation_strategy, "-prioritized", "")
  }

  on_demand_options {
    allocation_strategy = "lowestPrice"
  }

  tags = local.fleet_tags
}

data "aws_instances" "fleet" {
  instance_tags = { "srifty:fleet" = var.name }

  instance_state_names = ["pending", "running"]
  depends_on           = [aws_autoscaling_group.fleet, aws_ec2_fleet.group]
}
