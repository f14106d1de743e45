"""Glue between the registry and the bubblewrap sandbox driver (standalone.sandbox) and snapshot store."""

from pathlib import Path

from durable.settings import Settings


def container_factory(data_dir: Path, settings: Settings):
    def make(namespace: str, name: str, directory: Path):
        from standalone.sandbox import SandboxContainer  # noqa: F401

        raise NotImplementedError

    return make


async def stop_container(container) -> None:
    return None


def limits_report() -> str:
    return "unknown"
