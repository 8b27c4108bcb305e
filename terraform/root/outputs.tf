output "fleet" {
  description = "Everything the module reports: instances, rendezvous endpoint, checkpoint bucket, prediction."
  value       = module.fleet
}
