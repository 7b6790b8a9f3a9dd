"""Push configs, binding versions and the delivery outbox arrive with the delivery issue.

They attach to tasks through `tasks.hooks.register_event_hook`, which the lifecycle services
call inside the transition's transaction (DESIGN.md, invariant 2).
"""
