"""Operator tools: what the ``turnlog replay``, ``verify`` and ``tail`` commands do, and the
independent audit fold of a session's event log (``turnlog.ops.audit``).

They sit on top of the library (they read the log and the store as the services do);
no library module imports them. Nothing is imported here: each command loads its own module.
"""
