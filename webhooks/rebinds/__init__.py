"""The rebinds wing: moving an agent's push channels to a new URL, credentials or signing key
without losing or mis-signing a delivery (docs/rebinds.md).

`operations.py` is every transition an operator or the monitor drives (start, fire, advance,
cutover, extend, abort, move now, finish on old, re-bind orphans); `checks.py` the request, its
pre-checks, scope and preview; `machine.py` the pure states and which transitions they allow;
`channel_moves.py` one config's move inside a rebind's transaction (the new binding, the notice,
orphans, a client's own re-registration or deletion); `console.py` the rebind page's one
payload; `forms.py` the wizard's form, which only parses.

The contract (pyproject.toml, import-linter): this wing calls the delivery wing (heads, bell,
notices) and the shared modules below it; only the services, the console and the entry points
call into it.
"""
