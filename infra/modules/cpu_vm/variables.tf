variable "project" {
  description = "Google Cloud project that owns the CPU VMs."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project ID: 6 to 30 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "zone" {
  description = "Zone of the CPU VMs."
  type        = string
  default     = "us-central1-a"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", var.zone))
    error_message = "zone must look like us-central1-a."
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

variable "vm_count" {
  description = "How many CPU VMs to create, for attendees without TPU quota; they run the labs on cpu-1 and cpu-8."
  type        = number
  default     = 0

  validation {
    condition     = var.vm_count >= 0 && var.vm_count <= 100 && floor(var.vm_count) == var.vm_count
    error_message = "vm_count must be a whole number from 0 to 100."
  }
}

variable "machine_type" {
  description = "Machine type of each CPU VM. Four vCPUs run the cpu-8 configuration (eight simulated devices) comfortably."
  type        = string
  default     = "e2-standard-4"

  validation {
    condition     = can(regex("^[a-z][a-z0-9]*-(standard|highmem|highcpu)-[0-9]+$", var.machine_type))
    error_message = "machine_type must be a predefined type such as e2-standard-4 or n2-standard-8."
  }
}

variable "image" {
  description = "Boot image. The startup script needs python3 3.11+ (Debian 12 has 3.11), make and git."
  type        = string
  default     = "debian-cloud/debian-12"
}

variable "disk_size_gb" {
  description = "Boot disk size in GB: the kit's locked environment takes about 1 GB, plus the OS and build outputs."
  type        = number
  default     = 30

  validation {
    condition     = var.disk_size_gb >= 20 && var.disk_size_gb <= 500
    error_message = "disk_size_gb must be from 20 to 500."
  }
}

variable "spot" {
  description = "Create Spot VMs: cheaper, but Google Cloud may stop them at any time."
  type        = bool
  default     = false
}

variable "network" {
  description = "VPC network the CPU VMs join."
  type        = string
  default     = "default"

  validation {
    condition     = length(var.network) > 0
    error_message = "network must name a VPC network, e.g. default."
  }
}

variable "subnetwork" {
  description = "Subnetwork in the zone's region; null takes the network's default."
  type        = string
  default     = null
}

variable "external_ips" {
  description = "Give each VM an external IP address (needed to install the kit from the package index unless the network has Cloud NAT)."
  type        = bool
  default     = true
}

variable "startup_script" {
  description = "Text of the startup script run at boot (infra/startup.sh)."
  type        = string
}

variable "kit_repo" {
  description = "Git URL the VM clones the kit from; the startup script reads it from the labkit-repo metadata key."
  type        = string

  validation {
    condition     = length(var.kit_repo) > 0
    error_message = "kit_repo must be a git URL."
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
