"""The web console (issue 14): `GET /` and `GET /console/…` on the standalone runtime — static files, nothing else.

The console is plain files in console/ (no build step) plus three files of the terminal widget from node_modules/
(@xterm/xterm and @xterm/addon-fit, package.json `dependencies`). Every URL it answers is a key of FILES, an
allow-list: a request path is never joined onto a directory, so no path can reach another file. The page talks to
the /v1 API like any client, with the credential in an Authorization header (or, for the terminal's WebSocket, a
subprotocol); this module reads no credential and serves no data.

Every answer — files and errors alike — carries HEADERS: a strict Content-Security-Policy (no inline script or style,
nothing from another origin), no framing, no sniffing, no referrer. The Cloudflare deployment serves the same files as
static assets, staged by scripts/stage_worker.sh, with the same headers from console/_headers
(tests/console/test_console_files.py keeps the two in step).
"""

from pathlib import Path

from durable.ports import Response
from protocol.errors import ProtocolError

REPO = Path(__file__).resolve().parents[2]

# style-src-elem adds 'unsafe-inline' for <style> elements alone: xterm.js 6 writes its theme colours and cell sizes
# into <style> elements it creates (its DOM renderer and scrollbar), and without them the terminal renders unreadable.
# Style attributes stay refused (style-src 'self': xterm sets element styles through CSSOM, which CSP allows), and so
# does every inline script; the console itself has neither.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; style-src-elem 'self' 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data: blob:; font-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}

# URL path → (file under the repo, its Content-Type). The vendor files keep their URLs when node_modules is missing:
# they answer 404 then, and the page says how to install the widget (scripts/setup.sh).
FILES: dict[str, tuple[str, str]] = {
    "/": ("console/index.html", "text/html; charset=utf-8"),
    "/console/console.js": ("console/console.js", "text/javascript; charset=utf-8"),
    "/console/console.css": ("console/console.css", "text/css; charset=utf-8"),
    "/console/vendor/xterm.js": ("node_modules/@xterm/xterm/lib/xterm.js", "text/javascript; charset=utf-8"),
    "/console/vendor/xterm.css": ("node_modules/@xterm/xterm/css/xterm.css", "text/css; charset=utf-8"),
    "/console/vendor/addon-fit.js": (
        "node_modules/@xterm/addon-fit/lib/addon-fit.js",
        "text/javascript; charset=utf-8",
    ),
}
VENDOR_PREFIX = "/console/vendor/"


def serves(path: str) -> bool:
    """Whether an HTTP path is the console's rather than the API's: `/` and everything under `/console/`."""
    return path == "/" or path.startswith("/console/")


def respond(method: str, path: str, root: Path = REPO) -> Response:
    """The answer to `method path` (a path `serves` accepted); `root` is where the repo's files are."""
    if path not in FILES:
        return _error(ProtocolError("not_found", "no such file of the web console"))
    if method not in ("GET", "HEAD"):
        response = _error(ProtocolError("method_not_allowed", "the web console's files answer GET and HEAD only"))
        response.headers["allow"] = "GET, HEAD"
        return response
    relative, content_type = FILES[path]
    try:
        data = (root / relative).read_bytes()
    except OSError:
        if path.startswith(VENDOR_PREFIX):
            message = "the terminal widget is not installed on this server: run scripts/setup.sh (it runs npm ci)"
        else:
            message = "the web console's files are missing from this server's checkout"
        return _error(ProtocolError("not_found", message))
    headers = {
        **HEADERS,
        "content-type": content_type,
        "content-length": str(len(data)),
        # the page is always fetched anew; its scripts and styles are revalidated (a server upgrade shows at once)
        "cache-control": "no-store" if path == "/" else "no-cache",
    }
    return Response(200, b"" if method == "HEAD" else data, headers)


def _error(err: ProtocolError) -> Response:
    response = Response.error(err)
    response.headers.update(HEADERS)
    return response
