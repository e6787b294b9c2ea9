"""turnlog: crash-safe, incremental persistence for long-lived agent sessions."""

__version__ = "0.1.0"
