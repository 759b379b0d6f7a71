output "names" {
  description = "Names of the CPU VMs, in seat order."
  value       = google_compute_instance.vm[*].name
}

output "ssh_commands" {
  description = "The command that opens a shell on each CPU VM."
  value       = [for vm in google_compute_instance.vm : "gcloud compute ssh ${vm.name} --zone ${var.zone} --project ${var.project}"]
}

output "zone" {
  description = "Zone of the CPU VMs."
  value       = var.zone
}
