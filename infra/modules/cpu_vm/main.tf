# One plain CPU VM per attendee without TPU quota: the same kit, installed by the same startup
# script, running the labs on the cpu-1 and cpu-8 configurations.

locals {
  labels = merge(var.labels, {
    workshop = var.workshop
    kit      = "labkit"
    role     = "cpu"
  })
}

resource "google_compute_instance" "vm" {
  for_each = var.vms

  project      = var.project
  zone         = var.zone
  name         = each.key
  description  = "JAX SPMD lab kit, workshop ${var.workshop}, student ${each.value}"
  machine_type = var.machine_type

  #checkov:skip=CKV_GCP_38:a customer-supplied key per boot disk would outlive the VM and need its own key management; these disks hold only the public kit and a student's exercises and are deleted with the VM by `workshop.sh down`
  boot_disk {
    auto_delete = true
    initialize_params {
      image  = var.image
      size   = var.disk_size_gb
      type   = "pd-balanced"
      labels = local.labels
    }
  }

  # No external address by default (external_ips = false): students come in through IAP, the kit
  # comes from the package index through Cloud NAT.
  #checkov:skip=CKV_GCP_40:external_ips defaults to false, which leaves the dynamic access_config out; checkov counts the dynamic block as an address whatever its for_each, and an organiser may turn addresses on where the network has no NAT
  network_interface {
    network    = var.network
    subnetwork = var.subnetwork

    dynamic "access_config" {
      for_each = var.external_ips ? [1] : []
      content {}
    }
  }

  scheduling {
    preemptible                 = var.spot
    provisioning_model          = var.spot ? "SPOT" : "STANDARD"
    automatic_restart           = !var.spot
    on_host_maintenance         = var.spot ? "TERMINATE" : "MIGRATE"
    instance_termination_action = var.spot ? "STOP" : null
  }

  # The workshop's own service account, which holds no project role, with one scope: a student who
  # takes the metadata server's token can reach only the workshop bucket.
  service_account {
    email  = var.service_account
    scopes = var.scopes
  }

  # The firewall rule for IAP's range targets this tag.
  tags = [var.network_tag]

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  labels = merge(local.labels, { student = each.value })

  metadata = {
    startup-script         = var.startup_script
    enable-oslogin         = "TRUE"
    block-project-ssh-keys = true
    serial-port-enable     = "FALSE"
    # Read by startup.sh: where the kit comes from, and which smoke configuration to run.
    labkit-repo         = var.kit_repo
    labkit-ref          = var.kit_ref
    labkit-mode         = "cpu"
    labkit-workshop     = var.workshop
    labkit-student      = each.value
    labkit-backup       = var.backup_url
    labkit-idle-minutes = tostring(var.idle_minutes)
  }

  can_ip_forward = false
}
