"""Deployment settings, read from the Worker's vars (wrangler.jsonc) or the standalone runtime's environment."""

from dataclasses import dataclass

from protocol import limits
from worker.access import team_origin  # the one check of ACCESS_TEAM_DOMAIN (pure; no I/O)

# Every var Settings.from_vars reads; both runtimes take exactly these from their vars or environment.
SETTING_VARS = (
    "IDLE_SECONDS",
    "ENABLE_INTERNET",
    "ALLOWED_INSTANCE_TYPES",
    "DEFAULT_INSTANCE_TYPE",
    "SNAPSHOT_INTERVAL_SECONDS",
    "MAX_KEPT_SNAPSHOTS",
    "BACKUP_INTERVAL_SECONDS",
    "IMAGES",
    "MAX_FILE_READ_BYTES",
    "MAX_FILE_WRITE_BYTES",
    "MAX_WORKSPACES_PER_NAMESPACE",
    "AUDIT_MAX_RECORDS",
    "AUDIT_MAX_AGE_DAYS",
    "ACCESS_TEAM_DOMAIN",
    "ACCESS_AUD",
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


# The images a deployment offers unless IMAGES says otherwise: the workspace image, and the same plus Hermes for
# `flarebox hermes host` (wrangler.jsonc builds both from container/Dockerfile)
DEFAULT_IMAGES = (limits.DEFAULT_IMAGE, "hermes-agent")


@dataclass(frozen=True)
class Settings:
    idle_seconds: int = limits.DEFAULT_IDLE_SECONDS
    enable_internet: bool = True
    allowed_instance_types: tuple[str, ...] = ("lite", "standard-1")
    default_instance_type: str = "standard-1"
    snapshot_interval_seconds: int = 0  # 0: periodic checkpoints off
    max_kept_snapshots: int = 10  # snapshots pinned with {"keep": true}, which retention never drops
    backup_interval_seconds: int = 0  # 0: no backups on a schedule (POST …/backup still writes one)
    images: tuple[str, ...] = DEFAULT_IMAGES
    max_file_read_bytes: int = limits.MAX_FILE_READ_BYTES
    max_file_write_bytes: int = limits.MAX_FILE_WRITE_BYTES
    max_workspaces_per_namespace: int = 0  # 0: no cap
    audit_max_records: int = 20_000  # the audit log keeps at most this many records...
    audit_max_age_days: int = 90  # ...none older than this
    # Cloudflare Access in front (both set, or neither): the team's domain and the application's AUD tag
    access_team_domain: str | None = None
    access_aud: str | None = None

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
        team = (env.get("ACCESS_TEAM_DOMAIN") or "").strip() or None
        aud = (env.get("ACCESS_AUD") or "").strip() or None
        if (team is None) != (aud is None):
            raise ValueError("ACCESS_TEAM_DOMAIN and ACCESS_AUD are set together (Cloudflare Access), or neither")
        if team is not None:
            team_origin(team)  # a malformed domain fails here, naming ACCESS_TEAM_DOMAIN, not at the first request
        images = tuple(i.strip() for i in str(env.get("IMAGES") or ",".join(DEFAULT_IMAGES)).split(",") if i.strip())
        return cls(
            idle_seconds=_int(env.get("IDLE_SECONDS"), limits.DEFAULT_IDLE_SECONDS, 1, 7 * 86400, "IDLE_SECONDS"),
            enable_internet=_bool(env.get("ENABLE_INTERNET"), True),
            allowed_instance_types=allowed,
            default_instance_type=default,
            snapshot_interval_seconds=_int(
                env.get("SNAPSHOT_INTERVAL_SECONDS"), 0, 0, 7 * 86400, "SNAPSHOT_INTERVAL_SECONDS"
            ),
            max_kept_snapshots=_int(env.get("MAX_KEPT_SNAPSHOTS"), 10, 0, 1000, "MAX_KEPT_SNAPSHOTS"),
            backup_interval_seconds=_int(
                env.get("BACKUP_INTERVAL_SECONDS"), 0, 0, 365 * 86400, "BACKUP_INTERVAL_SECONDS"
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
            max_workspaces_per_namespace=_int(
                env.get("MAX_WORKSPACES_PER_NAMESPACE"), 0, 0, 10**9, "MAX_WORKSPACES_PER_NAMESPACE"
            ),
            audit_max_records=_int(env.get("AUDIT_MAX_RECORDS"), 20_000, 100, 10**8, "AUDIT_MAX_RECORDS"),
            audit_max_age_days=_int(env.get("AUDIT_MAX_AGE_DAYS"), 90, 1, 36_500, "AUDIT_MAX_AGE_DAYS"),
            access_team_domain=team,
            access_aud=aud,
        )
