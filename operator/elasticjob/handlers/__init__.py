"""kopf handlers: importing this package registers them."""

from elasticjob.handlers import jobs, pods, startup  # noqa: F401
