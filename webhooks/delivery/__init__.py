"""The delivery wing: from a committed task event to a recorded attempt.

One webhook's path, in reading order: the services write a `Delivery` row in the task
transition's transaction and `bell.py` rings for a pump after commit; `pump.py` (the deliver job)
claims due heads through `claim_record.py`, which reads and writes through `outbox_store/`
(the statements) and `heads.py` (each config's head time: the queue's index), signs with
`headers.py` and `signer.py`, checks `endpoint_health.py`'s caps; `transport.py` POSTs behind
`ssrf.py`'s checks; `claim_record.py` records the result with `retry_policy.py`'s decision and,
for a channel notice, `notices.py`'s activation of the new binding. `maintenance.py` and
`retention.py` keep the tables small.

The contract (pyproject.toml, import-linter): this wing imports only the models, errors,
selectors and alerts below it; rebinds, the services and the console call into it, never the
other way round.
"""
