"""The plugin's version: sent in the User-Agent and repeated in plugin.yaml (a test keeps them equal)."""

__version__ = "0.1.0"
