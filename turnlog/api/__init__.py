"""The HTTP API and live transcript page (``turnlog api``)."""

from turnlog.api.app import create_app

__all__ = ["create_app"]
