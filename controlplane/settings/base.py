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
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "tenants",
    "billing",
    "controlplane.gateway",
    "controlplane.deployments",
    "controlplane.slo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
    )
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
    "billing-stripe-report-pending": {"task": "billing.stripe_report_pending", "schedule": 60.0},
    "billing-stripe-sync-pending": {"task": "billing.stripe_sync_pending", "schedule": 60.0},
    "billing-usage-daily-rollup": {"task": "billing.usage_daily_rollup", "schedule": 15 * 60.0},
    "billing-invoices-build-month": {
        "task": "billing.invoices_build_month",
        "schedule": crontab(minute=30, hour=0, day_of_month=1),
    },
}

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
USE_TZ = True
TIME_ZONE = "UTC"


# --- Tessera: tenants, API keys and the gateway -------------------------------------------------
# Server secret for the keyed hash of API keys. Changing it invalidates every key.
TESSERA_API_KEY_SECRET = os.environ.get("TESSERA_API_KEY_SECRET", SECRET_KEY)
# How long a gateway process trusts a key lookup before asking the database again (revocation,
# suspension and tier changes reach other processes within this many seconds).
TESSERA_AUTH_CACHE_SECONDS = float(os.environ.get("TESSERA_AUTH_CACHE_SECONDS", "2"))
# Empty (the default): the gateway routes to the ready workers and replicas the deployments registry
# knows (controlplane/deployments/routing.py). Set, a static comma-separated list of worker base URLs
# that the gateway polls itself (a fallback for running without the deployments machinery).
TESSERA_WORKERS = os.environ.get("TESSERA_WORKERS", "")
TESSERA_WORKER_TOKEN = os.environ.get("TESSERA_WORKER_TOKEN", "")
# Seconds between polls of each worker's /ready and /v1/models.
TESSERA_WORKER_POLL_SECONDS = float(os.environ.get("TESSERA_WORKER_POLL_SECONDS", "2"))
# Upstream timeouts: connect (a failure here is retried on another worker) and per-read.
TESSERA_UPSTREAM_CONNECT_TIMEOUT = float(os.environ.get("TESSERA_UPSTREAM_CONNECT_TIMEOUT", "2"))
TESSERA_UPSTREAM_READ_TIMEOUT = float(os.environ.get("TESSERA_UPSTREAM_READ_TIMEOUT", "300"))
# Completion tokens reserved against tokens/min and budgets when a request omits max_tokens.
TESSERA_DEFAULT_MAX_TOKENS = int(os.environ.get("TESSERA_DEFAULT_MAX_TOKENS", "1024"))
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
# "redis": the gateway RPUSHes events; `manage.py usage_consume` writes them (see gateway/usage_queue.py).
TESSERA_USAGE_QUEUE = os.environ.get("TESSERA_USAGE_QUEUE", "inline")
# Limiter backend: "redis" when REDIS_URL is set, else "database".
TESSERA_LIMITER = os.environ.get("TESSERA_LIMITER", "redis" if REDIS_URL else "database")
# Namespace of the limiter's Redis keys.
TESSERA_REDIS_PREFIX = os.environ.get("TESSERA_REDIS_PREFIX", "tsr")
# Seconds the limiter waits for Redis (connect, and each command) before the request is refused with a 503.
TESSERA_REDIS_TIMEOUT_SECONDS = float(os.environ.get("TESSERA_REDIS_TIMEOUT_SECONDS", "2"))
# A request counts toward concurrency for at most this long if its gateway dies before settling.
TESSERA_RESERVATION_TTL_SECONDS = int(os.environ.get("TESSERA_RESERVATION_TTL_SECONDS", "900"))
# The usage sweeper (controlplane/gateway/sweeper.py, beat every minute): journal rows older than
# MIN_AGE belong to a dead gateway; a request no worker knows is billed at its reservation after GIVE_UP.
TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS = float(os.environ.get("TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS", "60"))
TESSERA_USAGE_SWEEP_GIVE_UP_SECONDS = float(
    os.environ.get("TESSERA_USAGE_SWEEP_GIVE_UP_SECONDS", str(TESSERA_RESERVATION_TTL_SECONDS)))

# --- Billing and Stripe (docs/billing.md) ------------------------------------------------------------
BILLING_ROUNDING = os.environ.get("BILLING_ROUNDING", "ROUND_HALF_UP")
BILLING_DEFAULT_CURRENCY = os.environ.get("BILLING_DEFAULT_CURRENCY", "usd")
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
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "controlplane.errors.drf_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tessera management API",
    "DESCRIPTION": "Tenants manage their API keys and read their limits and usage; operators manage tenants and tiers.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "ENUM_NAME_OVERRIDES": {"BudgetEnforcementEnum": "tenants.models.BudgetEnforcement"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "controlplane.logging.JSONFormatter"}},
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
