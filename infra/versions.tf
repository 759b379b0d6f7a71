terraform {
  # 1.9 or newer: a variable's validation may refer to another variable (spot against preemptible).
  required_version = ">= 1.9"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.30, < 7.0"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 5.30, < 7.0"
    }
  }
}

provider "google" {
  project = var.project
}

# google_tpu_v2_vm (TPU VMs with spot scheduling) is in the beta provider.
provider "google-beta" {
  project = var.project
}
