"""The console wing: what operators see and do in the Django admin beyond its stock pages.

`dashboard.py` (the admin index's one payload, also served as JSON by `views.py`),
`delivery_actions.py` (retry now and replay, saying why a delivery was left alone),
`endpoint_probe.py` (a signed test event to an endpoint), `key_actions.py` (a signing key's
retirement from the agent's page, refused while a rebind relies on it), `operator_groups.py`
(the operator groups' permissions), `context_processors.py` (the open alerts on every admin
page).

The contract (pyproject.toml, import-linter): the console calls the services, rebinds and
delivery below it; only the admin, the URL configuration and the management API import it.
Each operator action here is one audited transaction.
"""
