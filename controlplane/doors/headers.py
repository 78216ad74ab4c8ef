"""Security headers: the Content-Security-Policy of Django's pages, and the fixed headers of /v1.

Django's pages (admin, management API, health, metrics) get theirs from middleware: SecurityMiddleware
(nosniff, Referrer-Policy), XFrameOptionsMiddleware (DENY) and django-csp (settings.CONTENT_SECURITY_POLICY).
The API's browsable docs serve Swagger UI and ReDoc from this server (drf-spectacular-sidecar, no
inline script); ReDoc alone needs more than the admin's policy: it parses the schema in a Web Worker
started from a blob: URL, so those two pages add that worker source (DOCS_POLICY_UPDATE) and nothing else.

/v1 runs below Django's middleware (controlplane/gateway/handler.py), so `with_api_headers` adds
fixed headers to its response-start message: a JSON or event-stream body is never a document, so
`default-src 'none'` costs nothing and keeps a sniffing browser from running anything in one.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts

DOCS_PATHS = ("/api/v1/docs/", "/api/v1/redoc/")
DOCS_POLICY_UPDATE = {
    "worker-src": ["'self'", "blob:"],
}

API_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'"),
)
_API_HEADER_NAMES = frozenset(name for name, _ in API_HEADERS)


class DoorsCSPMiddleware(CSPMiddleware):
    def get_policy_parts(self, request, response, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only and request.path_info.startswith(DOCS_PATHS):
            parts.update = {**(parts.update or {}), **DOCS_POLICY_UPDATE}
        return parts


def with_api_headers(send):
    """`send` for an ASGI response that adds API_HEADERS to its start message (those the app did not set)."""

    async def send_with_headers(message):
        if message["type"] == "http.response.start":
            headers = message.get("headers") or ()
            if any(name.lower() in _API_HEADER_NAMES for name, _ in headers):  # rare: keep the app's own
                present = {name.lower() for name, _ in headers}
                extra = [pair for pair in API_HEADERS if pair[0] not in present]
            else:
                extra = API_HEADERS
            message = {**message, "headers": [*headers, *extra]}
        await send(message)

    return send_with_headers
