output "names" {
  description = "Names of the TPU VMs, in seat order."
  value       = google_tpu_v2_vm.vm[*].name
}

output "ssh_commands" {
  description = "The command that opens a shell on each TPU VM (worker 0; add --worker=all to reach every host of a multi-host slice)."
  value       = [for vm in google_tpu_v2_vm.vm : "gcloud compute tpus tpu-vm ssh ${vm.name} --zone ${var.zone} --project ${var.project}"]
}

output "zone" {
  description = "Zone of the TPU VMs."
  value       = var.zone
}

output "accelerator_type" {
  description = "TPU type of every VM."
  value       = var.accelerator_type
}
