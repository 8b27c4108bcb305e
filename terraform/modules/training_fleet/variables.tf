variable "name" {
  description = "Name of the training run; prefixes every resource and tags every instance (srifty:fleet = name). 3 to 40 characters, at most 38 when the module names the checkpoint bucket after it (<name>-checkpoints-<account id>: S3 takes 63)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$", var.name))
    error_message = "The name must be 3 to 40 characters of lower-case letters, digits and hyphens, starting and ending with a letter or digit, because it becomes part of an S3 bucket name."
  }
}

variable "network" {
  description = "Where the fleet runs: an existing VPC and subnets, or (create_vpc = true) a minimal VPC with one public subnet in availability_zone or availability_zone_id (default: AWS picks)."
  type = object({
    create_vpc        = optional(bool, false)
    vpc_id            = optional(string)
    subnet_ids        = optional(list(string), [])
    vpc_cidr          = optional(string, "10.42.0.0/16")
    availability_zone = optional(string)
    # a zone ID (use1-az1) names the same physical zone in every account; srifty terraform sets the one whose spot
    # price the plan used
    availability_zone_id = optional(string)
  })
  default = { create_vpc = true }

  validation {
    condition     = var.network.availability_zone == null || var.network.availability_zone_id == null
    error_message = "Give network.availability_zone (a name, us-east-1a) or network.availability_zone_id (an ID, use1-az1), not both."
  }

  validation {
    condition     = var.network.create_vpc || (var.network.vpc_id != null && length(var.network.subnet_ids) > 0)
    error_message = "Give network.vpc_id and at least one network.subnet_ids entry, or set network.create_vpc = true to create a minimal VPC."
  }

  validation {
    condition     = can(cidrhost(var.network.vpc_cidr, 0))
    error_message = "The network.vpc_cidr must be an IPv4 CIDR block such as 10.42.0.0/16."
  }

  # EC2's resource IDs: the prefix and 8 or 17 hexadecimal characters
  # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html)
  validation {
    condition = (
      (var.network.vpc_id == null || can(regex("^vpc-([0-9a-f]{8}|[0-9a-f]{17})$", var.network.vpc_id)))
      && alltrue([for s in var.network.subnet_ids : can(regex("^subnet-([0-9a-f]{8}|[0-9a-f]{17})$", s))])
    )
    error_message = "The network.vpc_id must be a VPC ID (vpc- and 8 or 17 hexadecimal characters, e.g. vpc-0a1b2c3d4e5f67890) and each network.subnet_ids entry a subnet ID (subnet-0a1b2c3d4e5f67890): the AWS console's VPC and Subnets pages list them."
  }
}

variable "ssh_cidr_blocks" {
  description = "IPv4 CIDR blocks allowed to reach the instances on port 22, in canonical form (network address, no leading zeros). Empty (the default) opens no SSH port at all. Together they may cover at most a /8 worth of addresses (2^24) unless allow_wide_ssh, and never every IPv4 address."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([for c in var.ssh_cidr_blocks : (
      can(regex("^(0|[1-9][0-9]{0,2})([.](0|[1-9][0-9]{0,2})){3}/(0|[1-9]|[12][0-9]|3[0-2])$", c))
      && can(cidrhost(c, 0)) && try("${cidrhost(c, 0)}/${split("/", c)[1]}" == c, false)
    )])
    error_message = "Every ssh_cidr_blocks entry must be an IPv4 CIDR block in canonical form, the network address and a prefix length of 0 to 32 without leading zeros, such as 203.0.113.7/32 for one office address or 203.0.113.0/24."
  }

  validation {
    # the sum over-counts overlapping blocks; srifty terraform writes their collapsed union
    condition     = !contains(var.ssh_cidr_blocks, "0.0.0.0/0") && (!alltrue([for c in var.ssh_cidr_blocks : can(regex("/([0-9]+)$", c))]) || sum(concat([0], [for c in var.ssh_cidr_blocks : pow(2, 32 - tonumber(try(split("/", c)[1], "32")))])) <= (var.allow_wide_ssh ? pow(2, 32) - 1 : pow(2, 24)))
    error_message = "The ssh_cidr_blocks together cover more than a /8 worth of IPv4 addresses (2^24), or all of them: narrow them to your own networks, or set allow_wide_ssh = true (srifty terraform --allow-wide-ssh) for up to everything but 0.0.0.0/0."
  }
}

variable "allow_wide_ssh" {
  description = "Let ssh_cidr_blocks cover more than a /8 worth of addresses (never every IPv4 address)."
  type        = bool
  default     = false
}

variable "key_name" {
  description = "EC2 key pair for SSH, or null for none."
  type        = string
  default     = null
}

variable "groups" {
  description = "The instance types of the fleet, from the plan: how many of each are bought on demand and on spot, GPUs per instance (processes per node), the capacity units one instance counts for (its predicted throughput), the CPU architecture (x86_64 or arm64, which picks the image), whether to attach EFA and on how many network cards (one EFA interface per card: 4 on p4d.24xlarge, 32 on p5.48xlarge)."
  type = list(object({
    instance_type      = string
    on_demand          = number
    spot               = number
    gpus_per_instance  = number
    weighted_capacity  = number
    arch               = optional(string, "x86_64")
    efa                = optional(bool, false)
    network_interfaces = optional(number, 1)
  }))

  validation {
    condition     = length(var.groups) >= 1 && length(var.groups) <= 20
    error_message = "Give between 1 and 20 instance type groups."
  }

  validation {
    condition     = alltrue([for g in var.groups : g.on_demand >= 0 && g.spot >= 0 && g.on_demand + g.spot >= 1 && floor(g.on_demand) == g.on_demand && floor(g.spot) == g.spot])
    error_message = "Every group needs whole, non-negative on_demand and spot counts adding up to at least one instance."
  }

  validation {
    condition     = alltrue([for g in var.groups : g.weighted_capacity >= 1 && g.weighted_capacity <= 999 && floor(g.weighted_capacity) == g.weighted_capacity])
    error_message = "Every group's weighted_capacity must be a whole number from 1 to 999 (an Auto Scaling group limit); srifty terraform scales the predicted throughput into that range."
  }

  validation {
    condition     = alltrue([for g in var.groups : contains(["x86_64", "arm64"], g.arch)])
    error_message = "Every group's arch must be x86_64 or arm64 (Graviton types such as g5g.xlarge are arm64); it picks the machine image."
  }

  validation {
    condition     = alltrue([for g in var.groups : g.network_interfaces >= 1 && g.network_interfaces <= 32 && floor(g.network_interfaces) == g.network_interfaces && (g.efa || g.network_interfaces == 1)])
    error_message = "Every group's network_interfaces must be a whole number from 1 to 32, and 1 unless efa is true (one EFA interface per network card, up to the type's EfaInfo.MaximumEfaInterfaces)."
  }

  validation {
    condition     = alltrue([for g in var.groups : can(regex("^[a-z0-9][a-z0-9-]*\\.[a-z0-9-]+$", g.instance_type))])
    error_message = "Every group's instance_type must be an EC2 instance type such as g5.xlarge (family.size, lower-case letters, digits and dashes): it names the group's launch template and each node's plan group."
  }

  validation {
    condition     = length(distinct([for g in var.groups : g.instance_type])) == length(var.groups)
    error_message = "Each instance type may appear in only one group: merge the counts of repeated types."
  }
}

variable "capacity" {
  description = "How the fleet is bought. mode asg: an Auto Scaling group with a mixed instances policy whose capacity is counted in throughput units; mode fleet: a one-shot EC2 Fleet of type instant with exact counts per type. The on-demand base and percentage apply to asg mode. capacity_rebalance (default false) lets the group replace a spot node on a rebalance recommendation while it trains: a synchronous job's nodes then meet a stranger at the rendezvous and lose a node with no spot notice; off, the job checkpoints on the recommendation and leaves on the two-minute notice."
  type = object({
    mode                            = optional(string, "asg")
    spot_allocation_strategy        = optional(string, "price-capacity-optimized")
    on_demand_base_capacity         = optional(number, 0)
    on_demand_percentage_above_base = optional(number, 0)
    capacity_rebalance              = optional(bool, false)
    placement_group                 = optional(bool, false)
  })
  default = {}

  validation {
    condition     = contains(["asg", "fleet"], var.capacity.mode)
    error_message = "The capacity.mode must be \"asg\" (Auto Scaling group, mixed instances policy) or \"fleet\" (EC2 Fleet of type instant)."
  }

  validation {
    condition     = contains(["price-capacity-optimized", "capacity-optimized", "lowest-price", "capacity-optimized-prioritized"], var.capacity.spot_allocation_strategy)
    error_message = "The capacity.spot_allocation_strategy must be price-capacity-optimized (recommended), capacity-optimized, capacity-optimized-prioritized or lowest-price."
  }

  validation {
    condition     = var.capacity.on_demand_percentage_above_base >= 0 && var.capacity.on_demand_percentage_above_base <= 100 && var.capacity.on_demand_base_capacity >= 0
    error_message = "The capacity.on_demand_percentage_above_base must be between 0 and 100, and capacity.on_demand_base_capacity at least 0."
  }
}

variable "ami" {
  description = "The machine image: an AMI id for every group (all of one architecture; its image must bring PyTorch or train.setup_command must install it), or (id = null) per architecture the public SSM parameter of the AWS Deep Learning AMI with PyTorch to resolve at plan time (https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html)."
  type = object({
    id = optional(string)
    ssm_parameters = optional(map(string), {
      x86_64 = "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id"
      arm64  = "/aws/service/deeplearning/ami/arm64/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id"
    })
  })
  default = {}

  validation {
    condition     = alltrue([for a in ["x86_64", "arm64"] : contains(keys(var.ami.ssm_parameters), a)])
    error_message = "The ami.ssm_parameters map must name an SSM parameter for both x86_64 and arm64."
  }
}

variable "root_volume_gb" {
  description = "Size of each instance's encrypted gp3 root volume, in GiB (the Deep Learning AMI needs at least 75)."
  type        = number
  default     = 200

  validation {
    condition     = var.root_volume_gb >= 30 && var.root_volume_gb <= 16384
    error_message = "The root_volume_gb must be between 30 and 16384 GiB."
  }
}

variable "metadata_hop_limit" {
  description = "IMDSv2 response hop limit: 1 (the default) for training on the instance, and in the container of train.image (it runs on the host's network); 2 for a container on a bridge network of its own that must reach the instance metadata."
  type        = number
  default     = 1

  validation {
    condition     = var.metadata_hop_limit >= 1 && var.metadata_hop_limit <= 64
    error_message = "The metadata_hop_limit must be between 1 and 64."
  }
}

variable "checkpoints" {
  description = "Where checkpoints live: a new bucket (create_bucket = true, named <name>-checkpoints-<account id> unless bucket is given) or an existing bucket; the instances may only touch keys under prefix. tls_only (default true): the new bucket's policy refuses requests without TLS; srifty terraform sets false only for an emulator reached over plain http:// (--aws-endpoint), where the boot scripts' upload would otherwise be refused; AWS's own endpoints are all https."
  type = object({
    create_bucket   = optional(bool, true)
    bucket          = optional(string)
    prefix          = optional(string, "checkpoints/")
    force_destroy   = optional(bool, false)
    kms_key_arn     = optional(string)
    noncurrent_days = optional(number, 30)
    tls_only        = optional(bool, true)
  })
  default = {}

  validation {
    condition     = var.checkpoints.create_bucket || var.checkpoints.bucket != null
    error_message = "Give checkpoints.bucket (an existing bucket) or set checkpoints.create_bucket = true."
  }

  validation {
    condition     = length(var.checkpoints.prefix) <= 512 && can(regex("^([A-Za-z0-9_-][A-Za-z0-9._-]*/)+$", var.checkpoints.prefix))
    error_message = "The checkpoints.prefix must be folders of letters, digits, '.', '_' and '-' (not starting with '.'), each ending with a slash, at most 512 characters, such as checkpoints/run-1/: it reaches the instances' shell and their IAM policy (where * would be a wildcard)."
  }

  validation {
    # S3's bucket naming rules, https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html
    # one rule per list entry: checkov's HCL parser cannot read an expression continued by a leading &&
    condition = var.checkpoints.bucket == null ? true : alltrue([
      can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.checkpoints.bucket)),
      !strcontains(var.checkpoints.bucket, ".."),
      !can(regex("^[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+$", var.checkpoints.bucket)),
      !anytrue([for p in ["xn--", "sthree-", "amzn-s3-demo-"] : startswith(var.checkpoints.bucket, p)]),
      !anytrue([for x in ["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"] : endswith(var.checkpoints.bucket, x)]),
    ])
    error_message = "The checkpoints.bucket must be a valid S3 bucket name: 3 to 63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit, no two adjacent dots, not an IP address, not starting with xn--, sthree- or amzn-s3-demo-, not ending with -s3alias, --ol-s3, .mrap, --x-s3 or --table-s3."
  }

  validation {
    # the key is the resource of the instance role's kms statement, and "when an alias is the value of a resource
    # element, the policy applies to the alias resource, not to any KMS key" (AWS KMS Developer Guide,
    # https://docs.aws.amazon.com/kms/latest/developerguide/alias-authorization.html): the nodes could not use it
    condition     = var.checkpoints.kms_key_arn == null ? true : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", var.checkpoints.kms_key_arn))
    error_message = "The checkpoints.kms_key_arn must be a KMS key ARN, arn:aws:kms:<region>:<account>:key/<key id>: the instance role is granted the key, and a grant to an alias grants no key (aws kms describe-key of the alias prints its key's ARN)."
  }
}

variable "enable_ssm" {
  description = "Let the instances register with SSM Session Manager (shell access without an SSH port): an inline policy of ssm:UpdateInstanceInformation and the four ssmmessages channel actions, nothing else (no ssm:GetParameter*, unlike AmazonSSMManagedInstanceCore). Off by default: the instances need no SSM permission (the Deep Learning AMI id is resolved by Terraform at plan time, with the operator's credentials)."
  type        = bool
  default     = false
}

variable "secrets" {
  description = "Environment variables the instances read at boot, before setup_command: name (exported, [A-Z_][A-Z0-9_]*), source (ssm: a Parameter Store parameter, read with decryption; secretsmanager: a secret's SecretString) and id (the parameter name, or the secret's name or ARN). Only names reach Terraform; the instance role may read exactly these parameters and secrets."
  type = list(object({
    name   = string
    source = string
    id     = string
  }))
  default = []

  validation {
    condition     = alltrue([for s in var.secrets : can(regex("^[A-Z_][A-Z0-9_]*$", s.name)) && !can(regex("^(PATH|HOME|IFS|SHELL|USER|PWD|OLDPWD|HOSTNAME|TERM|LANG|LC_.*|TMPDIR|TOKEN|IMDS|REGION|STATE|JOB|CODE|LOG|LOG_URI|URI|BOOT|ATTEMPTS|APT|BORN|CHECKPOINT_URI|DATA_HOME|DATA_JOBS|DEBIAN_FRONTEND|DEVICES|EFA_.*|ENDED|EXITED_URI|EXPORTS|FS|GONE|HANDOVER|HOUSE|HUNG_.*|IMAGE|INSTANCE_ID|LAUNCHED|LIFE_.*|LISTED|LIVE|MY_IP|NET|NNODES|NVME|OFI|OUTPUTS_.*|PEERS|PEERWATCH_PID|PER_BOOT|PICK|RAW|RDZV_HOST|RDZV_ID|READY_URI|REQ|SELF|SHIP_PID|STALLWATCH_PID|TEE_PID|VENV|VERDICT|WAIT_UNTIL|WHY|WHEEL|WHEELHOUSE.*|LD_.*|BASH.*|AWS_.*|SRIFTY_.*|PL_.*|LT_.*|TORCH_.*|TORCHELASTIC_.*|PET_.*|NCCL_.*|FI_.*|CUDA_.*|NVIDIA_.*|PYTHON.*|OMP_.*|MKL_.*|KMP_.*|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_NAME|ROLE_RANK|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|NODE_RANK)$", s.name)) && contains(["ssm", "secretsmanager"], s.source)]) && length(distinct([for s in var.secrets : s.name])) == length(var.secrets)
    error_message = "Every secrets entry needs a distinct name of [A-Z_][A-Z0-9_]* (it is exported on the instances), not one the boot script, AWS's tools or srifty use (PATH, REGION, LOG, AWS_*, SRIFTY_*, ...), and a source of ssm or secretsmanager."
  }

  validation {
    condition = alltrue([for s in var.secrets : s.source == "ssm" ? (length(s.id) <= 2048 && can(regex("^/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", s.id))) : (
      can(regex("^[A-Za-z0-9/_+=.@-]{1,512}$", s.id)) || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}$", s.id))
    )])
    error_message = "Every secrets id must be an SSM parameter name (letters, digits, _ . - and /) or a Secrets Manager secret name (letters, digits, / _ + = . @ -) or ARN."
  }
}

variable "data" {
  description = "Training data the instances read from S3, read-only: name (an environment variable every instance exports, [A-Z_][A-Z0-9_]*, not one the boot script or AWS's tools use), uri (an S3 folder, s3://bucket/prefix/, or a whole bucket, s3://bucket/), copy (false: the job reads from S3 itself and name holds the uri, after the boot checks that the role can list it; true: every instance copies the folder to its own disk (the instance store when it is mounted at /opt/dlami/nvme, else /opt/srifty/data/<name>) while its environment installs, and is ready to train only once the copy is whole; name then holds that path). The instance role may list exactly these folders and read the objects under them; it may write nothing there. A bucket of another account must also grant the role in its bucket policy. A copy must fit on that disk (the root volume: root_volume_gb) and within train.rendezvous_timeout_s of the first node's readiness, or the nodes that were ready first give up."
  type = list(object({
    name = string
    uri  = string
    copy = optional(bool, false)
  }))
  default = []

  validation {
    condition     = alltrue([for d in var.data : can(regex("^[A-Z_][A-Z0-9_]*$", d.name)) && !can(regex("^(PATH|HOME|IFS|SHELL|USER|PWD|OLDPWD|HOSTNAME|TERM|LANG|LC_.*|TMPDIR|TOKEN|IMDS|REGION|STATE|JOB|CODE|LOG|LOG_URI|URI|BOOT|ATTEMPTS|APT|BORN|CHECKPOINT_URI|DATA_HOME|DATA_JOBS|DEBIAN_FRONTEND|DEVICES|EFA_.*|ENDED|EXITED_URI|EXPORTS|FS|GONE|HANDOVER|HOUSE|HUNG_.*|IMAGE|INSTANCE_ID|LAUNCHED|LIFE_.*|LISTED|LIVE|MY_IP|NET|NNODES|NVME|OFI|OUTPUTS_.*|PEERS|PEERWATCH_PID|PER_BOOT|PICK|RAW|RDZV_HOST|RDZV_ID|READY_URI|REQ|SELF|SHIP_PID|STALLWATCH_PID|TEE_PID|VENV|VERDICT|WAIT_UNTIL|WHY|WHEEL|WHEELHOUSE.*|LD_.*|BASH.*|AWS_.*|SRIFTY_.*|PL_.*|LT_.*|TORCH_.*|TORCHELASTIC_.*|PET_.*|NCCL_.*|FI_.*|CUDA_.*|NVIDIA_.*|PYTHON.*|OMP_.*|MKL_.*|KMP_.*|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_NAME|ROLE_RANK|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|NODE_RANK)$", d.name))]) && length(distinct([for d in var.data : d.name])) == length(var.data)
    error_message = "Every data entry needs a distinct name of [A-Z_][A-Z0-9_]* (it is exported on the instances), not one the boot script, AWS's tools or srifty use (PATH, REGION, LOG, AWS_*, SRIFTY_*, ...): such as TRAIN_DATA."
  }

  validation {
    # a folder of S3's safe characters and = + @ , (partitions such as year=2026/), ending with a slash: no * or ?,
    # which the instance role's policy would read as wildcards, no $ (an IAM policy variable)
    condition     = alltrue([for d in var.data : length(d.uri) <= 1024 && can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([A-Za-z0-9!_.()'=+@,-]+/)*$", d.uri))])
    error_message = "Every data uri must be an S3 folder, s3://bucket/ or s3://bucket/prefix/ ending with a slash, of letters, digits and ! _ . ( ) ' = + @ , - (no * or ?, which the instance role's policy reads as wildcards)."
  }

}

variable "secret_kms_key_arns" {
  description = "The customer-managed KMS keys the secrets' parameters and secrets are encrypted with, if any (AWS's own aws/ssm and aws/secretsmanager keys need none; a secret of another account always has one): the instance role may decrypt with them through SSM and Secrets Manager only (kms:ViaService), never directly."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for k in var.secret_kms_key_arns : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", k))])
    error_message = "Every secret_kms_key_arns entry must be a KMS key ARN, arn:aws:kms:<region>:<account>:key/<key id> (an alias cannot be granted)."
  }
}

variable "data_kms_key_arns" {
  description = "The customer-managed KMS keys the data buckets encrypt with (SSE-KMS), if any: the instance role may decrypt with them through S3 only (kms:ViaService s3.*), never directly."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for k in var.data_kms_key_arns : can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", k))])
    error_message = "Every data_kms_key_arns entry must be a KMS key ARN, arn:aws:kms:<region>:<account>:key/<key id> (an alias cannot be granted)."
  }
}

variable "iam_permissions_boundary" {
  description = "ARN of a managed policy set as the permissions boundary of the instance role (organisations whose service control policies require one on every role they create). Null: none."
  type        = string
  default     = null

  validation {
    condition     = var.iam_permissions_boundary == null || can(regex("^arn:aws[a-z-]*:iam::([0-9]{12}|aws):policy/.+$", var.iam_permissions_boundary))
    error_message = "The iam_permissions_boundary must be a managed policy's ARN, e.g. arn:aws:iam::123456789012:policy/team-boundary."
  }
}

variable "iam_path" {
  description = "IAM path of the instance role and its instance profile (an organisation's convention, e.g. /ml/)."
  type        = string
  default     = "/"

  validation {
    condition     = can(regex("^(/|/[!-~]{1,510}/)$", var.iam_path))
    error_message = "The iam_path must be / or a path that starts and ends with /, e.g. /ml/ (IAM: up to 512 printable ASCII characters)."
  }
}

variable "enable_cloudwatch" {
  description = "Attach CloudWatchAgentServerPolicy to the instance role, which a CloudWatch agent of your own needs to ship logs and metrics. The module installs and starts no agent: the nodes' logs go to the checkpoint bucket (srifty logs) whatever this is."
  type        = bool
  default     = false
}

variable "train" {
  description = "What every instance runs at boot: setup_command (a shell command) installs the environment; argv is what torchrun starts, the script and its arguments (or \"-m\", a module and its arguments), each word quoted for the shell by the module (it receives --resume-from <s3 uri> when resume_from is set); nnodes is the fleet's instance count; handover = true (srifty launch) makes every instance wait for HANDOVER-<name>.json under the checkpoint prefix and take the job's settings (checkpoint to resume from, per-rank batch sizes) from it; env holds variables exported on every instance before torchrun starts (names [A-Z_][A-Z0-9_]*; srifty terraform puts the plan layout's Lightning strategy there, SRIFTY_STRATEGY, which the job's plan_strategy() reads); code is the snapshot srifty terraform made of the working directory (source: the .tar.gz, relative to the root module; sha256: its digest), uploaded under the checkpoint prefix as code/<sha256>.tar.gz: every instance fetches it, checks the digest, unpacks it, installs the profiled environment it describes (.srifty/bootstrap.py into a virtual environment) and runs torchrun from it, after setup_command; image (a container image) runs torchrun in that image instead (docker run with the GPUs, every EFA device, the host's network; the code at /workspace; the snapshot's lightning-srifty and requirements installed into the image's Python)."
  type = object({
    setup_command = optional(string, "")
    argv          = list(string)
    nnodes        = number
    rdzv_port     = optional(number, 29400)
    # how long a node waits for the others to be ready (their environments installed), and torchrun's join timeout
    rendezvous_timeout_s = optional(number, 1800)
    resume_from          = optional(string)
    handover             = optional(bool, false)
    env                  = optional(map(string), {})
    image                = optional(string)
    code = optional(object({
      source = string
      sha256 = string
    }))
  })

  validation {
    condition     = alltrue([for k in keys(var.train.env) : can(regex("^[A-Z_][A-Z0-9_]*$", k))])
    error_message = "Every train.env name must be a shell variable name of [A-Z_][A-Z0-9_]* (they are exported on the instances): rename the others."
  }

  validation {
    condition     = length(var.train.argv) > 0 && !can(regex("^(.*/)?(python[0-9.]*|torchrun)$", var.train.argv[0]))
    error_message = "The train.argv must be the script torchrun starts and its arguments, such as [\"train.py\", \"--epochs\", \"90\"] or [\"-m\", \"pkg.train\"], not empty and not starting with python or torchrun (the module runs torchrun, which runs Python)."
  }

  validation {
    condition     = var.train.code == null ? true : can(regex("^[0-9a-f]{64}$", var.train.code.sha256)) && endswith(var.train.code.source, "${var.train.code.sha256}.tar.gz")
    error_message = "The train.code.sha256 must be 64 lower-case hex digits and train.code.source the archive named after it (<sha256>.tar.gz): make the snapshot with srifty terraform."
  }

  validation {
    condition     = var.train.nnodes >= 1 && var.train.rdzv_port >= 1024 && var.train.rdzv_port <= 65535
    error_message = "The train.nnodes must be at least 1 and train.rdzv_port between 1024 and 65535."
  }

  validation {
    condition     = var.train.rendezvous_timeout_s >= 60 && var.train.rendezvous_timeout_s <= 7200 && floor(var.train.rendezvous_timeout_s) == var.train.rendezvous_timeout_s
    error_message = "The train.rendezvous_timeout_s must be whole seconds from 60 to 7200: how long a node waits for the fleet's other nodes to be ready."
  }
}

variable "max_life_h" {
  description = "Hard cap on the fleet's life, in hours: the watchdog stops the job grace_s before it, counted from the fleet's first launch (the nodes' record life/<name>.json beside the checkpoints: a spot replacement does not start a cap of its own), and user_data schedules `shutdown -h` (the instance terminates) this long after each instance's boot, whatever else fails. srifty terraform sets the later of the plan's predicted hours x 1.5 and the time's 99th percentile, + 1."
  type        = number
  default     = 72

  validation {
    condition     = var.max_life_h >= 0.25 && var.max_life_h <= 720
    error_message = "The max_life_h must be between 0.25 and 720 hours (30 days); a longer run should checkpoint and be launched again."
  }
}

variable "watchdog" {
  description = "The instance-side watchdog (templates/watchdog.sh): every interval_s seconds it stops the job (SIGTERM, grace_s seconds to checkpoint) and terminates the instance when the job has exited or the life cap has passed; with heartbeat = true (srifty launch) also when the launcher's HEARTBEAT.json under the checkpoint prefix is older than its max_age_s, past its max_life_until_unix, or unreadable for max_age_s seconds. Without heartbeat, the boot script's stall watch: a job that showed no sign of life for stall_s seconds (or four of its steps, or grace_s, the longest) after its first step hangs; it is killed and the node leaves to be replaced (its replacement resumes from the newest checkpoint), unless it hung again at an earlier node's hang step of this life of the fleet (the job's own hang: the fleet ends). 0: off. Once its training has finished (its fit ended), a script that shows no sign of life for after_fit_s seconds (a test, an export, an upload that never ends; 0: no limit) is killed and the fleet ends: its training is done and in its checkpoints. With heartbeat (srifty launch) the launcher watches the training instead (--stall-timeout-min), and the nodes still end a hung teardown (stall_s after every rank's exit mark) and a script silent after its training (after_fit_s)."
  type = object({
    heartbeat   = optional(bool, false)
    interval_s  = optional(number, 60)
    grace_s     = optional(number, 120)
    max_age_s   = optional(number, 300)
    stall_s     = optional(number, 1200)
    after_fit_s = optional(number, 1800)
  })
  default = {}

  validation {
    condition     = alltrue([for v in [var.watchdog.interval_s, var.watchdog.grace_s, var.watchdog.max_age_s, var.watchdog.stall_s, var.watchdog.after_fit_s] : floor(v) == v]) && var.watchdog.interval_s >= 5 && var.watchdog.interval_s <= 600 && var.watchdog.grace_s >= 0 && var.watchdog.grace_s <= 3600 && var.watchdog.max_age_s >= 60 && var.watchdog.max_age_s <= 86400 && (var.watchdog.stall_s == 0 || (var.watchdog.stall_s >= 60 && var.watchdog.stall_s <= 86400)) && (var.watchdog.after_fit_s == 0 || (var.watchdog.after_fit_s >= 60 && var.watchdog.after_fit_s <= 86400))
    error_message = "The watchdog needs whole seconds: interval_s from 5 to 600, grace_s from 0 to 3600, max_age_s from 60 to 86400, stall_s and after_fit_s 0 (off) or from 60 to 86400."
  }
}

variable "limits" {
  description = "Money guards checked at plan time: the fleet may have at most max_instances instances, and cost at most max_hourly_usd per hour (predicted.usd_per_hour; null: no limit). srifty terraform fills them from the plan's constraints or --max-instances / --max-hourly."
  type = object({
    max_instances  = number
    max_hourly_usd = optional(number)
  })
  default = { max_instances = 16 }

  validation {
    condition     = var.limits.max_instances >= 1 && floor(var.limits.max_instances) == var.limits.max_instances && (var.limits.max_hourly_usd == null ? true : var.limits.max_hourly_usd > 0)
    error_message = "The limits.max_instances must be a whole number of at least 1, and limits.max_hourly_usd positive (or null for no hourly limit)."
  }
}

variable "predicted" {
  description = "What the plan predicted for this fleet, passed through to the outputs so that a reviewer sees what is being paid for."
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
  description = "Tags added to every resource but the S3 objects it uploads (those carry srifty:fleet alone: S3 takes 10 tags on an object): at most 47 (AWS allows 50 on a resource and the module adds up to 3: srifty:fleet, Name, srifty:group), keys of 1 to 128 and values of up to 256 letters, digits, spaces and _ . : / = + - @ (AWS's tag rules), keys not starting with aws:. With metadata_tags, the instances' tag keys are restricted further."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.tags : can(regex("^[\\p{L}\\p{N} _.:/=+@-]{1,128}$", k)) && !startswith(lower(k), "aws:") && can(regex("^[\\p{L}\\p{N} _.:/=+@-]{0,256}$", v))])
    error_message = "Every tag key must be 1 to 128 and every value at most 256 letters, digits, spaces and _ . : / = + - @, and no key may start with aws: (AWS's tag rules)."
  }

  # "Maximum number of tags per resource: 50" (tag restrictions, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions;
  # the same 50 for S3 buckets, IAM roles and Auto Scaling groups): EC2 refuses a launch whose instance would carry more
  validation {
    condition     = length(var.tags) <= 47
    error_message = "The tags are ${length(var.tags)}, but AWS allows 50 user tags on a resource and the module adds up to 3 of its own to each instance (srifty:fleet, Name, srifty:group): give at most 47 (AWS's tag rules)."
  }
}

variable "metadata_tags" {
  description = "Let each instance read its tags from the instance metadata (IMDS tags/instance). Off by default: nothing the module runs reads them, and with it on EC2 allows instance tag keys of letters, digits and + - = . , _ : @ only (no spaces or /, not . or .. or _index) and fails every launch otherwise, so the module then refuses such keys at plan."
  type        = bool
  default     = false
}
