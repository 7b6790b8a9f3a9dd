"""The start-up heap, moved out of the garbage collector's way (`gc.freeze`).

A web or worker process imports Django, the apps, the protocol's generated classes and
Celery: some 130,000 objects that live as long as the process. Python's full collection
(its oldest generation) walks every one of them each time it runs, every few seconds under
load: 40 to 300 ms of wall time on a shared core, on the thread that serves every request of
the web process (docs/decisions.md, "Web and worker processes"). Frozen once the process
has started, they are left out of every later collection; what is allocated afterwards is
collected as before. The price: what was frozen is never freed, a reference cycle among it
included, so only what start-up leaves alive, meant to live as long as the process, is
frozen (start-up's garbage is collected first).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect start-up's garbage, then freeze every object still alive (idempotent: a second
    call freezes what was allocated since)."""
    gc.collect()
    gc.freeze()
