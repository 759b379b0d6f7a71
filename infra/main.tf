# A workshop: tpu_count Cloud TPU VMs and cpu_count CPU VMs, each installing the kit at boot with
# startup.sh and checking itself with a smoke lab. Driven by workshop.sh (make workshop-up, ...).

locals {
  startup_script = file("${path.module}/startup.sh")
}

module "tpu" {
  source = "./modules/tpu_vm"
  providers = {
    google-beta = google-beta
  }

  project          = var.project
  zone             = var.zone
  workshop         = var.workshop
  vm_count         = var.tpu_count
  accelerator_type = var.accelerator_type
  runtime_version  = var.runtime_version
  spot             = var.spot
  preemptible      = var.preemptible
  network          = var.network
  subnetwork       = var.subnetwork
  external_ips     = var.external_ips
  startup_script   = local.startup_script
  kit_repo         = var.kit_repo
  kit_ref          = var.kit_ref
  labels           = var.labels
}

module "cpu" {
  source = "./modules/cpu_vm"
  providers = {
    google = google
  }

  project        = var.project
  zone           = coalesce(var.cpu_zone, var.zone)
  workshop       = var.workshop
  vm_count       = var.cpu_count
  machine_type   = var.machine_type
  spot           = var.spot
  network        = var.network
  subnetwork     = var.subnetwork
  external_ips   = var.external_ips
  startup_script = local.startup_script
  kit_repo       = var.kit_repo
  kit_ref        = var.kit_ref
  labels         = var.labels
}
