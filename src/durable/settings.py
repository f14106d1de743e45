"""Deployment settings, read from the Worker's vars (wrangler.jsonc) or the standalone runtime's environment."""

from dataclasses import dataclass

from protocol import limits

# Every var Settings.from_vars reads; both runtimes take exactly these from their vars or environment.
SETTING_VARS = (
    "IDLE_SECONDS",
    "ENABLE_INTERNET",
    "ALLOWED_INSTANCE_TYPES",
    "DEFAULT_INSTANCE_TYPE",
    "SNAPSHOT_INTERVAL_SECONDS",
    "IMAGES",
    "MAX_FILE_READ_BYTES",
    "MAX_FILE_WRITE_BYTES",
)


def _bool(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _int(value: str | None, default: int, lo: int, hi: int, name: str) -> int:
    if value is None or value == "":
        return default
    number = int(str(value).strip())
    if not lo <= number <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}")
    return number


@dataclass(frozen=True)
class Settings:
    idle_seconds: int = limits.DEFAULT_IDLE_SECONDS
    enable_internet: bool = True
    allowed_instance_types: tuple[str, ...] = ("lite", "standard-1")
    default_instance_type: str = "standard-1"
    snapshot_interval_seconds: int = 0  # 0: periodic checkpoints off
    images: tuple[str, ...] = (limits.DEFAULT_IMAGE,)
    max_file_read_bytes: int = limits.MAX_FILE_READ_BYTES
    max_file_write_bytes: int = limits.MAX_FILE_WRITE_BYTES

    @classmethod
    def from_vars(cls, env: dict) -> "Settings":
        """Build from string vars (env vars or Worker vars). Raises ValueError naming the bad variable."""
        allowed = tuple(
            t.strip() for t in str(env.get("ALLOWED_INSTANCE_TYPES") or "lite,standard-1").split(",") if t.strip()
        )
        for t in allowed:
            if t not in limits.INSTANCE_TYPES:
                raise ValueError(f"ALLOWED_INSTANCE_TYPES: unknown instance type {t!r}")
        if not allowed:
            raise ValueError("ALLOWED_INSTANCE_TYPES is empty")
        fallback = "standard-1" if "standard-1" in allowed else allowed[0]
        default = str(env.get("DEFAULT_INSTANCE_TYPE") or fallback).strip()
        if default not in allowed:
            raise ValueError("DEFAULT_INSTANCE_TYPE must be one of ALLOWED_INSTANCE_TYPES")
        images = tuple(i.strip() for i in str(env.get("IMAGES") or limits.DEFAULT_IMAGE).split(",") if i.strip())
        return cls(
            idle_seconds=_int(env.get("IDLE_SECONDS"), limits.DEFAULT_IDLE_SECONDS, 1, 7 * 86400, "IDLE_SECONDS"),
            enable_internet=_bool(env.get("ENABLE_INTERNET"), True),
            allowed_instance_types=allowed,
            default_instance_type=default,
            snapshot_interval_seconds=_int(
                env.get("SNAPSHOT_INTERVAL_SECONDS"), 0, 0, 7 * 86400, "SNAPSHOT_INTERVAL_SECONDS"
            ),
            images=images,
            max_file_read_bytes=_int(
                env.get("MAX_FILE_READ_BYTES"),
                limits.MAX_FILE_READ_BYTES,
                1,
                limits.MAX_FILE_READ_BYTES,
                "MAX_FILE_READ_BYTES",
            ),
            max_file_write_bytes=_int(
                env.get("MAX_FILE_WRITE_BYTES"),
                limits.MAX_FILE_WRITE_BYTES,
                1,
                limits.MAX_FILE_WRITE_BYTES,
                "MAX_FILE_WRITE_BYTES",
            ),
        )
