"""Settings, read from the environment (django-environ) and nowhere else.

Embedded defaults (SQLite under var/, kombu's file-system broker under var/) make `make run`
work on a bare machine; DATABASE_URL / CELERY_BROKER_URL switch to PostgreSQL / Redis.
A production profile (A2A_PROFILE=production) refuses insecure settings.
"""

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
# `.env` is read by every process (the web, the workers, beat and every manage.py command), so
# a setting written there once is the same for `make run` and a command in a second shell;
# A2A_ENV_FILE names another file. The real environment wins.
environ.Env.read_env(env.str("A2A_ENV_FILE", default=str(BASE_DIR / ".env")), overwrite=False)

VAR_DIR = Path(env.str("A2A_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

PROFILE = env.str("A2A_PROFILE", default="development")
if PROFILE not in {"development", "production", "test"}:
    raise ImproperlyConfigured(
        f"A2A_PROFILE must be development, production or test, not {PROFILE!r}"
    )

_DEFAULT_SECRET_KEY = "dev-insecure-secret-key-change-me"
SECRET_KEY = env.str("SECRET_KEY", default=_DEFAULT_SECRET_KEY)
DEBUG = env.bool("DEBUG", default=PROFILE == "development")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"] if PROFILE != "production" else [])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# Fernet keys (comma-separated, newest first) encrypting secrets at rest.
A2A_SECRETS_KEYS = env.list("A2A_SECRETS_KEYS", default=[])

if PROFILE == "production":
    problems = []
    if DEBUG:
        problems.append("DEBUG is on")
    if SECRET_KEY == _DEFAULT_SECRET_KEY or len(SECRET_KEY) < 32:
        problems.append("SECRET_KEY is the default or shorter than 32 characters")
    if not A2A_SECRETS_KEYS:
        problems.append("A2A_SECRETS_KEYS (encryption key for secrets at rest) is not set")
    if problems:
        raise ImproperlyConfigured("refusing to start in production: " + "; ".join(problems))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "agents",
    "tasks",
    "webhooks",
    "a2a_platform.api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "a2a_platform.urls"
WSGI_APPLICATION = "a2a_platform.wsgi.application"
ASGI_APPLICATION = "a2a_platform.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "webhooks.console.context_processors.open_alerts",
            ],
        },
    },
]

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'a2a.sqlite3'}"),
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Web, worker and beat share one file: WAL lets readers run beside the writer, IMMEDIATE
    # takes the write lock at BEGIN (no lock upgrade deadlock), and the busy timeout makes a
    # writer wait instead of failing with "database is locked".
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": (
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;"
            ),
        }
    )
elif _db["ENGINE"] == "django.db.backends.postgresql":
    _db["ENGINE"] = "django.db.backends.postgresql"
    if env.bool("A2A_DB_POOL", default=True):
        # Django's psycopg pool caps the connections of a process (web: the ORM threads of
        # a2a_platform/lib/orm.py plus Django's own request threads; worker: its pool threads).
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": env.int("A2A_DB_POOL_MIN", default=1),
            "max_size": env.int("A2A_DB_POOL_MAX", default=20),
            "timeout": env.int("A2A_DB_POOL_TIMEOUT", default=10),
        }
        _db["CONN_MAX_AGE"] = 0
        # The pool checks a connection before lending it (psycopg_pool's check_connection):
        # after a PostgreSQL restart its idle connections are dead and are discarded, not
        # handed to a request (issue 20).
        _db["CONN_HEALTH_CHECKS"] = True
    # Parameters bound by the server and psycopg's automatic prepared statements (a query
    # run 5 times on a connection is prepared there), so PostgreSQL stops parsing, analysing
    # and planning every ORM query again: 46% of its CPU on the SendMessage path before
    # (docs/decisions.md, "Prepared statements and rows"). Off only behind a pooler that cannot
    # keep prepared statements across transactions (PgBouncer in transaction mode before 1.21).
    if env.bool("A2A_DB_PREPARED_STATEMENTS", default=True):
        _db.setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns about a missing root
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    # Each API names its own (the management API: a2a_platform/api/views.py; the worker API:
    # tasks/api/views.py); nothing is open by default.
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    # One error body for every failure of every API (docs/api.md).
    "EXCEPTION_HANDLER": "a2a_platform.api.errors.exception_handler",
    # A refusal of the body as a whole (not of one field) is listed under `body`.
    "NON_FIELD_ERRORS_KEY": "body",
    "DEFAULT_SCHEMA_CLASS": "a2a_platform.api.schema.ApiAutoSchema",
    # Request bodies are JSON, and the schema says so: with DRF's form and multipart parsers a
    # generated client sent multipart, whose booleans and lists the form parser reads wrong
    # (docs/decisions.md, "The management API"). Anything else is 415 unsupported_media_type.
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    # Requests per token (or session user) on the management API; beyond: 429 `throttled`.
    "DEFAULT_THROTTLE_RATES": {"platform_api": env.str("A2A_API_RATE", default="1200/minute")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "A2A Platform management API",
    "DESCRIPTION": "Integrators' REST API (docs/api.md): agents, keys, tasks, webhooks, "
    'rebinds. Errors are `{"error": {"code", "message", ...}}`.',
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "OAS_VERSION": "3.1.0",
    # Paths are absolute (/api/v1/...): the server is the host that serves the schema.
    "SERVERS": [{"url": "/", "description": "the platform serving this schema"}],
    "GET_LIB_DOC_EXCLUDES": "a2a_platform.api.schema.lib_doc_excludes",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "a2a_platform.api.schema.postprocess",
    ],
    # Swagger UI's files come from drf-spectacular-sidecar (served here, never a CDN).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One name per choice set shared by several resources.
    "ENUM_NAME_OVERRIDES": {
        "AgentExecutor": "agents.models.Executor",
        "AgentAuthMode": "agents.models.AuthMode",
        "AnonymousListing": "agents.models.AnonymousListing",
        "PushChannelPolicy": "agents.models.PushChannelPolicy",
        "OnDrainTimeout": "agents.models.OnDrainTimeout",
        "ApiKeyKind": "agents.models.ApiKeyKind",
        "SigningKeyState": "agents.models.SigningKeyState",
        "DeliveryState": "webhooks.models.DeliveryState",
        "RebindState": "webhooks.models.RebindState",
        "AlertKind": "webhooks.models.AlertKind",
        "TokenScope": "a2a_platform.api.models.TokenScope",
        "MoveState": "webhooks.models.MoveState",
        "TaskState": "a2a_platform.api.schema.TASK_STATES",
        "TaskStateShort": "a2a_platform.api.schema.TASK_STATES_SHORT",
        "DeliveryKind": "a2a_platform.api.schema.DELIVERY_KINDS",
    },
}

# --- Celery -----------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for sub in ("out", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # kombu's default is ./control, in whatever directory the process started from.
        "control_folder": str(_broker_dir / "control"),
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
    }
    # kombu's file-system transport, each message written whole before consumers see it.
    CELERY_BROKER_TRANSPORT = "a2a_platform.broker_fs:Transport"
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
if CELERY_BROKER_URL.startswith("redis://"):
    # kombu's Redis transport with a fix that lets workers survive a Redis restart.
    CELERY_BROKER_TRANSPORT = "a2a_platform.broker:Transport"
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup would close each worker process's connection pool before and after
# every job (a new PostgreSQL connection per job); tasks/worker_connections.py hands
# connections back to the pool per job instead, as Django does per request.
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_TASK_DEFAULT_QUEUE = "agents"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# (issue 18, H4) DatabaseScheduler that also writes the platform's missing schedules.
CELERY_BEAT_SCHEDULER = "a2a_platform.beat:PlatformScheduler"
CELERY_TIMEZONE = "UTC"

# --- Platform knobs -------------------------------------------------------------------
# Executor dispatch: a claimed dispatch holds a lease the executor renews while it runs; the
# sweeper re-dispatches what nobody claimed in time or whose lease lapsed, up to a try limit.
A2A_DISPATCH_LEASE_SECONDS = env.int("A2A_DISPATCH_LEASE_SECONDS", default=60)
A2A_DISPATCH_UNCLAIMED_SECONDS = env.int("A2A_DISPATCH_UNCLAIMED_SECONDS", default=30)
A2A_DISPATCH_MAX_TRIES = env.int("A2A_DISPATCH_MAX_TRIES", default=3)
# The quick executors' drain job (tasks/executors/runner.py): seconds it claims before it
# hands over to a fresh job (a worker's warm shutdown waits no longer for it), and seconds it
# waits out of work for a ring (a new quick dispatch) before it stops, so a steady stream of
# sends is run by one job instead of a job per burst (Redis brokers only).
A2A_DISPATCH_DRAIN_SECONDS = env.float("A2A_DISPATCH_DRAIN_SECONDS", default=2)
A2A_DISPATCH_DRAIN_LINGER_SECONDS = env.float("A2A_DISPATCH_DRAIN_LINGER_SECONDS", default=0.5)
A2A_SWEEP_INTERVAL_SECONDS = env.int("A2A_SWEEP_INTERVAL_SECONDS", default=10)
# Hosted a2a-sdk executors (tasks/executors/host.py): runs in flight at once per worker process
# (a dispatch beyond it waits, its task SUBMITTED; their events are written on the
# A2A_ORM_THREADS threads), how long a stopped `execute()` or a `cancel()` gets, and how long
# a stopping worker lets its runs finish before it hands them back to run elsewhere.
A2A_HOSTED_CONCURRENCY = env.int("A2A_HOSTED_CONCURRENCY", default=200)
A2A_HOSTED_STOP_GRACE_SECONDS = env.float("A2A_HOSTED_STOP_GRACE_SECONDS", default=5)
A2A_HOSTED_SHUTDOWN_GRACE_SECONDS = env.float("A2A_HOSTED_SHUTDOWN_GRACE_SECONDS", default=10)
# Event hub: how often the SQLite fallback polls for new events.
A2A_EVENT_HUB_POLL_SECONDS = env.float("A2A_EVENT_HUB_POLL_SECONDS", default=0.2)
# A message (or artifact) with more parts than this is refused (InvalidParams).
A2A_MAX_PARTS_PER_MESSAGE = env.int("A2A_MAX_PARTS_PER_MESSAGE", default=100)

# Log lines (docs/observability.md, "Logs"): "text", one human-readable line per record (the
# message, then key=value pairs), or "json", one JSON object per line for a log pipeline, from
# every process (web, worker, beat), with the web server's and Celery's own lines.
A2A_LOG_FORMAT = env.str("A2A_LOG_FORMAT", default="text")
if A2A_LOG_FORMAT not in {"text", "json"}:
    raise ImproperlyConfigured(f"A2A_LOG_FORMAT must be text or json, not {A2A_LOG_FORMAT!r}")
# dictConfig(LOGGING), then the web server's own loggers through the same handler in json mode.
LOGGING_CONFIG = "a2a_platform.logging.configure"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"()": "a2a_platform.logging.KeyValueFormatter"},
        "json": {"()": "a2a_platform.logging.JsonFormatter"},
    },
    "filters": {"trace_context": {"()": "a2a_platform.logging.TraceContextFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": A2A_LOG_FORMAT,
            "filters": ["trace_context"],
        }
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Celery's line per job received and finished, and beat's per job sent: with the
        # heartbeat and the sweepers that is several lines every few seconds of nothing
        # happening. Failures are logged at ERROR whatever this says.
        **{
            name: {"level": env.str("A2A_JOB_LOG_LEVEL", default="WARNING")}
            for name in ("celery.worker.strategy", "celery.app.trace", "celery.beat")
        },
        # The platform's line per task and step (created, claimed, moved, answered): at
        # hundreds of tasks a second, hundreds of lines a second and several percent of the
        # worker's CPU (docs/decisions.md, "Web and worker processes"). The task's events
        # are its durable record; INFO shows every step.
        "tasks.lifecycle": {"level": env.str("A2A_TASK_LOG_LEVEL", default="WARNING")},
        # Loggers Celery and billiard keep from propagating, which Celery gives a handler
        # of its own format unless they have one: this one.
        **{
            name: {"handlers": ["console"], "propagate": False}
            for name in ("celery.task", "multiprocessing")
        },
    },
}
# The task store and the outbox store (tasks/task_store/, webhooks/delivery/outbox_store/): "auto"
# runs their prepared SQL on PostgreSQL and the ORM elsewhere; "orm" forces the ORM on
# PostgreSQL too (behind a transaction-pooling proxy that cannot keep prepared statements);
# "postgres" insists on the SQL (refused on another database).
A2A_STORE = env.str("A2A_STORE", default="auto")
if A2A_STORE not in {"auto", "orm", "postgres"}:
    raise ImproperlyConfigured(f"A2A_STORE must be auto, orm or postgres, not {A2A_STORE!r}")
# Threads (each holding one pooled connection) that serve the protocol app's ORM calls.
A2A_ORM_THREADS = env.int("A2A_ORM_THREADS", default=8)
# Per-process caches on the protocol hot path (0 disables), the same in every profile (the
# tests run with them). Each web process keeps the agent a tenant resolves to and each client
# API key it has accepted for this long: an agent edit (disabled, description, capability
# switches, the default moved) or a key revocation takes effect in every web process within
# A2A_AGENT_CACHE_SECONDS / A2A_API_KEY_CACHE_SECONDS, and at once in the process that saved
# it (its commit drops the entries there). Worker REST API keys are not cached.
A2A_AGENT_CACHE_SECONDS = env.float("A2A_AGENT_CACHE_SECONDS", default=2)
A2A_API_KEY_CACHE_SECONDS = env.float("A2A_API_KEY_CACHE_SECONDS", default=5)
# Blocking SendMessage returns the task as it is after this many seconds at most.
A2A_SEND_MESSAGE_MAX_WAIT_SECONDS = env.float("A2A_SEND_MESSAGE_MAX_WAIT_SECONDS", default=30)
# SSE streams: an idle stream gets a comment line every A2A_SSE_KEEPALIVE_SECONDS (proxies and
# clients keep it open); a web process serves at most A2A_MAX_STREAMS at once (beyond: 503 +
# Retry-After); on shutdown each open stream is told `retry: A2A_SSE_SHUTDOWN_RETRY_MS`.
A2A_SSE_KEEPALIVE_SECONDS = env.float("A2A_SSE_KEEPALIVE_SECONDS", default=15)
A2A_MAX_STREAMS = env.int("A2A_MAX_STREAMS", default=2000)
A2A_SSE_SHUTDOWN_RETRY_MS = env.int("A2A_SSE_SHUTDOWN_RETRY_MS", default=1000)
# Request bodies above this are refused from Content-Length, before reading.
A2A_MAX_BODY_BYTES = env.int("A2A_MAX_BODY_BYTES", default=4 * 1024 * 1024)
A2A_JSONRPC_MAX_BATCH = env.int("A2A_JSONRPC_MAX_BATCH", default=20)
A2A_MAX_JSON_DEPTH = env.int("A2A_MAX_JSON_DEPTH", default=32)
# Public origin for card URLs (https://agents.example.com); derived from the request if unset.
A2A_PUBLIC_BASE_URL = env.str("A2A_PUBLIC_BASE_URL", default="")

# --- Webhook delivery -----------------------------------------------------------------
# Seconds between tries (the first try is immediate): close to Svix, 8 tries over ~27 h.
A2A_WEBHOOK_RETRY_SCHEDULE = env.list(
    "A2A_WEBHOOK_RETRY_SCHEDULE", default=["5", "300", "1800", "7200", "18000", "36000", "36000"]
)
# A receiver answering 401/403 may distrust our key or binding (the rebind incident): a few
# tries over ~10 minutes, with an alert, then dead-letter.
A2A_WEBHOOK_AUTH_RETRY_SCHEDULE = env.list(
    "A2A_WEBHOOK_AUTH_RETRY_SCHEDULE", default=["60", "120", "180", "240"]
)
A2A_WEBHOOK_TIMEOUT_SECONDS = env.float("A2A_WEBHOOK_TIMEOUT_SECONDS", default=10)
# A claimed delivery is leased for the timeout plus this margin: a worker that dies mid-send
# delays it by that much, then the sweeper hands it to another worker.
A2A_WEBHOOK_LEASE_MARGIN_SECONDS = env.float("A2A_WEBHOOK_LEASE_MARGIN_SECONDS", default=30)
A2A_WEBHOOK_MAX_CONFIGS_PER_TASK = env.int("A2A_WEBHOOK_MAX_CONFIGS_PER_TASK", default=10)
# A registration's DNS lookup of its URL's host gets this long (its owner's DNS decides).
A2A_WEBHOOK_CHECK_TIMEOUT_SECONDS = env.float("A2A_WEBHOOK_CHECK_TIMEOUT_SECONDS", default=5)
# (issue 18, H4) Off: a webhook host name is not resolved at registration, only at connect
# time (as on every send): for networks without public DNS (webhooks/delivery/ssrf.py).
A2A_WEBHOOK_RESOLVE_AT_REGISTRATION = env.bool("A2A_WEBHOOK_RESOLVE_AT_REGISTRATION", default=True)
# Sends in flight to one endpoint (origin) across all workers: half a pump's window, so one
# receiver that starts hanging holds at most half of it until its first failure is recorded.
A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT = env.int("A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT", default=32)
# This many failed tries in a row raise an `endpoint_failing` alert (its next success resolves it).
A2A_WEBHOOK_ENDPOINT_FAILING_AFTER = env.int("A2A_WEBHOOK_ENDPOINT_FAILING_AFTER", default=10)
# A due head whose endpoint is at its cap is looked at again after this long (no try spent):
# the claiming pump's poll interval, so it is taken at the first claim once a slot is free.
A2A_WEBHOOK_CAP_WAIT_SECONDS = env.float("A2A_WEBHOOK_CAP_WAIT_SECONDS", default=0.1)
A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS = env.int("A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS", default=5)
# The delivery pump (webhooks/delivery/pump.py): sends in flight per pump (tasks on the process's
# sender loop: a socket each, no thread), seconds a pump claims before it hands over to a
# fresh one.
A2A_WEBHOOK_PUMP_WINDOW = env.int("A2A_WEBHOOK_PUMP_WINDOW", default=64)
A2A_WEBHOOK_PUMP_SECONDS = env.float("A2A_WEBHOOK_PUMP_SECONDS", default=2)
# A pump with nothing left to send waits this long for rings (new writes) before it exits, so
# a steady trickle of events rides one pump instead of a broker job each (Redis brokers only).
A2A_WEBHOOK_PUMP_LINGER_SECONDS = env.float("A2A_WEBHOOK_PUMP_LINGER_SECONDS", default=1)
# The sweeper vacuums the delivery queue's tables when their dead rows pile up between
# autovacuum runs (webhooks/delivery/maintenance.py; PostgreSQL only). Off for a database whose
# operators vacuum these tables on their own schedule.
A2A_WEBHOOK_VACUUM_QUEUE_TABLES = env.bool("A2A_WEBHOOK_VACUUM_QUEUE_TABLES", default=True)
# The pumps' bell, once its pump died, stops saving broker messages after this long
# (webhooks/delivery/bell.py; the setting keeps its older name).
A2A_WEBHOOK_WAKE_TTL_SECONDS = env.float("A2A_WEBHOOK_WAKE_TTL_SECONDS", default=5)
# Delivery signing keys are read once per this many seconds per worker process (0: always);
# a key created, rotated or retired signs, or stops signing, in every worker within that time
# (at once in the process that made the change). Keep a rotation's drain longer than this.
A2A_SIGNING_KEY_CACHE_SECONDS = env.float("A2A_SIGNING_KEY_CACHE_SECONDS", default=5)
# --- Rebinds (webhooks/rebinds/operations.py, docs/rebinds.md) ------------------------------------
# The signature tolerance receivers are assumed to allow (webhooks/receiver.py's default): an
# old key outlives the last delivery on its channel by the retry horizon plus this.
A2A_WEBHOOK_SIGNATURE_TOLERANCE_SECONDS = env.int(
    "A2A_WEBHOOK_SIGNATURE_TOLERANCE_SECONDS", default=300
)
# The beat job that advances open rebinds (counts, completion, deadline alerts and action,
# scheduled starts, old-key retirement) runs this often; each run is idempotent.
A2A_REBIND_MONITOR_INTERVAL_SECONDS = env.int("A2A_REBIND_MONITOR_INTERVAL_SECONDS", default=5)
# Configs moved per transaction while a rebind plans its moves (each locks its tasks briefly).
A2A_REBIND_BATCH = env.int("A2A_REBIND_BATCH", default=500)
# How often, and over how many finished tasks per agent, the `tasks_outlive_card` check
# measures the p99 task duration against the card's max-age (docs/rebinds.md).
A2A_CARD_AGE_CHECK_INTERVAL_SECONDS = env.int("A2A_CARD_AGE_CHECK_INTERVAL_SECONDS", default=600)
A2A_CARD_AGE_SAMPLE = env.int("A2A_CARD_AGE_SAMPLE", default=1000)
# The longest drain deadline an operator may set (30 days).
A2A_REBIND_MAX_DEADLINE_SECONDS = env.int("A2A_REBIND_MAX_DEADLINE_SECONDS", default=30 * 86400)
# Retention: delivered deliveries, their attempts and task events older than this are purged
# (batched) by a beat job; dead-lettered deliveries stay until an operator acts.
A2A_RETENTION_DAYS = env.int("A2A_RETENTION_DAYS", default=14)
A2A_RETENTION_INTERVAL_SECONDS = env.int("A2A_RETENTION_INTERVAL_SECONDS", default=3600)
A2A_RETENTION_BATCH = env.int("A2A_RETENTION_BATCH", default=5000)

# --- Metrics (docs/observability.md, "Metrics") ------------------------------------------
# Off: no /metrics (404) and no request timing (the ASGI app is not wrapped).
A2A_METRICS_ENABLED = env.bool("A2A_METRICS_ENABLED", default=True)
# When set, /metrics answers only `Authorization: Bearer <token>` (401 otherwise).
A2A_METRICS_TOKEN = env.str("A2A_METRICS_TOKEN", default="")
# Each web process adds its request durations to the shared histogram this often (and when
# it stops): a scrape shows other processes' requests at most this late.
A2A_METRICS_FLUSH_SECONDS = env.float("A2A_METRICS_FLUSH_SECONDS", default=5)
if A2A_METRICS_ENABLED:
    # Names the Django route a request matched, for http_server_request_duration_seconds.
    MIDDLEWARE.append("a2a_platform.request_metrics.RouteMiddleware")

# --- Webhook SSRF allowlist -----------------------------------------------------------------
# Comma-separated CIDRs a webhook may reach even though they are not public (loopback,
# private, ...); plain http is accepted only to these. Empty: public https destinations only.
# webhooks/delivery/ssrf.py reads it at call time. `make run` with a local receiver:
# 127.0.0.0/8,::1/128.
A2A_WEBHOOK_ALLOWED_NETWORKS = env.list("A2A_WEBHOOK_ALLOWED_NETWORKS", default=[])
# Certificates of https receivers are checked against this PEM bundle of CA certificates
# (a private CA, a test CA); empty: the system's trust store. Read when a connection is made.
A2A_WEBHOOK_CA_BUNDLE = env.str("A2A_WEBHOOK_CA_BUNDLE", default="")

# --- Readiness ----------------------------------------------------------------------------
A2A_HEARTBEAT_INTERVAL_SECONDS = env.int("A2A_HEARTBEAT_INTERVAL_SECONDS", default=5)
# A worker whose last heartbeat is older than this is not live.
A2A_HEARTBEAT_FRESH_SECONDS = env.int("A2A_HEARTBEAT_FRESH_SECONDS", default=20)
A2A_READINESS_CACHE_SECONDS = env.float("A2A_READINESS_CACHE_SECONDS", default=1.0)
# Each web process writes its readiness for the dashboard this often (agents.WebInstance);
# an instance silent for 3 intervals shows as stale, for the forget delay it is dropped.
A2A_WEB_HEARTBEAT_SECONDS = env.float("A2A_WEB_HEARTBEAT_SECONDS", default=5)
A2A_WEB_INSTANCE_FORGET_SECONDS = env.int("A2A_WEB_INSTANCE_FORGET_SECONDS", default=3600)
# On SIGTERM a web instance answers not-ready for this long before it stops accepting.
A2A_SHUTDOWN_GRACE_SECONDS = env.float("A2A_SHUTDOWN_GRACE_SECONDS", default=5)
