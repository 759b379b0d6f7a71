variable "project" {
  description = "Google Cloud project that pays for the workshop (it needs TPU quota in the zone for the TPU VMs)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project ID: 6 to 30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "workshop" {
  description = "Short name of the workshop: prefix of every VM name and the value of the `workshop` label on everything created (cost tracking and cleanup)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.workshop))
    error_message = "workshop must be 1 to 20 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "zone" {
  description = "Zone of the TPU VMs (and of the CPU VMs unless cpu_zone is set)."
  type        = string
  default     = "us-central1-a"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$", var.zone))
    error_message = "zone must look like us-central1-a (or an AI zone such as us-central1-ai1a)."
  }
}

variable "tpu_count" {
  description = "Number of TPU VMs: one per student or team."
  type        = number
  default     = 1

  validation {
    condition     = var.tpu_count >= 0 && var.tpu_count <= 100 && floor(var.tpu_count) == var.tpu_count
    error_message = "tpu_count must be a whole number from 0 to 100."
  }
}

variable "accelerator_type" {
  description = "TPU type of each TPU VM; v5litepod-8 is 8 chips on one host, so `jax.devices()` shows 8 devices."
  type        = string
  default     = "v5litepod-8"

  validation {
    condition     = can(regex("^(v2|v3|v4|v5p|v5litepod|v6e)-[0-9]+$", var.accelerator_type))
    error_message = "accelerator_type must be a Cloud TPU type such as v5litepod-8, v6e-8, v4-8 or v5p-8."
  }
}

variable "runtime_version" {
  description = "TPU VM software version, matching the generation: v2-alpha-tpuv5-lite (v5e), v2-alpha-tpuv6e (v6e), v2-alpha-tpuv5 (v5p), tpu-ubuntu2204-base (v2 to v4); `workshop.sh up` checks it against infra/tpu-types.tsv."
  type        = string
  default     = "v2-alpha-tpuv5-lite"

  validation {
    condition     = length(var.runtime_version) > 0
    error_message = "runtime_version must not be empty."
  }
}

variable "spot" {
  description = "Spot VMs (TPU and CPU): much cheaper, but Google Cloud may stop them at any time."
  type        = bool
  default     = false
}

variable "preemptible" {
  description = "Preemptible TPU VMs, the older form of Spot. Use spot or preemptible, not both."
  type        = bool
  default     = false

  validation {
    condition     = !(var.preemptible && var.spot)
    error_message = "choose either spot or preemptible, not both."
  }
}

variable "network" {
  description = "VPC network of every VM."
  type        = string
  default     = "default"

  validation {
    condition     = length(var.network) > 0
    error_message = "network must name a VPC network, e.g. default."
  }
}

variable "subnetwork" {
  description = "Subnetwork of every VM; null takes the network's own."
  type        = string
  default     = null
}

variable "external_ips" {
  description = "Give every VM an external IP address. Off by default: students come in through IAP (the firewall rule for 35.235.240.0/20 is created here) and the VMs reach the package index through Cloud NAT (cloud_nat)."
  type        = bool
  default     = false
}

variable "cpu_count" {
  description = "Number of CPU VMs, for attendees without TPU quota."
  type        = number
  default     = 0

  validation {
    condition     = var.cpu_count >= 0 && var.cpu_count <= 100 && floor(var.cpu_count) == var.cpu_count
    error_message = "cpu_count must be a whole number from 0 to 100."
  }
}

variable "cpu_zone" {
  description = "Zone of the CPU VMs; null means the same zone as the TPU VMs."
  type        = string
  default     = null
}

variable "machine_type" {
  description = "Machine type of each CPU VM."
  type        = string
  default     = "e2-standard-4"

  validation {
    condition     = can(regex("^[a-z][a-z0-9]*-(standard|highmem|highcpu)-[0-9]+$", var.machine_type))
    error_message = "machine_type must be a predefined type such as e2-standard-4 or n2-standard-8."
  }
}

variable "kit_repo" {
  description = "Git URL the VMs clone the kit from (your copy of this repository, with the labs for the day)."
  type        = string

  validation {
    condition     = can(regex("^https://", var.kit_repo))
    error_message = "kit_repo must be an https:// git URL: the VMs hold no ssh key, so git@ and ssh:// URLs cannot be cloned there."
  }
}

variable "kit_ref" {
  description = "Branch, tag or commit of the kit to install; pin a tag so every VM gets the same labs."
  type        = string
  default     = "main"

  validation {
    condition     = length(var.kit_ref) > 0
    error_message = "kit_ref must name a branch, tag or commit."
  }
}

variable "labels" {
  description = "Extra labels for cost tracking, e.g. { cost-center = \"teaching\" }; workshop, kit and role are always set."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.labels : can(regex("^[a-z][a-z0-9_-]{0,62}$", k)) && can(regex("^[a-z0-9_-]{0,63}$", v))])
    error_message = "label keys and values must be lowercase letters, digits, underscores or hyphens (keys start with a letter), at most 63 characters."
  }
}

variable "roster" {
  description = "CSV file (path relative to infra/, or absolute) with the columns student,account[,kind]: one VM per row, named WORKSHOP-STUDENT, reachable only by that Google account; kind is tpu (default) or cpu. When set, tpu_count and cpu_count are ignored."
  type        = string
  default     = null

  validation {
    condition = var.roster == null ? true : alltrue([
      for row in csvdecode(file(var.roster)) :
      can(regex("^[a-z][a-z0-9-]{0,30}[a-z0-9]$", row.student)) && can(regex("^[^@ ]+@[^@ ]+$", row.account)) && contains(["tpu", "cpu"], coalesce(lookup(row, "kind", ""), "tpu"))
    ])
    error_message = "every roster row needs a student id (2 to 32 lowercase letters, digits or hyphens, starting with a letter), an account (a Google account's email) and, if given, a kind of tpu or cpu."
  }
}

variable "cloud_nat" {
  description = "Create a Cloud Router and Cloud NAT in the VMs' regions, so that VMs without external addresses can install the kit; false where the network has NAT already."
  type        = bool
  default     = true
}

variable "idle_minutes" {
  description = "Minutes with no kernel activity and no login after which a VM saves labs/ to the bucket and stops (CPU VMs) or marks itself idle for `workshop.sh idle` to delete (TPU VMs); 0 turns it off."
  type        = number
  default     = 60

  validation {
    condition     = var.idle_minutes == 0 || (var.idle_minutes >= 15 && var.idle_minutes <= 1440)
    error_message = "idle_minutes must be 0 (off) or from 15 to 1440."
  }
}

variable "hours" {
  description = "Planned length of the workshop in hours: `workshop.sh up` prints the cost for it, and the budget alert (if any) uses it."
  type        = number
  default     = 8

  validation {
    condition     = var.hours > 0 && var.hours <= 720
    error_message = "hours must be more than 0 and at most 720 (30 days)."
  }
}

variable "usd_per_hour" {
  description = "Price of one TPU VM per hour in US dollars, for a type infra/prices.tsv does not list (`workshop.sh up` refuses an unpriced type without it)."
  type        = number
  default     = null
}

variable "billing_account" {
  description = "Billing account ID (XXXXXX-XXXXXX-XXXXXX) for an optional budget alert on the workshop's labelled spend; null: no budget."
  type        = string
  default     = null

  validation {
    condition     = var.billing_account == null ? true : can(regex("^[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}$", var.billing_account))
    error_message = "billing_account must look like 012345-6789AB-CDEF01."
  }
}

variable "budget_usd" {
  description = "Amount of the budget alert in US dollars (alerts at 50%, 90% and 100%); used only with billing_account."
  type        = number
  default     = 1000

  validation {
    condition     = var.budget_usd > 0
    error_message = "budget_usd must be a positive amount of US dollars."
  }
}

variable "queued_resources" {
  description = "Make the TPU VMs through queued resources (what Google recommends for TPU capacity, and the way to Spot TPUs), with `gcloud compute tpus queued-resources create` from workshop.sh: the provider's google_tpu_v2_queued_resource cannot set the metadata, labels, service account or Spot the kit needs."
  type        = bool
  default     = false

  validation {
    condition     = !(var.queued_resources && var.preemptible)
    error_message = "queued_resources makes Spot TPU VMs (spot = true) or on-demand ones, not preemptible ones."
  }
}
