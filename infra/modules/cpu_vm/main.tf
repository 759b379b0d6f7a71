# One plain CPU VM per attendee without TPU quota: the same kit, installed by the same startup
# script, running the labs on the cpu-1 and cpu-8 configurations.

locals {
  labels = merge(var.labels, {
    workshop = var.workshop
    kit      = "labkit"
    role     = "cpu"
  })
  names = [for i in range(var.vm_count) : format("%s-cpu-%02d", var.workshop, i)]
}

resource "google_compute_instance" "vm" {
  count = var.vm_count

  project      = var.project
  zone         = var.zone
  name         = local.names[count.index]
  description  = "JAX SPMD lab kit, workshop ${var.workshop}, CPU seat ${count.index}"
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

  #checkov:skip=CKV_GCP_40:students reach their VM with `gcloud compute ssh` and the VM installs the kit from the package index; `external_ips = false` turns the address off where the network has IAP and Cloud NAT
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

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  labels = local.labels

  metadata = {
    startup-script         = var.startup_script
    enable-oslogin         = "TRUE"
    block-project-ssh-keys = true
    serial-port-enable     = "FALSE"
    # Read by startup.sh: where the kit comes from, and which smoke configuration to run.
    labkit-repo     = var.kit_repo
    labkit-ref      = var.kit_ref
    labkit-mode     = "cpu"
    labkit-workshop = var.workshop
  }

  # No service account: the VM needs no Google Cloud API, only the package index and the kit's repository.
  can_ip_forward = false
}
