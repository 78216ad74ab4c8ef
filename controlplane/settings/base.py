"""Settings shared by every environment; all of it can be overridden from the environment."""

import json
import os
from pathlib import Path

import dj_database_url
from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("TESSERA_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-insecure-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")

INSTALLED_APPS = [
    # Before the admin: its admin/login.html extends the admin's and adds "Sign in with SSO".
    "controlplane.sso",
    # django.contrib.admin with the two-step sign-in site (controlplane/doors/site.py).
    "controlplane.doors.apps.DoorsAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc as static files: the docs work offline
    "tenants",
    "billing",
    "controlplane.gateway",
    "controlplane.deployments",
    "controlplane.slo",
    "controlplane.batches",
    "controlplane.audit",
    # The doors: sign-in lockout, two-factor for staff, security headers (docs/controlplane.md).
    "controlplane.doors.apps.DoorsConfig",
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The admin's CSS/JS and the API docs' assets from STATIC_ROOT, before anything touches the database.
    "controlplane.static_files.AsyncWhiteNoiseMiddleware",
    # The database or Redis unreachable in a view: 503 + Retry-After, not a 500 (controlplane/unavailable.py).
    "controlplane.unavailable.DependencyUnavailableMiddleware",
    "controlplane.doors.headers.DoorsCSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",  # request.user.is_verified(): passed a second factor in this session
    # Who changes what through the admin and the management API (controlplane/audit).
    "controlplane.audit.middleware.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A password POST to the admin's login is refused when TESSERA_ADMIN_PASSWORD_LOGIN is off.
    "controlplane.sso.middleware.PasswordLoginGate",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Turns a sign-in that axes flagged as locked out into the lockout response (last: sees the view's result).
    "axes.middleware.AxesMiddleware",
]

# axes first: it refuses a locked-out username or address before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Django's password check, which TESSERA_ADMIN_PASSWORD_LOGIN=false turns off everywhere.
    "controlplane.sso.backends.PasswordBackend",
    # OpenID Connect sign-in (acts only in its callback, only when TESSERA_OIDC_ISSUER is set).
    "controlplane.sso.backends.OIDCBackend",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'tessera.sqlite3'}"), conn_max_age=60
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Writers take the lock at BEGIN, so the database limiter's read-modify-write never deadlocks
    # on a lock upgrade; several processes then queue on the file lock instead of failing.
    # WAL: readers (key lookups) never wait for the ledger writer, and the writer never waits for them.
    # Our backend: a process's writer threads take turns on a lock, not in SQLite's sleeping busy handler.
    DATABASES["default"]["ENGINE"] = "controlplane.db.sqlite3"
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
    )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A database that does not answer must fail a connection in seconds (the gateway then serves keys
    # from memory and spools usage), not after the OS's TCP timeout.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", int(os.environ.get("TESSERA_DB_CONNECT_TIMEOUT", "3")))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", None)
# The control plane's own queue (workers each consume `worker.<id>`); name it per deployment when
# several control planes share one broker.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("TESSERA_CONTROL_QUEUE", "celery")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # One folder for messages in both directions (every process on this machine reads and writes it),
    # shared with the data-plane workers' agents (dataplane/worker/agent/settings.py: the same layout).
    _BROKER_DIR = Path(os.environ.get("TESSERA_BROKER_FOLDER", VAR_DIR / "broker"))
    for _sub in ("queue", "processed", "control"):
        (_BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "queue"), "data_folder_out": str(_BROKER_DIR / "queue"),
        "processed_folder": str(_BROKER_DIR / "processed"), "control_folder": str(_BROKER_DIR / "control"),
    }
# Periodic tasks (`celery -A controlplane beat`): the deployments reconciler and billing's sweepers.
CELERY_BEAT_SCHEDULE = {
    "deployments-reconcile": {
        "task": "deployments.reconcile",
        "schedule": float(os.environ.get("TESSERA_RECONCILE_SECONDS", "5")),
        "options": {"expires": float(os.environ.get("TESSERA_RECONCILE_SECONDS", "5")) * 2},
    },
    "gateway-usage-sweep": {"task": "gateway.usage_sweep", "schedule": 60.0, "options": {"expires": 120.0}},
    # Batches whose runner died (its lease passed) are run again (controlplane/batches/tasks.py).
    "batches-resume": {"task": "batches.resume", "schedule": 60.0, "options": {"expires": 120.0}},
    "gateway-responses-prune": {"task": "gateway.responses_prune", "schedule": 3600.0, "options": {"expires": 1800.0}},
    "billing-stripe-report-pending": {"task": "billing.stripe_report_pending", "schedule": 60.0},
    "billing-stripe-sync-pending": {"task": "billing.stripe_sync_pending", "schedule": 60.0},
    "billing-usage-daily-rollup": {"task": "billing.usage_daily_rollup", "schedule": 15 * 60.0},
    # Unit economics (docs/economics.md): replicas' serving time sampled every minute, costs rebuilt hourly-ish.
    "billing-replica-spans-observe": {"task": "billing.replica_spans_observe", "schedule": 60.0,
                                      "options": {"expires": 120.0}},
    "billing-cost-hours-rebuild": {"task": "billing.cost_hours_rebuild", "schedule": 15 * 60.0},
    "billing-cost-hours-rebuild-daily": {"task": "billing.cost_hours_rebuild", "kwargs": {"hours": 48},
                                         "schedule": crontab(minute=45, hour=1)},
    "billing-invoices-build-month": {
        "task": "billing.invoices_build_month",
        "schedule": crontab(minute=30, hour=0, day_of_month=1),
    },
    # Audit events older than TESSERA_AUDIT_RETENTION_DAYS are pruned once a day (controlplane/audit).
    "audit-prune": {"task": "audit.prune", "schedule": crontab(minute=15, hour=3)},
}

STATIC_URL = "static/"
# `manage.py collectstatic` fills it (`make run` does; the image at build time, outside any volume);
# WhiteNoise serves it (controlplane/static_files.py).
STATIC_ROOT = Path(os.environ.get("TESSERA_STATIC_ROOT") or VAR_DIR / "static")
USE_TZ = True
TIME_ZONE = "UTC"


# --- Tessera: tenants, API keys and the gateway -------------------------------------------------
# Reverse proxies in front of this process that append to X-Forwarded-For: the client address that
# lockout and throttling count under is the N-th entry from the right (common/client_ip.py).
# 0 (the default): the header is ignored and the socket's peer is the client.
TESSERA_TRUSTED_PROXY_HOPS = int(os.environ.get("TESSERA_TRUSTED_PROXY_HOPS", "0"))
# Server secret for the keyed hash of API keys. Changing it invalidates every key.
TESSERA_API_KEY_SECRET = os.environ.get("TESSERA_API_KEY_SECRET", SECRET_KEY)
# How long a gateway process trusts a key lookup before asking the database again (revocation,
# suspension and tier changes reach other processes within this many seconds).
TESSERA_AUTH_CACHE_SECONDS = float(os.environ.get("TESSERA_AUTH_CACHE_SECONDS", "2"))
# gc.freeze() what a gateway process built at start-up (controlplane/asgi.py): full collections then skip it.
TESSERA_GC_FREEZE = os.environ.get("TESSERA_GC_FREEZE", "1") == "1"
# Failed API-key authentications (401s) one client address may make on /v1 and /api/v1 in a burst, and
# per minute after it; past that it gets 429 too_many_failed_auth (tenants/auth_throttle.py). 0 = off.
TESSERA_AUTH_FAILURES_PER_MINUTE = int(os.environ.get("TESSERA_AUTH_FAILURES_PER_MINUTE", "20"))
# While the database does not answer, keys looked up within this many seconds keep being served from
# memory (docs/reliability.md); 0 refuses every request (503) during a database outage.
TESSERA_AUTH_STALE_SECONDS = float(os.environ.get("TESSERA_AUTH_STALE_SECONDS", "300"))
# Where each gateway process spools usage while the database does not answer (controlplane/gateway/
# spool.py): a local disk that survives a restart of the process (a volume in a container), and the
# cap of one process's file; past it new requests are refused (503) rather than served unbilled.
TESSERA_USAGE_SPOOL_DIR = Path(os.environ.get("TESSERA_USAGE_SPOOL_DIR", VAR_DIR / "spool"))
TESSERA_USAGE_SPOOL_MAX_BYTES = int(os.environ.get("TESSERA_USAGE_SPOOL_MAX_BYTES", str(256 * 1024 * 1024)))
# Empty (the default): the gateway routes to the ready workers and replicas the deployments registry
# knows (controlplane/deployments/routing.py). Set, a static comma-separated list of worker base URLs
# that the gateway polls itself (a fallback for running without the deployments machinery).
TESSERA_WORKERS = os.environ.get("TESSERA_WORKERS", "")
TESSERA_WORKER_TOKEN = os.environ.get("TESSERA_WORKER_TOKEN", "")
# Seconds between polls of each worker's /ready and /v1/models.
TESSERA_WORKER_POLL_SECONDS = float(os.environ.get("TESSERA_WORKER_POLL_SECONDS", "2"))
# How the gateway picks among ready workers (controlplane/gateway/routing/workers.py): cache_aware (the longest
# tenant-salted prefix it sent there recently, against load), affinity, least_loaded or round_robin.
TESSERA_ROUTING_POLICY = os.environ.get("TESSERA_ROUTING_POLICY", "cache_aware")
# cache_aware's memory of one worker's cache, in 128-character chunks (~32 tokens): size it like the
# workers' KV caches (the default: 256 MiB of SmolLM2-135M cache) so it forgets what they evict.
TESSERA_ROUTING_CACHE_CHUNKS = int(os.environ.get("TESSERA_ROUTING_CACHE_CHUNKS", "360"))
# cache_aware's table shared by every gateway process through Redis (REDIS_URL; salted chunk hashes
# only, controlplane/gateway/routing/shared_prefixes.py): on by default when REDIS_URL is set ("0" turns it off).
TESSERA_ROUTING_SHARED = os.environ.get("TESSERA_ROUTING_SHARED", "1" if REDIS_URL else "0") == "1"
# The longest a request waits for the shared table before routing on this gateway's own one.
TESSERA_ROUTING_SHARED_TIMEOUT_SECONDS = float(os.environ.get("TESSERA_ROUTING_SHARED_TIMEOUT_SECONDS", "0.05"))
# After Redis did not answer, routing stays on the local table this long before asking again.
TESSERA_ROUTING_SHARED_RETRY_SECONDS = float(os.environ.get("TESSERA_ROUTING_SHARED_RETRY_SECONDS", "5"))
# A worker's shared set expires this long after the last request routed there (a worker that left).
TESSERA_ROUTING_SHARED_TTL_SECONDS = float(os.environ.get("TESSERA_ROUTING_SHARED_TTL_SECONDS", "3600"))
# Upstream timeouts: connect (a failure here is retried on another worker) and per-read.
TESSERA_UPSTREAM_CONNECT_TIMEOUT = float(os.environ.get("TESSERA_UPSTREAM_CONNECT_TIMEOUT", "2"))
TESSERA_UPSTREAM_READ_TIMEOUT = float(os.environ.get("TESSERA_UPSTREAM_READ_TIMEOUT", "300"))
# Completion tokens reserved against tokens/min and budgets when a request omits max_tokens.
TESSERA_DEFAULT_MAX_TOKENS = int(os.environ.get("TESSERA_DEFAULT_MAX_TOKENS", "1024"))
# Stored /v1/responses answers (`store: true`) are kept this many days (OpenAI's default), then pruned.
TESSERA_RESPONSES_RETENTION_DAYS = int(os.environ.get("TESSERA_RESPONSES_RETENTION_DAYS", "30"))
# Prompt tokens a chat template adds per request on top of the messages (markers, a default
# system prompt: SmolLM2's is ~20 tokens), counted in every chat request's prompt estimate.
TESSERA_CHAT_TEMPLATE_TOKENS = int(os.environ.get("TESSERA_CHAT_TEMPLATE_TOKENS", "32"))
# The largest request body accepted anywhere (/v1, /api, /admin): bigger is a 413 before it is read.
TESSERA_MAX_REQUEST_BYTES = int(os.environ.get("TESSERA_MAX_REQUEST_BYTES", str(4 * 1024 * 1024)))
# Django's own limit on what request.body / request.POST may hold: the same cap (its default, 2.5 MB,
# was a RequestDataTooBig, i.e. a 500, for a body the gateway meant to accept).
DATA_UPLOAD_MAX_MEMORY_SIZE = TESSERA_MAX_REQUEST_BYTES
# Where usage events go (dotted path to a callable taking event=UsageEvent).
TESSERA_USAGE_SINK = os.environ.get("TESSERA_USAGE_SINK", "billing.services.usage_record_ingest")
# "inline": each gateway process writes the ledger from a background thread (batched).
# "redis": the gateway RPUSHes events; `manage.py usage_consume` writes them (see gateway/usage/usage_queue.py).
TESSERA_USAGE_QUEUE = os.environ.get("TESSERA_USAGE_QUEUE", "inline")
# Limiter backend: "redis" when REDIS_URL is set, else "database".
TESSERA_LIMITER = os.environ.get("TESSERA_LIMITER", "redis" if REDIS_URL else "database")
# Namespace of the limiter's Redis keys.
TESSERA_REDIS_PREFIX = os.environ.get("TESSERA_REDIS_PREFIX", "tsr")
# Seconds the limiter waits for Redis (connect, and each command) before the request is refused with a 503.
TESSERA_REDIS_TIMEOUT_SECONDS = float(os.environ.get("TESSERA_REDIS_TIMEOUT_SECONDS", "2"))
# A request counts toward concurrency for at most this long if its gateway dies before settling.
TESSERA_RESERVATION_TTL_SECONDS = int(os.environ.get("TESSERA_RESERVATION_TTL_SECONDS", "900"))
# The usage sweeper (controlplane/gateway/usage/sweeper.py, beat every minute): journal rows older than
# MIN_AGE belong to a dead gateway; a request no worker knows is billed at its reservation after GIVE_UP.
TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS = float(os.environ.get("TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS", "60"))
TESSERA_USAGE_SWEEP_GIVE_UP_SECONDS = float(
    os.environ.get("TESSERA_USAGE_SWEEP_GIVE_UP_SECONDS", str(TESSERA_RESERVATION_TTL_SECONDS)))

# --- Audit log (docs/controlplane.md, "Audit log") ------------------------------------------------
# Days an audit event is kept; the daily prune removes older ones (0 keeps them for ever).
TESSERA_AUDIT_RETENTION_DAYS = int(os.environ.get("TESSERA_AUDIT_RETENTION_DAYS", "400"))

# --- Billing and Stripe (docs/billing.md) ------------------------------------------------------------
BILLING_ROUNDING = os.environ.get("BILLING_ROUNDING", "ROUND_HALF_UP")
BILLING_DEFAULT_CURRENCY = os.environ.get("BILLING_DEFAULT_CURRENCY", "usd")
# A fresh install's "Default list price" for any model not priced by name (billing/default_price.py):
# "input,cached_input,output" per 1M tokens; empty: none (every request unpriced until a price is set).
BILLING_DEFAULT_LIST_PRICE = os.environ.get("BILLING_DEFAULT_LIST_PRICE", "0.10,0.05,0.20")
# Empty: Stripe sync is off (invoicing still works locally).
STRIPE_API_KEY = os.environ.get("STRIPE_API_KEY", "")
STRIPE_API_BASE = os.environ.get("STRIPE_API_BASE", "")  # the SDK's API base (tests, proxies)
# Empty: the webhook answers 503.
STRIPE_WEBHOOK_SECRET = os.environ.get("STRIPE_WEBHOOK_SECRET", "")
STRIPE_WEBHOOK_TOLERANCE = int(os.environ.get("STRIPE_WEBHOOK_TOLERANCE", "300"))
STRIPE_MAX_NETWORK_RETRIES = int(os.environ.get("STRIPE_MAX_NETWORK_RETRIES", "2"))
# JSON, e.g. {"input": "my_input_tokens"}: overrides of billing.stripe_sync.DEFAULT_METER_EVENT_NAMES.
STRIPE_METER_EVENT_NAMES = json.loads(os.environ.get("STRIPE_METER_EVENT_NAMES") or "{}")
STRIPE_COLLECTION_METHOD = os.environ.get("STRIPE_COLLECTION_METHOD", "send_invoice")
STRIPE_DAYS_UNTIL_DUE = int(os.environ.get("STRIPE_DAYS_UNTIL_DUE", "30"))

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.api.authentication.APIKeyAuthentication",
        # Django's session and basic authentication under the admin's second-factor rule (doors/drf.py).
        "controlplane.doors.drf.VerifiedSessionAuthentication",
        "controlplane.doors.drf.PasswordOnlyBasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "controlplane.api_errors.drf_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "common.pagination.Pages",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tessera management API",
    "DESCRIPTION": "Tenants manage their API keys and read their limits and usage; operators manage tenants and tiers.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Choice sets named after their model: several fields are called `status`, and an unnamed
    # collision gets a hash for a name that changes when the choices do.
    "ENUM_NAME_OVERRIDES": {
        "BudgetEnforcementEnum": "tenants.models.BudgetEnforcement",
        "TenantStatusEnum": "tenants.models.TenantStatus",
    },
    # Swagger UI and ReDoc from this server's static files (drf-spectacular-sidecar): no CDN, so the
    # docs work on an offline install and the docs pages' policy stays 'self' (controlplane/doors/headers.py).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "jsonlog.JSONFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "loggers": {
        "tessera": {"handlers": ["console"], "level": os.environ.get("TESSERA_LOG_LEVEL", "INFO")},
    },
}

# --- SLOs and overload (issue 9; docs/slo.md) ----------------------------------------------------
# Gateway load shedding: "priority=depth" pairs; a tier whose priority is >= a key is refused (429
# `overloaded`) once every worker's estimated waiting queue reaches that depth. Empty = never shed.
TESSERA_SHED_QUEUE_DEPTH = os.environ.get("TESSERA_SHED_QUEUE_DEPTH", "20=16,30=4")
# Seconds the SLO gauges on /metrics are cached (each computation is one aggregate query).
TESSERA_SLO_METRICS_CACHE_SECONDS = float(os.environ.get("TESSERA_SLO_METRICS_CACHE_SECONDS", "15"))

# --- The doors: sign-in lockout, two-factor, headers (docs/controlplane.md; controlplane/doors) ---------
# Failed sign-ins per username and, separately, per client address (TESSERA_TRUSTED_PROXY_HOPS) before
# a lockout; the first lockout's length, doubling with each failure after it, up to the maximum (failures
# are forgotten that long after the last one). An operator unlocks with `manage.py login_unlock`.
TESSERA_LOGIN_FAILURE_LIMIT = int(os.environ.get("TESSERA_LOGIN_FAILURE_LIMIT", "5"))
TESSERA_LOGIN_COOLOFF_SECONDS = float(os.environ.get("TESSERA_LOGIN_COOLOFF_SECONDS", "300"))
TESSERA_LOGIN_COOLOFF_MAX_SECONDS = float(os.environ.get("TESSERA_LOGIN_COOLOFF_MAX_SECONDS", "86400"))
AXES_HANDLER = "controlplane.doors.lockout.GrowingCoolOffHandler"
AXES_FAILURE_LIMIT = "controlplane.doors.lockout.failure_limit"  # TESSERA_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = "controlplane.doors.lockout.cool_off"
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one reaching the limit locks
AXES_CLIENT_IP_CALLABLE = "controlplane.doors.lockout.client_ip_for_axes"
AXES_USERNAME_CALLABLE = "controlplane.doors.lockout.username_for_axes"
AXES_LOCKOUT_CALLABLE = "controlplane.doors.responses.lockout_response"
AXES_WHITELIST_CALLABLE = "controlplane.doors.lockout.not_a_password_attempt"  # SSO callbacks
# Masked in the POST data axes keeps with each failure (passwords always are): second-factor codes too.
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "code", "csrfmiddlewaretoken"]
AXES_RESET_ON_SUCCESS = True  # forgets that username's failures from that address only (lockout.py)
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False  # refused attempts neither extend nor grow a lockout
AXES_VERBOSE = False  # the doors log one structured line per failure instead
AXES_ENABLE_ACCESS_FAILURE_LOG = False
AXES_DISABLE_ACCESS_LOG = False
# Roles whose holders (superusers included: they hold every role) must pass a TOTP code at sign-in;
# empty here (development and tests), operator and finance in production.py.
TESSERA_ADMIN_2FA_ROLES = [r for r in os.environ.get("TESSERA_ADMIN_2FA_ROLES", "").split(",") if r.strip()]
# 1: a user who must use 2FA and has no authenticator sets one up right after their password;
# 0: only an operator can (`manage.py otp_enrol --username X`).
TESSERA_ADMIN_2FA_SELF_ENROL = os.environ.get("TESSERA_ADMIN_2FA_SELF_ENROL", "1") == "1"
OTP_TOTP_ISSUER = os.environ.get("TESSERA_OTP_ISSUER", "Tessera")
# Content-Security-Policy of the admin and management API (django-csp); the API docs pages widen it
# (controlplane/doors/headers.py). No inline script anywhere else.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],  # the admin's style attributes (status colours)
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CONTENT_TYPE_NOSNIFF = True

# --- Single sign-on for the admin: OpenID Connect (docs/controlplane.md, "Single sign-on") -----------
# Off while TESSERA_OIDC_ISSUER or TESSERA_OIDC_CLIENT_ID is empty. Register <base URL>/sso/callback/
# as the client's redirect URI at the provider.
TESSERA_OIDC_ISSUER = os.environ.get("TESSERA_OIDC_ISSUER", "").rstrip("/")
TESSERA_OIDC_CLIENT_ID = os.environ.get("TESSERA_OIDC_CLIENT_ID", "")
TESSERA_OIDC_CLIENT_SECRET = os.environ.get("TESSERA_OIDC_CLIENT_SECRET", "")
TESSERA_OIDC_SCOPES = os.environ.get("TESSERA_OIDC_SCOPES") or "openid email profile"
# How the client authenticates at the token endpoint: client_secret_basic or client_secret_post.
TESSERA_OIDC_TOKEN_AUTH = os.environ.get("TESSERA_OIDC_TOKEN_AUTH") or "client_secret_basic"
TESSERA_OIDC_USE_PKCE = os.environ.get("TESSERA_OIDC_USE_PKCE", "1") != "0"
# Empty: each is read from <issuer>/.well-known/openid-configuration on first use (cached an hour).
TESSERA_OIDC_AUTHORIZATION_ENDPOINT = os.environ.get("TESSERA_OIDC_AUTHORIZATION_ENDPOINT", "")
TESSERA_OIDC_TOKEN_ENDPOINT = os.environ.get("TESSERA_OIDC_TOKEN_ENDPOINT", "")
TESSERA_OIDC_USERINFO_ENDPOINT = os.environ.get("TESSERA_OIDC_USERINFO_ENDPOINT", "")
TESSERA_OIDC_JWKS_ENDPOINT = os.environ.get("TESSERA_OIDC_JWKS_ENDPOINT", "")
TESSERA_OIDC_TIMEOUT_SECONDS = float(os.environ.get("TESSERA_OIDC_TIMEOUT_SECONDS") or "10")
# The claim holding the person's groups (a dotted path: realm_access.roles) and what each group means
# here, e.g. {"platform-ops": "operator", "finance-team": "finance"}. Re-read at every sign-in.
TESSERA_OIDC_ROLE_CLAIM = os.environ.get("TESSERA_OIDC_ROLE_CLAIM") or "groups"
TESSERA_OIDC_ROLE_MAP = json.loads(os.environ.get("TESSERA_OIDC_ROLE_MAP") or "{}")
# Empty: the provider's sign-in policy is trusted to require MFA, so an SSO session needs no TOTP code
# here. Set (e.g. "mfa,otp,hwk"): only an ID token whose `amr` names one of these counts as MFA.
TESSERA_OIDC_MFA_AMR = [a.strip() for a in os.environ.get("TESSERA_OIDC_MFA_AMR", "").split(",") if a.strip()]
# An SSO session lasts this long; a role removed at the provider is gone here by the next sign-in.
TESSERA_OIDC_SESSION_SECONDS = int(os.environ.get("TESSERA_OIDC_SESSION_SECONDS") or str(8 * 3600))
# false: the admin offers only "Sign in with SSO" and every password sign-in is refused.
TESSERA_ADMIN_PASSWORD_LOGIN = (os.environ.get("TESSERA_ADMIN_PASSWORD_LOGIN") or "true").lower() not in (
    "0", "false", "no", "off")
