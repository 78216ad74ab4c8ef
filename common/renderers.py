"""The management API's download formats: renderers that let a client ask for a file by `Accept`.

A download view streams its own bytes (`StreamingHttpResponse`), which bypasses renderers; DRF still
needs a renderer per media type to accept the request, and only an error body is ever rendered by
one (as JSON). The billing exports and the audit export both use these.
"""

from __future__ import annotations

import json

from rest_framework import renderers


class _Passthrough(renderers.BaseRenderer):
    """Lets clients send `Accept: text/csv`; successful responses stream and bypass renderers."""

    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        return json.dumps(data).encode()  # only errors get here


class CSVRenderer(_Passthrough):
    media_type, format = "text/csv", "csv"


class ParquetRenderer(_Passthrough):
    media_type, format = "application/vnd.apache.parquet", "parquet"


class JSONLinesRenderer(_Passthrough):
    media_type, format = "application/jsonl", "jsonl"
