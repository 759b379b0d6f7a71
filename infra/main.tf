# A workshop: one VM per student (from a roster) or per seat, each installing the student release of
# the kit at boot with startup.sh and checking itself with the unmodified smoke lab. Around them:
# the APIs the workshop needs, a service account with no project role, a bucket for labs/ backups,
# the firewall rule for IAP's range, Cloud NAT, each student's access to their own VM, and an
# optional budget alert. Driven by workshop.sh (make workshop-up, ...).

locals {
  startup_script = file("${path.module}/startup.sh")
  tag            = "${var.workshop}-labkit"
  labels         = merge(var.labels, { workshop = var.workshop, kit = "labkit" })
  backup_url     = "gs://${google_storage_bucket.labs.name}/labs"
  # The arguments of `gcloud compute tpus queued-resources create NAME ...` for each TPU VM: the same
  # node as the tpu_vm module makes (its startup script is added by workshop.sh from infra/startup.sh).
  queued_create = { for name, student in local.tpu_vms : name => concat([
    "--node-id", name, "--project", var.project, "--zone", var.zone,
    "--accelerator-type", var.accelerator_type, "--runtime-version", var.runtime_version,
    "--service-account", google_service_account.vm.email,
    "--scopes", "https://www.googleapis.com/auth/devstorage.read_write",
    "--network", var.network, "--tags", local.tag,
    "--labels", join(",", [for k, v in merge(local.labels, { role = "tpu", student = student }) : "${k}=${v}"]),
    "--metadata", join(",", [for k, v in {
      enable-oslogin      = "TRUE", block-project-ssh-keys = "TRUE", labkit-repo = var.kit_repo, labkit-ref = var.kit_ref,
      labkit-mode         = "tpu", labkit-workshop = var.workshop, labkit-student = student, labkit-backup = local.backup_url,
      labkit-idle-minutes = tostring(var.idle_minutes)
    } : "${k}=${v}"]),
    ], var.subnetwork == null ? [] : ["--subnetwork", var.subnetwork], var.external_ips ? [] : ["--internal-ips"],
  var.spot ? ["--spot"] : []) }
}

# The APIs a workshop needs; left on at destroy (other things in the project may use them).
resource "google_project_service" "api" {
  for_each = toset(["compute.googleapis.com", "tpu.googleapis.com", "iap.googleapis.com", "storage.googleapis.com"])

  project            = var.project
  service            = each.value
  disable_on_destroy = false
}

# Every VM runs as this account. It holds no project role: its only grant is on the workshop's
# bucket (below), and the VMs' token carries only the Cloud Storage scope.
resource "google_service_account" "vm" {
  project      = var.project
  account_id   = "${var.workshop}-labkit-vm"
  display_name = "labkit workshop ${var.workshop} VMs (no project role)"
  description  = "Identity of the workshop's VMs: writes their labs/ backups to the workshop bucket, nothing else."
}

# labs/ of every VM, copied every few minutes (startup.sh) and restored when a VM is made again.
resource "google_storage_bucket" "labs" {
  #checkov:skip=CKV_GCP_62:access logs of a one-day workshop bucket would go to a second bucket that outlives the workshop; the bucket holds only students' exercise notebooks and is deleted by `workshop.sh down` after `collect`
  project                     = var.project
  name                        = "${var.project}-${var.workshop}-labs"
  location                    = upper(regex("^([a-z]+-[a-z]+[0-9]+)-", var.zone)[0])
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  # `workshop.sh down` refuses to run before `collect` has copied the work out, then empties it.
  force_destroy = true
  labels        = merge(local.labels, { role = "backup" })

  versioning {
    enabled = true
  }

  depends_on = [google_project_service.api]
}

resource "google_storage_bucket_iam_member" "vm_backups" {
  bucket = google_storage_bucket.labs.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.vm.email}"
}

# ssh (and the JupyterLab tunnel inside it) only from IAP's TCP forwarding range, only to the workshop's VMs.
resource "google_compute_firewall" "iap" {
  project       = var.project
  name          = "${var.workshop}-labkit-allow-iap-ssh"
  network       = var.network
  description   = "IAP TCP forwarding to the labkit workshop ${var.workshop} VMs (ssh only)"
  direction     = "INGRESS"
  source_ranges = ["35.235.240.0/20"]
  target_tags   = [local.tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }

  depends_on = [google_project_service.api]
}

# Without external addresses, the VMs reach the package index and the kit's repository through NAT.
resource "google_compute_router" "nat" {
  for_each = var.cloud_nat ? local.regions : toset([])

  project = var.project
  name    = "${var.workshop}-labkit-${each.key}"
  region  = each.key
  network = var.network

  depends_on = [google_project_service.api]
}

resource "google_compute_router_nat" "nat" {
  for_each = google_compute_router.nat

  project                            = var.project
  name                               = "${var.workshop}-labkit-nat"
  router                             = each.value.name
  region                             = each.value.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"
}

module "tpu" {
  source = "./modules/tpu_vm"
  providers = {
    google-beta = google-beta
  }

  project  = var.project
  zone     = var.zone
  workshop = var.workshop
  # With queued resources, workshop.sh makes the TPU VMs (with the arguments of output queued_create).
  vms              = var.queued_resources ? {} : local.tpu_vms
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
  service_account  = google_service_account.vm.email
  network_tag      = local.tag
  backup_url       = local.backup_url
  idle_minutes     = var.idle_minutes

  depends_on = [google_project_service.api]
}

module "cpu" {
  source = "./modules/cpu_vm"
  providers = {
    google = google
  }

  project         = var.project
  zone            = local.cpu_zone
  workshop        = var.workshop
  vms             = local.cpu_vms
  machine_type    = var.machine_type
  spot            = var.spot
  network         = var.network
  subnetwork      = var.subnetwork
  external_ips    = var.external_ips
  startup_script  = local.startup_script
  kit_repo        = var.kit_repo
  kit_ref         = var.kit_ref
  labels          = var.labels
  service_account = google_service_account.vm.email
  network_tag     = local.tag
  backup_url      = local.backup_url
  idle_minutes    = var.idle_minutes

  depends_on = [google_project_service.api]
}
