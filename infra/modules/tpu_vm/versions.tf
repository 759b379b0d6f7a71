terraform {
  required_version = ">= 1.9"
  required_providers {
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 5.30, < 7.0"
    }
  }
}
