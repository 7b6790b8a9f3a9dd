# Two commands: `make run` (embedded defaults) and `make test` (PostgreSQL + Redis).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

# The tests run against real servers; override to point elsewhere.
A2A_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/a2a_platform
A2A_TEST_BROKER_URL ?= redis://127.0.0.1:6379/15
# Local webhook receivers (make run demos, the tests' receiver processes) live on loopback,
# which the SSRF policy refuses unless allowlisted. Production leaves it empty. `make run`
# writes it into .env when .env does not set it, since every process reads .env: the
# platform `make run` starts and a manage.py command in a second shell allow the same
# networks. The tests get it on their command line.
LOOPBACK_NETWORKS := 127.0.0.0/8,::1/128

.PHONY: run test test-deep install browser bench-tools promtool bench-smoke lint format clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $@

install: $(VENV)/.installed

run: install
	@grep -qs '^A2A_WEBHOOK_ALLOWED_NETWORKS=' .env || { \
	  printf '%s\n' '# Written by make run: receivers on this machine (every process reads .env).' \
	    'A2A_WEBHOOK_ALLOWED_NETWORKS=$(LOOPBACK_NETWORKS)' >> .env; \
	  echo "make run: added A2A_WEBHOOK_ALLOWED_NETWORKS=$(LOOPBACK_NETWORKS) to .env"; }
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py sync_schedules
	PORT=$(PORT) $(PY) manage.py run_platform

# tests/e2e drives Debian's chromium (/usr/bin/chromium) through Playwright; nothing is
# downloaded at test time. Installed here when missing (root with apt), else a hint.
browser:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the browser tests (tests/e2e)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else \
	    echo "the browser tests (tests/e2e) need /usr/bin/chromium: sudo apt-get install chromium"; \
	    exit 3; \
	  fi; }

# The benchmarks' smoke runs (tests/bench, part of `make test`) drive load with Debian's wrk
# (bench/protocol_bench.py, bench/sdk_compare.py): installed here when missing (root with
# apt), else a hint.
bench-tools:
	@command -v wrk >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's wrk for the benchmarks' smoke runs (tests/bench)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; \
	  else \
	    echo "the benchmarks' smoke runs (tests/bench) need wrk: sudo apt-get install wrk"; \
	    exit 3; \
	  fi; }

# tests/unit/test_alerts.py checks the alert rules and the dashboard's queries with promtool.
# Only promtool is taken from Debian's prometheus package (downloaded, checked by apt, and
# unpacked): installing the package would also install the server and its service, which
# Debian starts. Installed here when missing (root with apt), else a hint.
promtool:
	@command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing promtool from Debian's prometheus package (tests/unit/test_alerts.py)"; \
	    apt-get update -qq && tmp="$$(mktemp -d)" && \
	    (cd "$$tmp" && apt-get download -qq -o APT::Sandbox::User=root prometheus) && \
	    dpkg-deb --fsys-tarfile "$$tmp"/prometheus_*.deb \
	      | tar -xO ./usr/bin/promtool > /usr/local/bin/promtool && \
	    chmod 755 /usr/local/bin/promtool && rm -rf "$$tmp"; \
	  else \
	    echo "the alert rules' tests need promtool (Debian's prometheus package): sudo make promtool"; \
	    exit 3; \
	  fi; }

test: install browser bench-tools promtool
	DATABASE_URL=$(A2A_TEST_DATABASE_URL) CELERY_BROKER_URL=$(A2A_TEST_BROKER_URL) \
	A2A_WEBHOOK_ALLOWED_NETWORKS=$(LOOPBACK_NETWORKS) \
	A2A_PROFILE=test $(PY) -m pytest $(PYTEST_ARGS)

# Only the benchmarks' smoke runs (each bench/*.py with --smoke: that it runs, not a figure).
bench-smoke: install bench-tools
	DATABASE_URL=$(A2A_TEST_DATABASE_URL) CELERY_BROKER_URL=$(A2A_TEST_BROKER_URL) \
	A2A_WEBHOOK_ALLOWED_NETWORKS=$(LOOPBACK_NETWORKS) \
	A2A_PROFILE=test $(PY) -m pytest tests/bench $(PYTEST_ARGS)

# The rebind model (tests/integration/webhooks/test_rebind_model.py) at depth: many more
# examples and steps than `make test` runs, new ones each run (nightly; tens of minutes).
MODEL_EXAMPLES ?= 200
MODEL_STEPS ?= 50
test-deep: install
	DATABASE_URL=$(A2A_TEST_DATABASE_URL) CELERY_BROKER_URL=$(A2A_TEST_BROKER_URL) \
	A2A_WEBHOOK_ALLOWED_NETWORKS=$(LOOPBACK_NETWORKS) \
	A2A_PROFILE=test A2A_MODEL_RANDOM=1 A2A_MODEL_EXAMPLES=$(MODEL_EXAMPLES) \
	A2A_MODEL_STEPS=$(MODEL_STEPS) $(PY) -m pytest --timeout 0 \
	tests/integration/webhooks/test_rebind_model.py $(PYTEST_ARGS)

# The OpenAPI linter (Redocly CLI), pinned, installed once into var/tools (never fetched by
# npx at lint or test time).
REDOCLY_VERSION := 2.77.0
REDOCLY := var/tools/node_modules/.bin/redocly
$(REDOCLY):
	npm install --prefix var/tools --no-save --no-audit --no-fund --loglevel=error \
	  @redocly/cli@$(REDOCLY_VERSION)

lint: install $(REDOCLY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	# The served schema: drf-spectacular's own checks (no warning), a spec validator, a linter.
	$(PY) manage.py spectacular --format openapi-json --file var/openapi.json --validate \
	  --fail-on-warn
	$(VENV)/bin/openapi-spec-validator var/openapi.json
	$(REDOCLY) lint --config a2a_platform/api/openapi-lint.yaml var/openapi.json

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf var
