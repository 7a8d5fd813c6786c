"""The HTTP API under ``/api/v1/{org}/{project}/`` (docs/concepts/web-service.md)."""
