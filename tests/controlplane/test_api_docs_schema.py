"""The management API's OpenAPI schema builds without a warning: every authenticator is described and
every choice set has a stable name (a warning hides the next real one among the old)."""

import io

import pytest
import yaml
from django.core.management import call_command


@pytest.mark.django_db
def test_schema_builds_without_warnings_and_names_its_enums(tmp_path):
    out = tmp_path / "schema.yaml"
    stderr = io.StringIO()
    call_command("spectacular", "--fail-on-warn", "--file", str(out), stderr=stderr)
    assert "Warning" not in stderr.getvalue(), stderr.getvalue()
    schemas = yaml.safe_load(out.read_text())["components"]["schemas"]
    assert {"TenantStatusEnum", "WorkerStatusEnum", "ReplicaStatusEnum"} <= set(schemas)
    assert not [name for name in schemas if name.startswith("Status") and name.endswith("Enum")]
    schemes = yaml.safe_load(out.read_text())["components"]["securitySchemes"]
    assert {"cookieAuth", "basicAuth", "tenantApiKey"} <= set(schemes)
