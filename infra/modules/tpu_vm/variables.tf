variable "project" {
  description = "Google Cloud project that owns the TPU VMs."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project ID: 6 to 30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "zone" {
  description = "Zone of the TPU VMs; it must offer the accelerator type (see `gcloud compute tpus accelerator-types list --zone ZONE`)."
  type        = string
  default     = "us-central1-a"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$", var.zone))
    error_message = "zone must look like us-central1-a (or an AI zone such as us-central1-ai1a)."
  }
}

variable "workshop" {
  description = "Name of the workshop: prefix of every VM name and the value of the `workshop` label used for cost tracking and cleanup."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.workshop))
    error_message = "workshop must be 1 to 20 lowercase letters, digits or hyphens, starting with a letter (it becomes part of VM names and a label value)."
  }
}

variable "vms" {
  description = "The TPU VMs to create: { VM name = student id } (a student id of seat-NN where no roster names one)."
  type        = map(string)
  default     = {}

  validation {
    condition     = length(var.vms) <= 100 && alltrue([for name, student in var.vms : can(regex("^[a-z][a-z0-9-]{0,61}[a-z0-9]$", name)) && can(regex("^[a-z0-9_-]{1,63}$", student))])
    error_message = "vms maps at most 100 VM names (lowercase letters, digits and hyphens, starting with a letter) to student ids (lowercase letters, digits, _ or -)."
  }
}

variable "accelerator_type" {
  description = "TPU type of each VM. The default, v5litepod-8, is 8 TPU v5e chips on one host: `jax.devices()` shows 8 devices, as the cpu-8 configuration does. Types with more chips than one host holds are multi-host slices."
  type        = string
  default     = "v5litepod-8"

  validation {
    condition     = can(regex("^(v2|v3|v4|v5p|v5litepod|v6e)-[0-9]+$", var.accelerator_type))
    error_message = "accelerator_type must be a Cloud TPU type such as v5litepod-8, v6e-8, v4-8 or v5p-8."
  }
}

variable "runtime_version" {
  description = "TPU VM software version (the image); it must match the TPU generation: v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv6e for v6e, v2-alpha-tpuv5 for v5p, tpu-ubuntu2204-base for v2 to v4 (infra/tpu-types.tsv)."
  type        = string
  default     = "v2-alpha-tpuv5-lite"

  validation {
    condition     = length(var.runtime_version) > 0
    error_message = "runtime_version must not be empty."
  }
}

variable "spot" {
  description = "Create Spot TPU VMs: much cheaper, but Google Cloud may stop them at any time. Right for a rehearsal; think twice for the session itself."
  type        = bool
  default     = false
}

variable "preemptible" {
  description = "Create preemptible TPU VMs (the older form of Spot, stopped after at most 24 hours). Use spot or preemptible, not both."
  type        = bool
  default     = false

  validation {
    condition     = !(var.preemptible && var.spot)
    error_message = "choose either spot or preemptible, not both."
  }
}

variable "network" {
  description = "VPC network the TPU VMs join."
  type        = string
  default     = "default"

  validation {
    condition     = length(var.network) > 0
    error_message = "network must name a VPC network, e.g. default."
  }
}

variable "subnetwork" {
  description = "Subnetwork in the zone's region; null lets Google Cloud choose the network's subnetwork."
  type        = string
  default     = null
}

variable "external_ips" {
  description = "Give each VM an external IP address. Off by default: students reach their VM through IAP, and the VM reaches the package index through Cloud NAT."
  type        = bool
  default     = false
}

variable "startup_script" {
  description = "Text of the startup script run on every worker of every VM at boot (infra/startup.sh)."
  type        = string
}

variable "kit_repo" {
  description = "Git URL the VM clones the kit from; the startup script reads it from the labkit-repo metadata key."
  type        = string

  validation {
    condition     = can(regex("^https://", var.kit_repo))
    error_message = "kit_repo must be an https:// git URL: the VMs hold no ssh key for git@ or ssh:// URLs."
  }
}

variable "kit_ref" {
  description = "Branch, tag or commit of the kit to install (metadata key labkit-ref)."
  type        = string
  default     = "main"
}

variable "labels" {
  description = "Extra labels for cost tracking (billing reports group by label), added to workshop, kit and role."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.labels : can(regex("^[a-z][a-z0-9_-]{0,62}$", k)) && can(regex("^[a-z0-9_-]{0,63}$", v))])
    error_message = "label keys and values must be lowercase letters, digits, underscores or hyphens (keys start with a letter), at most 63 characters."
  }
}

variable "service_account" {
  description = "Email of the service account every TPU VM runs as: the workshop's own, with no project role."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]+@[a-z0-9-]+\\.iam\\.gserviceaccount\\.com$", var.service_account))
    error_message = "service_account must be a user-managed service account's email (NAME@PROJECT.iam.gserviceaccount.com), never the default compute one."
  }
}

variable "scopes" {
  description = "OAuth scopes of the VMs' token: Cloud Storage read-write only, for the labs/ backups."
  type        = list(string)
  default     = ["https://www.googleapis.com/auth/devstorage.read_write"]

  validation {
    condition     = !contains(var.scopes, "https://www.googleapis.com/auth/cloud-platform")
    error_message = "scopes must not include cloud-platform: a student on the VM could use the token for every API."
  }
}

variable "network_tag" {
  description = "Network tag of every VM; the firewall rule for IAP's range targets it."
  type        = string
}

variable "backup_url" {
  description = "gs:// folder the VMs copy labs/ to every few minutes and restore it from on a new VM (empty: no backups)."
  type        = string
  default     = ""
}

variable "idle_minutes" {
  description = "Minutes with no kernel activity and no login after which a VM saves labs/ and marks itself idle (0: never)."
  type        = number
  default     = 0
}
