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
  description = "Names of the TPU VMs."
  value       = module.tpu.names
}

output "cpu_names" {
  description = "Names of the CPU VMs."
  value       = module.cpu.names
}

output "ssh_commands" {
  description = "One ssh command per VM, TPU VMs first: hand each student theirs."
  value       = concat(module.tpu.ssh_commands, module.cpu.ssh_commands)
}
