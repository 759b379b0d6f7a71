output "names" {
  description = "Names of the CPU VMs, in the order of the roster (or of the seats)."
  value       = [for name in keys(var.vms) : google_compute_instance.vm[name].name]
}

output "students" {
  description = "The student of each CPU VM: { vm name = student id }."
  value       = { for name, student in var.vms : google_compute_instance.vm[name].name => student }
}

output "ssh_commands" {
  description = "The command that opens a shell on each CPU VM through IAP."
  value       = [for name in keys(var.vms) : "gcloud compute ssh ${google_compute_instance.vm[name].name} --zone ${var.zone} --project ${var.project} --tunnel-through-iap"]
}

output "zone" {
  description = "Zone of the CPU VMs."
  value       = var.zone
}
