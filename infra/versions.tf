terraform {
  # 1.9 or newer: a variable's validation may refer to another variable (spot against preemptible).
  required_version = ">= 1.9"
  required_providers {
    # 6.25.0 is the oldest release with every argument used here (google_tpu_v2_vm's
    # scheduling_config.spot came in 6.25.0); tests/kit/test_infra_schema.py checks every argument
    # against the provider's published schema (6.50.0, the newest before 7.0).
    google = {
      source  = "hashicorp/google"
      version = ">= 6.25, < 7.0"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 6.25, < 7.0"
    }
  }
  # State is local (infra/terraform.tfstate) unless the organiser keeps it in Cloud Storage, so that
  # another organiser can run `workshop.sh down`; see docs/workshop.md ("Terraform state"):
  #   terraform -chdir=infra init -backend-config=backend.gcs.hcl    (with a backend "gcs" {} block in backend.tf)
}

provider "google" {
  project = var.project
}

# google_tpu_v2_vm (TPU VMs with spot scheduling) is in the beta provider.
provider "google-beta" {
  project = var.project
}
