"""PostgreSQL refuses UPDATE and DELETE on the audit table, whoever asks, unless the transaction set
`tessera.audit_prune = 'on'` (the retention prune does; controlplane/audit/retention.py).

Row-level triggers do not fire for TRUNCATE, which test databases use to empty tables; the
application never truncates. A database role without UPDATE and DELETE grants on the table is the
stronger guarantee where the operator can give the application its own role (docs/controlplane.md).
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION audit_event_refuse_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(current_setting('tessera.audit_prune', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit events are append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""
TRIGGER = """
CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON audit_auditevent
FOR EACH ROW EXECUTE FUNCTION audit_event_refuse_change();
"""
DROP = """
DROP TRIGGER IF EXISTS audit_event_append_only ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_event_refuse_change();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION, params=None)
        schema_editor.execute(TRIGGER, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
