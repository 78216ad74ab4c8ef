"""Management API for deployments: operators manage models, workers and deployments; tenants their adapters."""
