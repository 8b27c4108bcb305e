output "instance_ids" {
  description = "Ids of the fleet's instances (pending or running) once apply has returned."
  value       = data.aws_instances.fleet.ids
}

output "private_ips" {
  description = "Private IPv4 addresses of the fleet's instances."
  value       = data.aws_instances.fleet.private_ips
}

output "rendezvous_port" {
  description = "The torchrun c10d port. The host is chosen at boot: the first node ready (the ready records under the checkpoint prefix, ready/<name>/), the same on every node."
  value       = var.train.rdzv_port
}

output "launch_template_ids" {
  description = "Launch template id per instance type."
  value       = { for k, lt in aws_launch_template.group : k => lt.id }
}

output "autoscaling_group_name" {
  description = "The Auto Scaling group (capacity.mode = asg), else null."
  value       = var.capacity.mode == "asg" ? aws_autoscaling_group.fleet[0].name : null
}

output "ec2_fleet_ids" {
  description = "The EC2 Fleets per instance type (capacity.mode = fleet), else empty."
  value       = { for k, f in aws_ec2_fleet.group : k => f.id }
}

output "security_group_id" {
  description = "The fleet's security group."
  value       = aws_security_group.fleet.id
}

output "instance_role_arn" {
  description = "The IAM role the instances run as."
  value       = aws_iam_role.instance.arn
}

output "checkpoint_bucket" {
  description = "The checkpoint bucket."
  value       = local.bucket
}

output "checkpoint_uri" {
  description = "Where the training command writes checkpoints (also SRIFTY_CHECKPOINT_URI on every node)."
  value       = "s3://${local.bucket}/${var.checkpoints.prefix}"
}

output "outputs_uri" {
  description = "Where each instance's job outputs go: every file the job created or changed in its code folder (Lightning's lightning_logs/, its ModelCheckpoint files, a model the script saves), under <instance id>/, every 10 minutes while it trains and when it ends. Only with a code snapshot (train.code)."
  value       = var.train.code == null ? null : "s3://${local.bucket}/${var.checkpoints.prefix}outputs/${var.name}/"
}

output "capacity_units" {
  description = "The fleet's capacity in weighted units (the sum of instances x weighted_capacity); one unit is predicted.samples_per_capacity_unit samples per second."
  value       = local.capacity_units
}

output "nodes" {
  description = "Instances in the fleet."
  value       = local.nodes
}

output "predicted" {
  description = "What the plan predicted for this fleet: samples per second, price per hour, hours and cost for the work."
  value       = var.predicted
}
