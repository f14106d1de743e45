"""Hermes names this plugin uses that older Hermes releases lack, imported defensively.

hermes-agent 0.19.0 (the newest PyPI release) has BaseEnvironment but no EnvironmentConnectionError or
FileFetchError; there the fallbacks below (RuntimeError subclasses, as upstream's are) keep the same behaviour.
"""

try:
    from tools.environments.base import EnvironmentConnectionError
except ImportError:  # Hermes < v0.20.6

    class EnvironmentConnectionError(RuntimeError):
        def __init__(self, reason: str, *, retry_hint: str = ""):
            super().__init__(reason)
            self.reason = reason
            self.retry_hint = retry_hint


try:
    from tools.environments.base import FileFetchError
except ImportError:  # Hermes < v0.20.6

    class FileFetchError(RuntimeError):
        pass


__all__ = ["EnvironmentConnectionError", "FileFetchError"]
