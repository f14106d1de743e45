"""The deployment-wide client commands: `flarebox keys create|ls|rm` (scoped keys, with the deployment token),
`flarebox ls` (the workspaces the credential can see) and `flarebox audit` (what was changed or run, newest first).

Tables go to stdout, one row a line; `--json` prints the server's objects instead. Text that came from the server
(a command, a label, a path) is printed with control characters escaped: a key holder must not be able to put
terminal escape sequences in front of whoever reads the audit log.
"""

import argparse
import calendar
import re
import sys
import time
from datetime import UTC, datetime

from standalone.cli_support import UsageError, print_json, say

SCOPES = ("exec", "files", "snapshots", "manage", "proxy")  # protocol/keys.py; tests/standalone checks they match
AUDIT_DEFAULT_LIMIT = 50
MAX_PAGE = 1000  # protocol/limits.py MAX_PAGE_RECORDS: the most one listing answers
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d+[smhdw])+")
_DURATION_PART = re.compile(r"(\d+)([smhdw])")
WHOLE_NAMESPACE = "*"  # a key's workspace column when it opens every workspace of its namespace


LISTING_NAMESPACE = "only this namespace (default: every one the token or key can see)"


def add_parsers(sub, connection_options) -> None:
    """The commands' parsers, on `sub` (the top parser's subcommands); `connection_options(parser, namespace_help)`
    adds --endpoint / --token-file / --namespace as every client command has them."""

    def command(parent, name: str, help_text: str, namespace_help: str | None) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_text)
        connection_options(p, namespace_help)
        return p

    keys = sub.add_parser("keys", help="scoped keys: create, list and revoke them (with the deployment token)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = command(
        keys_sub,
        "create",
        "mint a key for one namespace (or one workspace of it)",
        "the namespace the key opens (required)",
    )
    create.add_argument("--workspace", "-w", metavar="WS", default=None, help="only this workspace (default: all)")
    create.add_argument(
        "--scope",
        "-s",
        dest="scopes",
        action="append",
        metavar="SCOPE",
        default=[],
        help=f"what the key may do; repeat or separate by commas: {', '.join(SCOPES)}",
    )
    create.add_argument(
        "--expires-in", metavar="DURATION", default=None, help="seconds, or 30d, 12h, 15m, 2w, 1d12h (default: never)"
    )
    create.add_argument(
        "--service",
        metavar="NAME",
        default=None,
        help="bind a proxy key to this service of --workspace: it opens that service's /v1/proxy and nothing else",
    )
    create.add_argument("--label", metavar="TEXT", default=None, help="a name for the key in lists and the audit log")
    create.add_argument("--json", action="store_true", help="print the key object (with its secret) as JSON")
    keys_ls = command(keys_sub, "ls", "list the keys (never their secrets)", "only the keys of this namespace")
    keys_ls.add_argument("--json", action="store_true", help="print the key objects as JSON")
    keys_rm = command(keys_sub, "rm", "revoke a key now", "not used")
    keys_rm.add_argument("key_id", metavar="ID", help="the key's id (the 16 hex characters after fbk_)")
    keys_rm.add_argument("--json", action="store_true", help="print the revoked key object as JSON")

    ls = command(sub, "ls", "list the workspaces this token or key can see", LISTING_NAMESPACE)
    ls.add_argument("--json", action="store_true", help="print the status objects as JSON")

    audit = command(sub, "audit", "show what was changed or run, newest first", LISTING_NAMESPACE)
    audit.add_argument("--workspace", "-w", metavar="WS", default=None, help="only this workspace (needs -n)")
    audit.add_argument(
        "--since", metavar="WHEN", default=None, help="2026-12-01, 2026-12-01T09:00:00Z, or 2h / 30m / 7d ago"
    )
    audit.add_argument(
        "--limit", type=int, default=AUDIT_DEFAULT_LIMIT, help=f"at most N records (default {AUDIT_DEFAULT_LIMIT})"
    )
    audit.add_argument("--json", action="store_true", help="print the records as JSON")


def run(client, args) -> int:
    if args.command == "keys":
        return {"create": _keys_create, "ls": _keys_ls, "rm": _keys_rm}[args.keys_command](client, args)
    if args.command == "ls":
        return _ls(client, args)
    return _audit(client, args)


# --- parsing ---------------------------------------------------------------------------------------------------


def parse_duration(text: str, what: str = "--expires-in") -> int:
    """Seconds from `3600`, `30d`, `12h`, `15m`, `90s`, `2w` or a sum such as `1d12h`."""
    value = text.strip().lower()
    if value.isascii() and value.isdigit():
        seconds = int(value)
    elif _DURATION.fullmatch(value):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _DURATION_PART.findall(value))
    else:
        raise UsageError(f"{what} {text!r}: give seconds or a duration such as 30d, 12h, 15m, 1d12h")
    if seconds <= 0:
        raise UsageError(f"{what} must be more than 0 seconds")
    return seconds


def parse_since(text: str, now: float | None = None) -> str:
    """The wire's timestamp (UTC, `Z`) for --since: a duration ago (2h, 7d), a date, or an ISO time (a time
    without a zone is UTC)."""
    value = text.strip()
    if _DURATION.fullmatch(value.lower()):
        moment = (time.time() if now is None else now) - parse_duration(value, "--since")
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"--since {text!r}: give a time such as 2026-12-01, 2026-12-01T09:00:00Z, or a duration ago: 2h, 7d"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    parsed = parsed.astimezone(UTC)
    return parsed.strftime("%Y-%m-%dT%H:%M:%S") + f".{parsed.microsecond // 1000:03d}Z"


def _scopes(values: list[str]) -> list[str]:
    scopes = [s.strip() for value in values for s in value.split(",") if s.strip()]
    if not scopes:
        raise UsageError(f"keys create needs at least one --scope: {', '.join(SCOPES)}")
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise UsageError(f"unknown scope {unknown[0]!r}: scopes are {', '.join(SCOPES)}")
    return sorted(set(scopes), key=SCOPES.index)


# --- output ----------------------------------------------------------------------------------------------------


def shown(text) -> str:
    """Server text made safe for a terminal: control characters (newlines, escapes) as backslash escapes."""
    if text is None:
        return ""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def _when(iso: str | None, *, never: str = "never", now: float | None = None, expiry: bool = False) -> str:
    """`2026-12-01T09:00:00.123Z` → `2026-12-01 09:00:00` (UTC); an expiry in the past is marked."""
    if not iso:
        return never
    text = shown(iso).replace("T", " ")[:19]
    if expiry:
        try:
            moment = calendar.timegm(time.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            return text
        if moment <= (time.time() if now is None else now):
            text += " (expired)"
    return text


def _duration(ms) -> str:
    if not isinstance(ms, int):
        return ""
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _size(n) -> str:
    if not isinstance(n, int):
        return ""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def table(headers: list[str], rows: list[list[str]]) -> None:
    """Columns padded to their widest cell, two spaces apart; the last column unpadded."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        print("  ".join(cells).rstrip())


def _target(namespace, workspace) -> str:
    if namespace is None:
        return "-"
    return f"{shown(namespace)}/{shown(workspace) if workspace is not None else WHOLE_NAMESPACE}"


# --- keys ------------------------------------------------------------------------------------------------------


def _keys_create(client, args) -> int:
    if args.namespace is None:
        raise UsageError("keys create needs --namespace NS (the namespace the key opens)")
    scopes = _scopes(args.scopes)
    expires_in = None if args.expires_in is None else parse_duration(args.expires_in)
    key = client.mint_key(
        args.namespace,
        scopes,
        workspace=args.workspace,
        expires_in=expires_in,
        label=args.label or None,
        service=args.service,
    )
    if args.json:
        print_json(key)
        return 0
    expires = _when(key.get("expires_at")) + (" UTC" if key.get("expires_at") else "")
    label = f" ({shown(key['label'])})" if key.get("label") else ""
    service = f" service {shown(key['service'])}" if key.get("service") else ""
    say(
        f"created key {key['id']}{label} for {_target(key['namespace'], key['workspace'])}{service}, "
        f"scopes {','.join(key['scopes'])}, expires {expires}"
    )
    print(key["key"], flush=True)  # stdout holds the secret alone: KEY=$(flarebox keys create …)
    if sys.stdout.isatty():
        say(
            "this is the only time the secret is shown: store it now "
            f"(it cannot be recovered; revoke it with `flarebox keys rm {key['id']}`)"
        )
    return 0


def _keys_ls(client, args) -> int:
    keys = client.list_keys(args.namespace)
    if args.json:
        print_json(keys)
        return 0
    if not keys:
        say("no keys" + (f" for namespace {args.namespace}" if args.namespace else ""))
        return 0
    rows = [
        [
            shown(k["id"]),
            shown(k.get("label")) or "-",
            shown(k["namespace"]),
            shown(k["workspace"]) if k.get("workspace") is not None else WHOLE_NAMESPACE,
            ",".join(shown(s) for s in k.get("scopes") or []),
            _when(k.get("expires_at"), expiry=True),
            _when(k.get("last_used_at")),
        ]
        for k in keys
    ]
    table(["ID", "LABEL", "NAMESPACE", "WORKSPACE", "SCOPES", "EXPIRES (UTC)", "LAST USED (UTC)"], rows)
    return 0


def _keys_rm(client, args) -> int:
    try:
        key = client.revoke_key(args.key_id)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.json:
        print_json(key)
        return 0
    label = f" ({shown(key['label'])})" if key.get("label") else ""
    say(f"revoked key {key['id']}{label} for {_target(key['namespace'], key['workspace'])}")
    return 0


# --- ls --------------------------------------------------------------------------------------------------------


def _ls(client, args) -> int:
    entries = list(client.iter_workspaces(args.namespace, page=MAX_PAGE))
    if args.json:
        print_json(entries)
        return 0
    if not entries:
        say("no workspaces" + (f" in namespace {args.namespace}" if args.namespace else ""))
        return 0
    rows = []
    for e in entries:
        config = e.get("config") if isinstance(e.get("config"), dict) else {}
        state = shown(e["state"]) if e.get("state") else f"? ({shown(e.get('error') or 'unknown')})"
        rows.append(
            [
                _target(e.get("namespace"), e.get("workspace")),
                state,
                _when(e.get("last_activity_at"), never="-"),
                shown(config.get("instance")) or ("default" if e.get("state") else "-"),
            ]
        )
    table(["WORKSPACE", "STATE", "LAST ACTIVITY (UTC)", "INSTANCE"], rows)
    return 0


# --- audit -----------------------------------------------------------------------------------------------------


def _audit(client, args) -> int:
    if args.workspace is not None and args.namespace is None:
        raise UsageError("audit --workspace needs --namespace NS too")
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    since = None if args.since is None else parse_since(args.since)
    records: list[dict] = []
    before = None
    more = False
    while len(records) < args.limit:
        page = client.list_audit(
            args.namespace,
            args.workspace,
            since=since,
            before=before,
            limit=min(MAX_PAGE, args.limit - len(records)),
        )
        records += page["records"]
        before = page.get("next")
        if before is None:
            break
    else:
        more = before is not None
    if args.json:
        print_json(records)
        return 0
    if not records:
        say("no audit records" + (" since " + since if since else ""))
        return 0
    rows = [
        [
            _when(r.get("at"), never="-"),
            _who(r),
            _target(r.get("namespace"), r.get("workspace")),
            shown(r.get("operation")),
            _outcome(r),
            _duration(r.get("duration_ms")),
            _detail(r),
        ]
        for r in records
    ]
    table(["TIME (UTC)", "WHO", "TARGET", "OPERATION", "OUTCOME", "DURATION", "DETAIL"], rows)
    if more:
        say(f"showing the newest {args.limit}; older records with --limit or --since")
    return 0


def _who(record: dict) -> str:
    if record.get("actor") == "admin" or record.get("key_id") is None:
        return "admin"
    label = f" ({shown(record['key_label'])})" if record.get("key_label") else ""
    return f"key {shown(record['key_id'])}{label}"


def _outcome(record: dict) -> str:
    status = record.get("status")
    if isinstance(status, int) and status < 400:
        return f"ok {status}"
    code = record.get("code")
    return f"{status} {shown(code)}" if code else str(status)


def _detail(record: dict) -> str:
    if record.get("command") is not None:
        return shown(record["command"])
    if record.get("path") is not None:
        size = _size(record.get("size"))
        return shown(record["path"]) + (f" ({size})" if size else "")
    if record.get("target_key_id") is not None:
        scopes = record.get("scopes")
        suffix = f" scopes {','.join(shown(s) for s in scopes)}" if isinstance(scopes, list) else ""
        return f"key {shown(record['target_key_id'])}{suffix}"
    if record.get("request_id"):
        return f"request {shown(record['request_id'])}"
    return ""
