"""`flarebox snapshot/snapshots/label/restore/fork/export/import/backup/backups`: snapshots a user controls.

Export writes the archive to stdout and import reads it from stdin (`flarebox export WS > ws.tar.zst`), so a
terminal is never filled with binary: both refuse a terminal and say what to do. Progress goes to stderr.
"""

import argparse
import sys
import time

from standalone.cli_support import UsageError, print_json

COMMANDS = ("snapshot", "snapshots", "label", "restore", "fork", "export", "import", "backup", "backups")


def add_parsers(client_command) -> None:
    """Register the commands through the CLI's `client_command(name, help)` (which adds WS and the connection
    options)."""
    snap = client_command("snapshot", "save a snapshot now (the workspace keeps running)")
    snap.add_argument("--label", default=None, help="a name to find it by (up to 100 characters)")
    snap.add_argument("--keep", action="store_true", help="pin it: retention never drops it")
    client_command("snapshots", "list a workspace's snapshots, newest first")
    label = client_command("label", "relabel, pin or unpin a snapshot")
    label.add_argument("snapshot", help="the snapshot's id (flarebox snapshots lists them)")
    label.add_argument("--label", default=None, help="its new label")
    label.add_argument("--clear-label", action="store_true", help="remove its label")
    pin = label.add_mutually_exclusive_group()
    pin.add_argument("--keep", dest="keep", action="store_true", default=None, help="pin it")
    pin.add_argument("--no-keep", dest="keep", action="store_false", help="unpin it")
    restore = client_command("restore", "roll back: the next start restores a snapshot or a backup")
    restore.add_argument("snapshot", nargs="?", default=None, help="a snapshot id, or latest")
    restore.add_argument("--backup", default=None, help="restore this backup instead")
    restore.add_argument(
        "--discard-changes", action="store_true", help="do not snapshot the running files first (they are lost)"
    )
    fork = client_command("fork", "create a workspace that starts from another's snapshot: fork SOURCE NEW")
    fork.add_argument("new", help="the new workspace (same namespace)")
    fork.add_argument("--snapshot", default=None, help="which snapshot (default: the source's files now)")
    client_command("export", "write the workspace's files as a tar.zst to stdout")
    client_command("import", "replace a stopped workspace's files with a tar.zst read from stdin")
    client_command("backup", "write a backup to the deployment's backup store now")
    client_command("backups", "list a workspace's backups, newest first")


class _Progress:
    """`12.3 MiB` on stderr at most every half second, and once at the end; nothing when stderr is no terminal."""

    def __init__(self, verb: str):
        self._verb = verb
        self._shown_at = 0.0
        self._last = 0
        self._live = sys.stderr.isatty()

    def __call__(self, done: int) -> None:
        self._last = done
        now = time.monotonic()
        if self._live and now - self._shown_at >= 0.5:
            self._shown_at = now
            sys.stderr.write(f"\r{self._verb} {done / 1048576:.1f} MiB")
            sys.stderr.flush()

    def finish(self) -> None:
        if self._live:
            sys.stderr.write("\r")
        sys.stderr.write(f"{self._verb} {self._last / 1048576:.1f} MiB\n")
        sys.stderr.flush()


def run(client, args: argparse.Namespace) -> int:
    ns, ws = args.namespace, args.workspace
    command = args.command
    if command == "snapshot":
        print_json(client.snapshot(ns, ws, label=args.label, keep=args.keep))
    elif command == "snapshots":
        print_json(client.snapshots(ns, ws))
    elif command == "label":
        fields = {}
        if args.label is not None and args.clear_label:
            raise UsageError("flarebox label: give --label or --clear-label, not both")
        if args.label is not None or args.clear_label:
            fields["label"] = args.label
        if args.keep is not None:
            fields["keep"] = args.keep
        if not fields:
            raise UsageError("flarebox label: say what to change (--label, --clear-label, --keep or --no-keep)")
        print_json(client.patch_snapshot(ns, ws, args.snapshot, **fields))
    elif command == "restore":
        if (args.snapshot is None) == (args.backup is None):
            raise UsageError("flarebox restore: name a snapshot (or latest), or --backup ID")
        answer = client.restore(
            ns, ws, snapshot=args.snapshot, backup=args.backup, discard_changes=args.discard_changes
        )
        print_json(answer)
    elif command == "fork":
        print_json(client.fork(ns, args.new, (ns, ws), args.snapshot))
    elif command == "export":
        if sys.stdout.isatty():
            raise UsageError(f"flarebox export writes a binary archive: redirect it, e.g. > {ws}.tar.zst")
        progress = _Progress("exported")
        client.export(ns, ws, sys.stdout.buffer, on_progress=progress)
        sys.stdout.buffer.flush()
        progress.finish()
    elif command == "import":
        if sys.stdin.isatty():
            raise UsageError(f"flarebox import reads an archive from stdin, e.g. < {ws}.tar.zst")
        progress = _Progress("sent")
        answer = client.import_archive(ns, ws, sys.stdin.buffer, on_progress=progress)
        progress.finish()
        print_json(answer)
    elif command == "backup":
        print_json(client.backup(ns, ws))
    elif command == "backups":
        print_json(client.backups(ns, ws))
    return 0
