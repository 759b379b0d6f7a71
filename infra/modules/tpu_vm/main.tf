# One Cloud TPU VM (a slice: one host, or several hosts on a multi-host type) per student or team.

locals {
  labels = merge(var.labels, {
    workshop = var.workshop
    kit      = "labkit"
    role     = "tpu"
  })
}

resource "google_tpu_v2_vm" "vm" {
  provider = google-beta
  for_each = var.vms

  project          = var.project
  zone             = var.zone
  name             = each.key
  description      = "JAX SPMD lab kit, workshop ${var.workshop}, student ${each.value}"
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

  # The workshop's own service account, which holds no project role: a student who takes the
  # metadata server's token can reach only the workshop bucket, through this one scope.
  service_account {
    email = var.service_account
    scope = var.scopes
  }

  # The firewall rule for IAP's range (ssh, and the JupyterLab tunnel inside it) targets this tag.
  tags = [var.network_tag]

  labels = merge(local.labels, { student = each.value })

  metadata = {
    startup-script = var.startup_script
    # Keys come from OS Login (the students' Google accounts), not from keys pasted into metadata.
    enable-oslogin         = "TRUE"
    block-project-ssh-keys = "TRUE"
    # Read by startup.sh: where the kit comes from, and which smoke configuration to run.
    labkit-repo         = var.kit_repo
    labkit-ref          = var.kit_ref
    labkit-mode         = "tpu"
    labkit-workshop     = var.workshop
    labkit-student      = each.value
    labkit-backup       = var.backup_url
    labkit-idle-minutes = tostring(var.idle_minutes)
  }
}
