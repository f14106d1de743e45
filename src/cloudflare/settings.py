"""Deployment settings from the Worker's vars (wrangler.jsonc "vars"), through durable.settings."""

from typing import Any

from durable.settings import SETTING_VARS, Settings


def env_var(env: Any, name: str) -> str | None:
    value = getattr(env, name, None)
    return None if value is None or type(value).__name__ == "JsNull" else str(value)


def settings_from_env(env: Any) -> Settings:
    return Settings.from_vars({name: env_var(env, name) for name in SETTING_VARS})
