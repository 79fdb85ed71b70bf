"""kopf handlers: importing this package registers them (startup, cleanup, the liveness probe)."""

from elasticjob.handlers import startup  # noqa: F401
