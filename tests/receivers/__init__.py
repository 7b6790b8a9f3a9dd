"""Webhook receivers on the stacks our clients run, for the receiver matrix
(tests/integration/webhooks/test_receiver_matrix.py).

Each is a separate process: `python -m tests.receivers.<stack> --port P --record FILE` (or
`node tests/receivers/node_receiver.js --port P --record FILE`). It listens on 127.0.0.1:P,
prints `listening on 127.0.0.1:P` once connections are accepted, and appends one JSON line
per request to FILE in tests/webhook_receiver.py's record format, so
`tests.webhook_receiver.ReceiverProcess` starts it and reads its records.

A receiver's answer is chosen by the request's path (answers.py says what each one means), so
one process serves every answer kind its stack gives naturally, and a push config picks one
by the URL it registers. A path a stack does not serve is answered 404 (and recorded).
"""
