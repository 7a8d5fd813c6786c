"""The HTTP API under ``/api/v1/{org}/{project}/`` (DESIGN.md section 7)."""
