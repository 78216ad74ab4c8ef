"""JSON stored as its text, for the answers a model writes.

PostgreSQL's `jsonb` (Django's JSONField there) refuses the string escape `\\u0000`, since its text
type cannot hold the NUL it stands for; a model can answer one (a completions line with `echo: true`
and a prompt token that decodes to byte 0, or a `logit_bias` that forces it). This field keeps the
serialised JSON itself in a text column: JSON escapes every control character, so the column never
holds a NUL byte and any answer the gateway could parse is stored and read back unchanged, on
PostgreSQL and SQLite alike. Nothing queries inside these documents, so `jsonb`'s operators are not
missed.
"""

from __future__ import annotations

import orjson
from django.db import models


class JSONTextField(models.TextField):
    description = "A JSON document stored as its serialised text"

    def from_db_value(self, value, expression, connection):
        return None if value is None else orjson.loads(value)

    def to_python(self, value):
        if isinstance(value, str):
            return orjson.loads(value)
        return value

    def get_prep_value(self, value):
        # orjson escapes control characters (NUL as \u0000) and refuses what JSON cannot say
        # (a lone surrogate): such an answer fails here, before the database is asked.
        return None if value is None else orjson.dumps(value).decode()

    def value_to_string(self, obj) -> str:
        return self.get_prep_value(self.value_from_object(obj)) or ""
