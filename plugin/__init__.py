"""Flarebox's Hermes plugin: the `cloudflare_sandbox` terminal backend, and the one Flarebox protocol client.

Hermes loads this directory from `$HERMES_HOME/plugins/cloudflare-sandbox/` and calls `register(ctx)`. Everything is
imported lazily so that `flarebox_hermes.client` also works where Hermes is not installed (the CLI, tests, bench).
"""

import logging

from ._version import __version__

logger = logging.getLogger(__name__)

MIN_HERMES = "Hermes Agent v0.20.6 (tag v2026.8.27)"
# The two ways a Hermes takes a terminal backend plugin. register() uses exactly one of them, the newer when offered.
BACKEND_CONTRACT = "terminal-backend"  # ctx.register_terminal_backend(TerminalBackendDefinition(...))
PROVIDER_CONTRACT = "terminal-environment-provider"  # ctx.register_terminal_environment_provider(provider)


def _definition_class():
    """Hermes' TerminalBackendDefinition, or None when this Hermes has no tools.environments.registry with it."""
    try:
        from tools.environments.registry import TerminalBackendDefinition
    except ImportError:
        return None
    return TerminalBackendDefinition


def contract(ctx) -> str | None:
    """The contract register() uses with this ctx: BACKEND_CONTRACT when ctx.register_terminal_backend exists and
    Hermes' TerminalBackendDefinition imports, else PROVIDER_CONTRACT when ctx.register_terminal_environment_provider
    exists, else None. Only attribute presence and one import: nothing is registered."""
    if callable(getattr(ctx, "register_terminal_backend", None)) and _definition_class() is not None:
        return BACKEND_CONTRACT
    if callable(getattr(ctx, "register_terminal_environment_provider", None)):
        return PROVIDER_CONTRACT
    return None


def register(ctx) -> None:
    """Register the backend through the one contract this Hermes offers (never both), or log one clear line when
    this Hermes predates terminal backend plugins."""
    chosen = contract(ctx)
    if chosen == BACKEND_CONTRACT:
        from .provider import backend_definition

        # Hermes validates the definition and keeps its own copy; if it refuses (a name clash), the exception is
        # its to record against this plugin, as for any register() that fails.
        ctx.register_terminal_backend(backend_definition(_definition_class()))
        return
    offers_backend = callable(getattr(ctx, "register_terminal_backend", None))
    if chosen is None:
        if offers_backend:
            logger.error(
                "cloudflare-sandbox: this Hermes offers register_terminal_backend but no "
                "tools.environments.registry.TerminalBackendDefinition to describe the backend with; not loaded"
            )
        else:
            logger.error(
                "cloudflare-sandbox needs %s or later: this Hermes cannot load terminal backend plugins", MIN_HERMES
            )
        return
    if offers_backend:
        logger.warning(
            "cloudflare-sandbox: this Hermes offers register_terminal_backend without "
            "tools.environments.registry.TerminalBackendDefinition; using its terminal environment provider "
            "interface instead"
        )
    try:
        import agent.terminal_env_provider  # noqa: F401 - only probing that the interface exists
    except ImportError:
        logger.error("cloudflare-sandbox needs %s or later: agent.terminal_env_provider is missing", MIN_HERMES)
        return
    from .provider import CloudflareSandboxProvider

    ctx.register_terminal_environment_provider(CloudflareSandboxProvider())


__all__ = ["__version__", "register", "contract", "MIN_HERMES", "BACKEND_CONTRACT", "PROVIDER_CONTRACT"]
