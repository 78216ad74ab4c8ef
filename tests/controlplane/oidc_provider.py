"""A small, real OpenID Connect provider for the SSO tests, built on authlib's authorization server.

Served over HTTP from a thread on a free port: discovery, JWKS (an RSA key generated at start),
the authorization endpoint (auto-approves `user_claims` without a page, or refuses when `deny`),
the token endpoint (authorization code + PKCE, client_secret_basic or client_secret_post, ID
token signed RS256 by authlib's OpenIDCode) and userinfo (bearer access token).

Knobs for attacks: `id_token_overrides` (e.g. another `aud` or `iss`), `sign_with_foreign_key`
(a key the JWKS does not publish, under the published `kid`), `userinfo_overrides`.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from authlib.oauth2 import AuthorizationServer, OAuth2Error
from authlib.oauth2.rfc6749 import OAuth2Request
from authlib.oauth2.rfc6749.grants import AuthorizationCodeGrant
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode
from joserfc.jwk import RSAKey

# The provider speaks plain HTTP on 127.0.0.1; authlib refuses that unless told it is a test
# (read at each request, so setting it here is in time).
os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")


@dataclass
class Client:
    client_id: str
    client_secret: str
    redirect_uris: list[str]
    auth_method: str = "client_secret_basic"

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return self.redirect_uris[0] if self.redirect_uris else None

    def get_allowed_scope(self, scope):
        return scope

    def check_redirect_uri(self, redirect_uri):
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret):
        return secrets.compare_digest(client_secret, self.client_secret)

    def check_endpoint_auth_method(self, method, endpoint):
        return endpoint != "token" or method == self.auth_method

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type == "authorization_code"


@dataclass
class Person:
    claims: dict  # a snapshot at approval time: later edits apply to the next sign-in

    def get_user_id(self):
        return self.claims["sub"]


@dataclass
class Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    nonce: str | None
    person: Person
    code_challenge: str | None
    code_challenge_method: str | None
    amr: list[str]
    issued_at: float = field(default_factory=time.time)

    def get_redirect_uri(self):
        return self.redirect_uri

    def get_scope(self):
        return self.scope

    def get_nonce(self):
        return self.nonce

    def get_auth_time(self):
        return int(self.issued_at)

    def get_acr(self):
        return None

    def get_amr(self):
        return self.amr


class _Request(OAuth2Request):
    def __init__(self, method, uri, headers, query, form):
        super().__init__(method, uri, headers=headers)
        self._query, self._form = query, form
        self.payload = BasicOAuth2Payload({**query, **form})

    @property
    def args(self):
        return self._query

    @property
    def form(self):
        return self._form


class OIDCProvider:
    def __init__(self, *, client_id: str = "tessera-admin", client_secret: str | None = None,
                 redirect_uris: list[str] | None = None, auth_method: str = "client_secret_basic"):
        self.client = Client(client_id, client_secret or secrets.token_urlsafe(24), list(redirect_uris or []),
                             auth_method)
        self.key = RSAKey.generate_key(2048, parameters={"kid": secrets.token_hex(8), "use": "sig", "alg": "RS256"})
        self.user_claims: dict = {"sub": "user-1", "email": "person@example.com", "email_verified": True,
                                  "preferred_username": "person", "groups": []}
        self.amr: list[str] = ["pwd", "otp"]
        self.deny = False
        self.id_token_overrides: dict = {}
        self.userinfo_overrides: dict = {}
        self.sign_with_foreign_key = False
        self.codes: dict[str, Code] = {}
        self.tokens: dict[str, Person] = {}
        self.token_requests = 0
        self.paths_served: list[str] = []
        self._lock = threading.Lock()
        self._server = self._authorization_server()
        self._http: ThreadingHTTPServer | None = None
        self._stopped = False

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> OIDCProvider:
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, name="oidc-provider", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop answering (idempotent; `issuer` keeps naming the address it had)."""
        if self._http is not None and not self._stopped:
            self._stopped = True
            self._http.shutdown()
            self._http.server_close()

    @property
    def issuer(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def discovery(self) -> dict:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "code_challenge_methods_supported": ["S256"],
            "scopes_supported": ["openid", "email", "profile", "groups"],
        }

    def jwks(self) -> dict:
        return {"keys": [self.key.as_dict(private=False)]}

    # --- authlib's server, wired to this object --------------------------------------------------
    def _authorization_server(self) -> AuthorizationServer:
        provider = self

        class Server(AuthorizationServer):
            def query_client(self, client_id):
                return provider.client if client_id == provider.client.client_id else None

            def save_token(self, token, request):
                with provider._lock:
                    provider.tokens[token["access_token"]] = request.user

            def create_oauth2_request(self, request):
                return request

            def handle_response(self, status, body, headers):
                return status, body, headers

            def send_signal(self, name, *args, **kwargs):
                pass

        class CodeGrant(AuthorizationCodeGrant):
            TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]

            def save_authorization_code(self, code, request):
                data = request.payload.data
                with provider._lock:
                    provider.codes[code] = Code(
                        code=code, client_id=request.client.client_id, redirect_uri=data.get("redirect_uri"),
                        scope=data.get("scope", ""), nonce=data.get("nonce"), person=request.user,
                        code_challenge=data.get("code_challenge"),
                        code_challenge_method=data.get("code_challenge_method"), amr=list(provider.amr))

            def query_authorization_code(self, code, client):
                found = provider.codes.get(code)
                if found and found.client_id == client.client_id and time.time() - found.issued_at < 60:
                    return found
                return None

            def delete_authorization_code(self, authorization_code):
                with provider._lock:
                    provider.codes.pop(authorization_code.code, None)

            def authenticate_user(self, authorization_code):
                return authorization_code.person

        class OpenIDCodeExtension(OpenIDCode):
            def exists_nonce(self, nonce, request):
                return any(code.nonce == nonce for code in provider.codes.values())

            def resolve_client_private_key(self, client):
                if provider.sign_with_foreign_key:
                    return RSAKey.generate_key(2048, parameters={"kid": provider.key.kid})
                return provider.key

            def get_client_algorithm(self, client):
                return "RS256"

            def get_encode_header(self, client):
                return {"alg": "RS256", "kid": provider.key.kid}

            def get_client_claims(self, client):
                return {"iss": provider.issuer, "aud": [client.get_client_id()]}

            def generate_user_info(self, user, scope):
                # The ID token carries every claim (overrides last: they may replace iss or aud).
                return UserInfo({**user.claims, **provider.id_token_overrides})

        server = Server(scopes_supported=["openid", "email", "profile", "groups"])
        server.register_token_generator("default", BearerTokenGenerator(
            access_token_generator=lambda **kwargs: secrets.token_urlsafe(32),
            expires_generator=lambda *args, **kwargs: 300))
        server.register_grant(CodeGrant, [OpenIDCodeExtension(require_nonce=True), CodeChallenge(required=True)])
        return server

    def authorize(self, request: _Request) -> tuple[int, object, list]:
        person = None if self.deny else Person(dict(self.user_claims))
        try:
            grant = self._server.get_consent_grant(request=request, end_user=person)
        except OAuth2Error as error:
            return error.status_code, {"error": error.error, "error_description": error.description}, []
        return self._server.create_authorization_response(request=request, grant_user=person, grant=grant)

    def token(self, request: _Request) -> tuple[int, object, list]:
        self.token_requests += 1
        return self._server.create_token_response(request)

    def userinfo(self, authorization: str) -> tuple[int, object, list]:
        scheme, _, token = (authorization or "").partition(" ")
        person = self.tokens.get(token) if scheme.lower() == "bearer" else None
        if person is None:
            return 401, {"error": "invalid_token"}, [("WWW-Authenticate", 'Bearer error="invalid_token"')]
        return 200, {**person.claims, **self.userinfo_overrides}, []


def _handler_for(provider: OIDCProvider):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _request(self) -> _Request:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            query = dict(parse_qsl(parts.query))
            form = dict(parse_qsl(body)) if "form-urlencoded" in (self.headers.get("Content-Type") or "") else {}
            return _Request(self.command, f"{provider.issuer}{self.path}", self.headers, query, form)

        def _answer(self, status: int, body, headers) -> None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            data = data.encode() if isinstance(data, str) else data
            self.send_response(status)
            names = {name.lower() for name, _ in headers}
            for name, value in headers:
                self.send_header(name, value)
            if data and "content-type" not in names:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = urlsplit(self.path).path
            provider.paths_served.append(path)
            if path == "/.well-known/openid-configuration":
                return self._answer(200, provider.discovery(), [])
            if path == "/jwks":
                return self._answer(200, provider.jwks(), [])
            if path == "/authorize":
                return self._answer(*provider.authorize(self._request()))
            if path == "/userinfo":
                return self._answer(*provider.userinfo(self.headers.get("Authorization", "")))
            return self._answer(404, {"error": "not_found"}, [])

        def do_POST(self):
            provider.paths_served.append(urlsplit(self.path).path)
            if urlsplit(self.path).path == "/token":
                return self._answer(*provider.token(self._request()))
            return self._answer(404, {"error": "not_found"}, [])

    return Handler
