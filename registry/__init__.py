"""Checkpoint download (Hugging Face Hub), artifact stores (local dir, S3), manifests, Kubernetes YAML."""
