"""Flarebox supervisor: the one long-lived process inside a workspace container.

It runs commands in their own process groups as the unprivileged sandbox user, streams their output as NDJSON,
keeps a bounded journal for reattach, and reads and writes files with that user's rights. The HTTP shapes are the
"Supervisor API" of docs/protocol.md; limits, error codes and event shapes come from the `protocol` package.
"""

__version__ = "0.1.0"
