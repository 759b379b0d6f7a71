# workshop.sh reads these with `terraform output -json NAME`.

output "project" {
  description = "Project of the workshop."
  value       = var.project
}

output "workshop" {
  description = "Value of the `workshop` label on everything created."
  value       = var.workshop
}

output "tpu_zone" {
  description = "Zone of the TPU VMs."
  value       = module.tpu.zone
}

output "cpu_zone" {
  description = "Zone of the CPU VMs."
  value       = module.cpu.zone
}

output "tpu_names" {
  description = "Names of the TPU VMs (made by Terraform, or by workshop.sh through queued resources)."
  value       = var.queued_resources ? keys(local.tpu_vms) : module.tpu.names
}

output "cpu_names" {
  description = "Names of the CPU VMs."
  value       = module.cpu.names
}

output "students" {
  description = "The student of every VM: { vm name = student id }; `run grade` and `collect` name results by it."
  value       = merge(local.tpu_vms, module.cpu.students)
}

output "accounts" {
  description = "The Google account of every VM's student (roster only): { vm name = account }."
  value       = local.accounts
}

output "ssh_commands" {
  description = "One ssh command per VM, through IAP, TPU VMs first."
  value       = concat(module.tpu.ssh_commands, module.cpu.ssh_commands)
}

output "service_account" {
  description = "The VMs' service account (no project role; Cloud Storage scope only)."
  value       = google_service_account.vm.email
}

output "backup_bucket" {
  description = "Bucket holding every VM's labs/ backups (gs://BUCKET/labs/<vm>/)."
  value       = google_storage_bucket.labs.name
}

output "planned" {
  description = "The planned hours and the price given for an unlisted type, as workshop.sh printed them."
  value       = { hours = var.hours, usd_per_hour = var.usd_per_hour }
}

output "queued_resources" {
  description = "Whether workshop.sh makes the TPU VMs through queued resources."
  value       = var.queued_resources
}

output "queued_create" {
  description = "Per TPU VM, the arguments of `gcloud compute tpus queued-resources create` (used when queued_resources is true)."
  value       = local.queued_create
}
