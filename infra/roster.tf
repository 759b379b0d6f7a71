# Who gets which VM: the roster (or numbered seats), read from the variables alone, so that
# tests/kit/test_infra.py can plan this file with variables.tf and no provider.

locals {
  roster = var.roster == null ? [] : csvdecode(file(var.roster))
  # { VM name = student id } and { VM name = Google account }, TPU and CPU apart.
  tpu_vms = var.roster == null ? { for i in range(var.tpu_count) : format("%s-tpu-%02d", var.workshop, i) => format("tpu-%02d", i) } : {
    for row in local.roster : "${var.workshop}-${row.student}" => row.student if coalesce(lookup(row, "kind", ""), "tpu") == "tpu"
  }
  cpu_vms = var.roster == null ? { for i in range(var.cpu_count) : format("%s-cpu-%02d", var.workshop, i) => format("cpu-%02d", i) } : {
    for row in local.roster : "${var.workshop}-${row.student}" => row.student if coalesce(lookup(row, "kind", ""), "tpu") == "cpu"
  }
  accounts = { for row in local.roster : "${var.workshop}-${row.student}" => row.account }
  # The CPU VMs whose student has an account (instance-level access, access.tf).
  cpu_access = { for name, student in local.cpu_vms : name => local.accounts[name] if contains(keys(local.accounts), name) }
  cpu_zone   = coalesce(var.cpu_zone, var.zone)
  # us-central1-a -> us-central1; us-central1-ai1a -> us-central1.
  regions = toset([regex("^([a-z]+-[a-z]+[0-9]+)-", var.zone)[0], regex("^([a-z]+-[a-z]+[0-9]+)-", local.cpu_zone)[0]])
  # TPU VMs have no IAM resource per node in the provider: one conditional project grant per student and role.
  tpu_grants = merge([
    for name, student in local.tpu_vms : {
      for role in ["roles/tpu.viewer", "roles/compute.osLogin", "roles/iap.tunnelResourceAccessor"] :
      "${name} ${role}" => { name = name, role = role, account = local.accounts[name] }
    } if contains(keys(local.accounts), name)
  ]...)
}
