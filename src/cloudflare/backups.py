"""ports.BackupStore over the R2 bucket binding `BACKUPS` (wrangler.jsonc r2_buckets), written by the Durable Object:
no credentials ever reach a container.

Objects: `backups/<namespace>/<workspace>/<id>.tar.zst` (the export archive) and `<id>.json`, the marker — the commit
point, like the standalone store's manifest (standalone/backups.py). Its customMetadata holds the backup's facts
(size, sha256, created_at_ms), so `list` reads a whole page of markers in one call.

An export's length is unknown until it ends, and R2's put() of a stream needs a known length, so the archive goes up
as a multipart upload: parts of PART_BYTES (R2 wants every part but the last at least 5 MiB and all of them the same
size; the last no larger), the sha256 computed here over the same chunks. Any failure aborts the upload. Once
complete the archive is read back (get → the body's chunks → sha256) and only a match writes the marker; a mismatch
deletes the archive. So a full or gone bucket, or one that gives back other bytes, leaves nothing listed. An archive
without a marker (the object was evicted between the two) is a leftover: `list` ignores it and removes it once it
is ORPHAN_GRACE_MS old (R2 itself aborts an unfinished multipart upload after 7 days).

The binding is used raw, like ctx.container: the Workers SDK wraps R2 bindings of `env` and converts their answers
to Python, and the stream handling here wants the JS objects.
"""

import hashlib
import json
import logging
import re
from typing import Any

import js
from pyodide.ffi import JsException, create_once_callable, create_proxy, to_js

from cloudflare.jsutil import is_null, jsobj, to_bytes, uint8
from durable.ports import BackupInfo, ContainerGone
from protocol.errors import ProtocolError
from protocol.validate import validate_name

log = logging.getLogger("flarebox.cloudflare.backups")

ROOT = "backups"
ARCHIVE_SUFFIX = ".tar.zst"
MARKER_SUFFIX = ".json"
KIND = "flarebox-backup"
VERSION = 1
# Multipart rules of R2: parts of 5 MiB to 5 GiB, the same size but the last, at most 10,000 of them. 8 MiB parts
# keep one part in memory at a time (an isolate has 128 MB) and allow backups up to 78 GiB.
PART_BYTES = 8 * 1024 * 1024
MAX_PARTS = 10_000
ORPHAN_GRACE_MS = 3600 * 1000  # far longer than a write's verify step: an archive this old lost its marker
_ID = re.compile(r"^b-\d{13}-[0-9a-f]{6}$")


def _raw(binding: Any) -> Any:
    """The JS R2Bucket under the SDK's env wrapper (workers.rpc._BindingWrapper), or None."""
    if is_null(binding):
        return None
    return getattr(binding, "_binding", binding)


def _why(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else exc.__class__.__name__


def _failed(reason: str) -> ProtocolError:
    return ProtocolError("backup_failed", f"the backup could not be written: {reason}; the workspace is unchanged")


class _Mismatch(Exception):
    pass


def _info(backup_id: str, meta: Any) -> BackupInfo | None:
    """A marker's customMetadata as a BackupInfo; None for one that is not a marker of ours (or is damaged)."""
    if is_null(meta):
        return None
    try:
        if str(meta.kind) != KIND or str(meta.version) != str(VERSION) or str(meta.id) != backup_id:
            return None
        sha = str(meta.sha256)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            return None
        return BackupInfo(
            id=backup_id, size=int(str(meta.size)), created_at_ms=int(str(meta.created_at_ms)), sha256=sha
        )
    except (AttributeError, ValueError, TypeError):
        return None


def _ignore(*_args: Any) -> None:
    return None


_IGNORE = create_proxy(_ignore)  # one handler for the promises nobody awaits (a proxy per call would leak)


class R2BackupStore:
    """`bucket`: env.BACKUPS (the SDK's wrapper or the raw binding), or None where the binding is absent."""

    def __init__(self, bucket: Any):
        self._bucket = _raw(bucket)
        self.available = self._bucket is not None

    # ---- layout -------------------------------------------------------------------------------------------
    def _need(self) -> Any:
        if self._bucket is None:
            raise ProtocolError("backups_unavailable")
        return self._bucket

    @staticmethod
    def prefix(namespace: str, workspace: str) -> str:
        validate_name(namespace, "namespace")
        validate_name(workspace, "workspace")
        return f"{ROOT}/{namespace}/{workspace}/"

    @staticmethod
    def valid_id(backup_id: Any) -> bool:
        return isinstance(backup_id, str) and _ID.fullmatch(backup_id) is not None

    # ---- writing ------------------------------------------------------------------------------------------
    async def write(self, namespace: str, workspace: str, backup_id: str, body: Any, created_at_ms: int) -> BackupInfo:
        """Upload the export stream `body` (a JS ReadableStream) as backup `backup_id`, verify, then mark it.
        Raises ProtocolError('backup_failed'); ContainerGone when `body` itself broke (the container stopped)."""
        prefix = self.prefix(namespace, workspace)
        bucket = self._need()
        if not self.valid_id(backup_id):
            raise ValueError(f"not a backup id: {backup_id!r}")
        key, marker = prefix + backup_id + ARCHIVE_SUFFIX, prefix + backup_id + MARKER_SUFFIX
        try:
            upload = await bucket.createMultipartUpload(
                key, jsobj({"httpMetadata": {"contentType": "application/zstd"}})
            )
        except JsException as exc:
            _cancel(body)
            raise _failed(f"R2 refused the upload ({_why(exc)})") from None
        completed = marked = False
        try:
            size, sha, parts = await self._upload_parts(upload, body)
            await upload.complete(to_js(parts, dict_converter=js.Object.fromEntries))
            completed = True
            await self._verify(bucket, key, size, sha)
            info = BackupInfo(id=backup_id, size=size, created_at_ms=int(created_at_ms), sha256=sha)
            meta = {"kind": KIND, "version": str(VERSION), "id": backup_id, "size": str(size), "sha256": sha}
            meta["created_at_ms"] = str(info.created_at_ms)
            await bucket.put(
                marker,
                uint8(_marker_body(meta)),
                jsobj({"httpMetadata": {"contentType": "application/json"}, "customMetadata": meta}),
            )
            marked = True
            return info
        except JsException as exc:
            raise _failed(f"R2 failed ({_why(exc)})") from None
        except _Mismatch as exc:
            raise _failed(f"R2 gave back other bytes than were written ({exc})") from None
        finally:
            if not marked:
                await self._undo(upload, completed, bucket, key, marker)

    async def _upload_parts(self, upload: Any, body: Any) -> tuple[int, str, list[dict[str, Any]]]:
        digest = hashlib.sha256()
        size = 0
        parts: list[dict[str, Any]] = []
        pending = bytearray()
        reader = body.getReader()
        try:
            while True:
                try:
                    result = await reader.read()
                except JsException as exc:
                    raise ContainerGone(f"the container's export stream ended abnormally ({_why(exc)})") from None
                if result.done:
                    break
                chunk = to_bytes(result.value)
                digest.update(chunk)
                size += len(chunk)
                pending += chunk
                while len(pending) >= PART_BYTES:  # every part but the last exactly PART_BYTES: R2's rule
                    await self._part(upload, parts, bytes(pending[:PART_BYTES]))
                    del pending[:PART_BYTES]
            if pending or not parts:
                await self._part(upload, parts, bytes(pending))  # the last part (an empty export: its only one)
        except BaseException:
            reader.cancel().then(_IGNORE, _IGNORE)  # drops the container's stream, unread
            raise
        return size, digest.hexdigest(), parts

    @staticmethod
    async def _part(upload: Any, parts: list[dict[str, Any]], data: bytes) -> None:
        if len(parts) >= MAX_PARTS:
            raise _failed(f"the export is larger than R2's {MAX_PARTS} parts of {PART_BYTES} bytes")
        uploaded = await upload.uploadPart(len(parts) + 1, uint8(data))
        parts.append({"partNumber": int(uploaded.partNumber), "etag": str(uploaded.etag)})

    @staticmethod
    async def _verify(bucket: Any, key: str, size: int, sha: str) -> None:
        """Read the completed archive back from R2 and compare it with what went up."""
        obj = await bucket.get(key)
        if is_null(obj):
            raise _Mismatch("the archive is missing after its upload")
        if int(obj.size) != size:
            _cancel(obj.body)
            raise _Mismatch(f"{int(obj.size)} bytes where {size} were written")
        digest = hashlib.sha256()
        seen = 0
        reader = obj.body.getReader()
        while not (result := await reader.read()).done:
            chunk = to_bytes(result.value)
            digest.update(chunk)
            seen += len(chunk)
        if seen != size:
            raise _Mismatch(f"{seen} bytes read where {size} were written")
        if digest.hexdigest() != sha:
            raise _Mismatch("the sha256 differs")

    @staticmethod
    async def _undo(upload: Any, completed: bool, bucket: Any, key: str, marker: str) -> None:
        """Best effort after a failure: nothing of this backup may stay (a gone bucket refuses this too; R2 then
        aborts the upload itself after 7 days, and `list` removes an archive without a marker)."""
        try:
            if completed:
                await bucket.delete(to_js([marker, key]))
            else:
                await upload.abort()
        except JsException as exc:
            log.warning("could not clean up the failed backup %s: %s", key, _why(exc))

    # ---- reading ------------------------------------------------------------------------------------------
    async def list(self, namespace: str, workspace: str) -> list[BackupInfo]:
        """The marked backups, newest first ([] without the binding). Raises ProtocolError('backup_failed') when
        R2 cannot be listed."""
        prefix = self.prefix(namespace, workspace)
        if self._bucket is None:
            return []
        found: list[BackupInfo] = []
        marked: set[str] = set()
        archives: dict[str, int] = {}  # id -> uploaded (ms)
        cursor = None
        try:
            while True:
                options: dict[str, Any] = {"prefix": prefix, "include": ["customMetadata"]}
                if cursor is not None:
                    options["cursor"] = cursor
                page = await self._bucket.list(jsobj(options))
                for obj in page.objects:
                    name = str(obj.key)[len(prefix) :]
                    if name.endswith(MARKER_SUFFIX) and self.valid_id(backup_id := name[: -len(MARKER_SUFFIX)]):
                        marked.add(backup_id)
                        info = _info(backup_id, obj.customMetadata)
                        if info is not None:
                            found.append(info)
                    elif name.endswith(ARCHIVE_SUFFIX) and self.valid_id(backup_id := name[: -len(ARCHIVE_SUFFIX)]):
                        archives[backup_id] = int(obj.uploaded.getTime())
                if not page.truncated:
                    break
                cursor = str(page.cursor)
        except JsException as exc:
            raise ProtocolError("backup_failed", f"the backups cannot be listed: R2 failed ({_why(exc)})") from None
        await self._remove_orphans(prefix, {b: t for b, t in archives.items() if b not in marked})
        found.sort(key=lambda b: (b.created_at_ms, b.id), reverse=True)
        return found

    async def _remove_orphans(self, prefix: str, orphans: dict[str, int]) -> None:
        now = int(js.Date.now())
        old = [prefix + b + ARCHIVE_SUFFIX for b, uploaded in orphans.items() if now - uploaded >= ORPHAN_GRACE_MS]
        if not old:
            return
        try:
            await self._bucket.delete(to_js(old))
            log.info("removed %d backup archive(s) without a marker under %s", len(old), prefix)
        except JsException as exc:
            log.warning("could not remove backup archives without a marker under %s: %s", prefix, _why(exc))

    async def open(self, namespace: str, workspace: str, backup_id: str) -> tuple[BackupInfo, Any]:
        """The backup and its archive as a JS ReadableStream that errors instead of ending when the bytes do not
        match the marker's sha256. Its length is lost on the way: send it with content-length = info.size (the
        container adapter then frames it through a FixedLengthStream)."""
        prefix = self.prefix(namespace, workspace)
        bucket = self._need()
        if not self.valid_id(backup_id):
            raise ProtocolError("backup_not_found", f"no backup {backup_id!r}")
        try:
            marker = await bucket.head(prefix + backup_id + MARKER_SUFFIX)
            info = None if is_null(marker) else _info(backup_id, marker.customMetadata)
            if info is None:
                raise ProtocolError("backup_not_found", f"no backup {backup_id} of {namespace}/{workspace}")
            obj = await bucket.get(prefix + backup_id + ARCHIVE_SUFFIX)
        except JsException as exc:
            raise ProtocolError(
                "backup_failed", f"backup {backup_id} cannot be read: R2 failed ({_why(exc)})"
            ) from None
        if is_null(obj):
            raise _damaged(info, "has lost its archive")
        if int(obj.size) != info.size:
            _cancel(obj.body)
            raise _damaged(info, f"has {int(obj.size)} bytes where its marker says {info.size}")
        return info, _verifying(obj.body, info)

    async def delete(self, namespace: str, workspace: str, backup_id: str) -> None:
        """Remove a backup, marker first (it stops being listed before its archive goes). Missing is fine."""
        prefix = self.prefix(namespace, workspace)
        bucket = self._need()
        if not self.valid_id(backup_id):
            return
        try:
            await bucket.delete(prefix + backup_id + MARKER_SUFFIX)
            await bucket.delete(prefix + backup_id + ARCHIVE_SUFFIX)
        except JsException as exc:
            raise ProtocolError(
                "backup_failed", f"backup {backup_id} cannot be deleted: R2 failed ({_why(exc)})"
            ) from None


def _marker_body(meta: dict[str, str]) -> bytes:
    return json.dumps(meta, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _damaged(info: BackupInfo, why: str) -> ProtocolError:
    return ProtocolError("backup_failed", f"backup {info.id} {why}: it is damaged and cannot be restored")


def _cancel(stream: Any) -> None:
    if not is_null(stream):
        try:
            stream.cancel().then(_IGNORE, _IGNORE)
        except JsException:
            pass  # locked or gone already


def _verifying(body: Any, info: BackupInfo) -> Any:
    """`body` through an identity TransformStream that hashes each chunk (one Python call per chunk) and errors the
    stream at its end when the size or sha256 differs from the marker's, so an import fed by it breaks."""
    digest = hashlib.sha256()
    seen = [0]

    def transform(chunk: Any, controller: Any) -> None:
        data = to_bytes(chunk)
        digest.update(data)
        seen[0] += len(data)
        controller.enqueue(chunk)

    transform_proxy = create_proxy(transform)

    def flush(controller: Any) -> None:
        transform_proxy.destroy()  # no chunk comes after flush
        if seen[0] != info.size or digest.hexdigest() != info.sha256:
            message = f"backup {info.id} failed its sha256 check while it was read: it is damaged"
            log.error(message)
            controller.error(js.Error.new(message))

    transformer = js.Object.new()
    transformer.transform = transform_proxy
    transformer.flush = create_once_callable(flush)
    return body.pipeThrough(js.TransformStream.new(transformer))
