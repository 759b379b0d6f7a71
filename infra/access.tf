# Each student reaches only their own VM (roster rows with an account; seats without a roster get no
# student access: organisers hand them out through their own project roles).
#
# CPU VMs: instance-level IAM. roles/compute.osLogin on the instance lets the student log in there
# (not as an administrator: no sudo), and roles/iap.tunnelResourceAccessor on the instance lets
# their `gcloud compute ssh --tunnel-through-iap` (and the JupyterLab tunnel inside it) through IAP.
resource "google_compute_instance_iam_member" "os_login" {
  for_each = local.cpu_access

  project       = var.project
  zone          = local.cpu_zone
  instance_name = each.key
  role          = "roles/compute.osLogin"
  member        = "user:${each.value}"

  depends_on = [module.cpu]
}

resource "google_iap_tunnel_instance_iam_member" "tunnel" {
  for_each = local.cpu_access

  project  = var.project
  zone     = local.cpu_zone
  instance = each.key
  role     = "roles/iap.tunnelResourceAccessor"
  member   = "user:${each.value}"

  depends_on = [module.cpu]
}

# TPU VMs: the provider has no IAM resource per TPU node, so each grant is a project binding with an
# IAM condition on the resource's name, ending with the student's node. These conditions have not
# been tried against a real project from the kit's machines; check one student's access before the
# day (docs/workshop.md, "Reaching the VMs").
resource "google_project_iam_member" "tpu_student" {
  for_each = local.tpu_grants

  project = var.project
  role    = each.value.role
  member  = "user:${each.value.account}"

  condition {
    title       = "labkit-${each.value.name}"
    description = "only the student's own TPU VM ${each.value.name}"
    expression  = "resource.name.endsWith(\"/${each.value.name}\")"
  }
}

# An optional budget alert on what the workshop's labelled resources cost.
data "google_project" "this" {
  project_id = var.project
}

resource "google_billing_budget" "workshop" {
  count = var.billing_account == null ? 0 : 1

  billing_account = var.billing_account
  display_name    = "labkit workshop ${var.workshop}"

  budget_filter {
    projects = ["projects/${data.google_project.this.number}"]
    labels   = { workshop = var.workshop }
  }

  amount {
    specified_amount {
      currency_code = "USD"
      units         = tostring(var.budget_usd)
    }
  }

  threshold_rules {
    threshold_percent = 0.5
  }
  threshold_rules {
    threshold_percent = 0.9
  }
  threshold_rules {
    threshold_percent = 1.0
  }
}
