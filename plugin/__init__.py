"""Flarebox's Hermes plugin: the `cloudflare_sandbox` terminal backend, and the one Flarebox protocol client.

Hermes loads this directory from `$HERMES_HOME/plugins/cloudflare-sandbox/` and calls `register(ctx)`. Everything is
imported lazily so that `flarebox_hermes.client` also works where Hermes is not installed (the CLI, tests, bench).
"""

import logging

from ._version import __version__

logger = logging.getLogger(__name__)

MIN_HERMES = "Hermes Agent v0.20.6 (tag v2026.8.27)"


def register(ctx) -> None:
    """Register the provider, or log one clear line when this Hermes predates terminal provider plugins."""
    if not hasattr(ctx, "register_terminal_environment_provider"):
        logger.error(
            "cloudflare-sandbox needs %s or later: this Hermes cannot load terminal backend plugins", MIN_HERMES
        )
        return
    try:
        import agent.terminal_env_provider  # noqa: F401 - only probing that the interface exists
    except ImportError:
        logger.error("cloudflare-sandbox needs %s or later: agent.terminal_env_provider is missing", MIN_HERMES)
        return
    from .provider import CloudflareSandboxProvider

    ctx.register_terminal_environment_provider(CloudflareSandboxProvider())


__all__ = ["__version__", "register", "MIN_HERMES"]
