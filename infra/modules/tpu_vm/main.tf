# One Cloud TPU VM (a slice: one host, or several hosts on a multi-host type) per student or team.

locals {
  labels = merge(var.labels, {
    workshop = var.workshop
    kit      = "labkit"
    role     = "tpu"
  })
  names = [for i in range(var.vm_count) : format("%s-tpu-%02d", var.workshop, i)]
}

resource "google_tpu_v2_vm" "vm" {
  provider = google-beta
  count    = var.vm_count

  project          = var.project
  zone             = var.zone
  name             = local.names[count.index]
  description      = "JAX SPMD lab kit, workshop ${var.workshop}, seat ${count.index}"
  accelerator_type = var.accelerator_type
  runtime_version  = var.runtime_version

  network_config {
    network             = var.network
    subnetwork          = var.subnetwork
    enable_external_ips = var.external_ips
    can_ip_forward      = false
  }

  scheduling_config {
    spot        = var.spot
    preemptible = var.preemptible
  }

  labels = local.labels

  metadata = {
    startup-script = var.startup_script
    # Keys come from OS Login (the students' Google accounts), not from keys pasted into metadata.
    enable-oslogin = "TRUE"
    # Read by startup.sh: where the kit comes from, and which smoke configuration to run.
    labkit-repo     = var.kit_repo
    labkit-ref      = var.kit_ref
    labkit-mode     = "tpu"
    labkit-workshop = var.workshop
  }
}
