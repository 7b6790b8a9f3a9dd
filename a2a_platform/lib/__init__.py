"""Leaf utilities every app may import: Django and third-party libraries only, never an app
or the project shell (the import contracts in pyproject.toml check it).

- `sql`: prepared statements on PostgreSQL, statement parts generated from models.
- `orm`: the protocol app's ORM threads (async code calls the ORM through them).
- `crypto`: secrets at rest (Fernet, key rotation).
- `ttl_cache`: short per-process caches on the hot paths.
- `on_commit`: the one way to start a Celery job from a write (after commit).
- `checks`: the named checks readiness and /readyz report (database, migrations, broker).
"""
