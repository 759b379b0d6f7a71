output "names" {
  description = "Names of the TPU VMs, in the order of the roster (or of the seats)."
  value       = [for name in keys(var.vms) : google_tpu_v2_vm.vm[name].name]
}

output "students" {
  description = "The student of each TPU VM: { vm name = student id }."
  value       = { for name, student in var.vms : google_tpu_v2_vm.vm[name].name => student }
}

output "ssh_commands" {
  description = "The command that opens a shell on each TPU VM through IAP (worker 0; add --worker=all to reach every host of a multi-host slice)."
  value       = [for name in keys(var.vms) : "gcloud compute tpus tpu-vm ssh ${google_tpu_v2_vm.vm[name].name} --zone ${var.zone} --project ${var.project} --tunnel-through-iap"]
}

output "zone" {
  description = "Zone of the TPU VMs."
  value       = var.zone
}

output "accelerator_type" {
  description = "TPU type of every VM."
  value       = var.accelerator_type
}
