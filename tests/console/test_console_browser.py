"""The web console in a real headless Chromium (issue 14): sign in, the workspace list, files (browse, download,
upload), snapshots (take, label, roll back), processes (list, signal) and the live terminal, against a real server.

Chromium is Debian's `chromium` (scripts/setup.sh installs it), driven by Playwright without `playwright install`.
Every test checks what the page must never do: keep the credential anywhere but sessionStorage (not localStorage, a
cookie or a URL), talk to another origin than the server's, or trip its Content-Security-Policy. Screenshots of each
step are kept in $FLAREBOX_TEST_ARTIFACTS (default build/test-artifacts/console/).
"""

import os
import re
import shutil
from pathlib import Path

import pytest
from e2e import put_workspace, run_ok, wait_until, ws_url

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("needs Debian's chromium (scripts/setup.sh dev installs it)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (the dev extra)")
expect = sync_api.expect

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FLAREBOX_TEST_ARTIFACTS") or REPO / "build" / "test-artifacts" / "console")
WIDGET = REPO / "node_modules" / "@xterm" / "xterm" / "lib" / "xterm.js"
STORE_KEY = "flarebox.credential"
NS = "console"

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap"),
]
needs_widget = pytest.mark.skipif(not WIDGET.exists(), reason="node_modules/@xterm is not installed (npm ci)")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Console:
    """One tab on the console, with what it requested and logged, and a screenshot per step."""

    def __init__(self, context, server, name: str):
        self.context = context
        self.server = server
        self.name = name
        self.page = context.new_page()
        self.requests: list[str] = []
        self.sockets: list[str] = []
        self.logged: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("websocket", lambda socket: self.sockets.append(socket.url))
        self.page.on("console", lambda message: self.logged.append(f"{message.type}: {message.text}"))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.steps = 0
        for old in ARTIFACTS.glob(f"{name}-*.png"):
            old.unlink()  # this test's screenshots of an earlier run

    def shot(self, step: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.steps += 1
        self.page.screenshot(path=str(ARTIFACTS / f"{self.name}-{self.steps:02d}-{step}.png"))

    def open(self, fragment: str = "") -> None:
        self.page.goto(self.server.url + "/" + fragment)

    def sign_in(self, credential: str | None = None) -> None:
        self.page.fill("#credential", credential or self.server.token)
        self.page.click("#signin-button")

    def workspace(self, ws: str, tab: str = "files") -> None:
        """Open a workspace from the list, then a tab."""
        self.page.click(f'#workspaces-body tr[data-workspace="{NS}/{ws}"] td.actions a')
        expect(self.page.locator("#ws-title")).to_have_text(f"{NS} / {ws}")
        if tab != "files":
            self.page.click(f'.tabs button[data-tab="{tab}"]')

    def check(self) -> None:
        """What every test holds: the credential only in sessionStorage, the server's origin only, no CSP report."""
        token = self.server.token
        page = self.page
        assert token not in page.url
        assert token not in page.evaluate("() => JSON.stringify(Object.entries(localStorage))")
        assert token not in page.evaluate("() => document.cookie")
        assert self.context.cookies() == []
        origin = self.server.url + "/"
        for url in self.requests:
            assert url.startswith((origin, "blob:" + self.server.url + "/", "data:")), url
            assert token not in url, url
        for url in self.sockets:
            assert url.startswith(origin.replace("http://", "ws://", 1)), url
            assert token not in url, url
        violations = [line for line in self.logged if "Content Security Policy" in line]
        assert not violations, violations
        assert not self.errors, self.errors


@pytest.fixture
def tab(browser, server, request):
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 800})
    view = Console(context, server, request.node.name.removeprefix("test_"))
    try:
        yield view
    finally:
        try:
            view.shot("last")
        finally:
            context.close()


@pytest.fixture(scope="module")
def api(server):
    with server.client() as client:
        yield client


def make_workspace(api, ws: str, files: dict[str, bytes] | None = None) -> None:
    assert put_workspace(api, NS, ws).status_code in (200, 201)
    for path, data in (files or {}).items():
        response = api.put(
            ws_url(NS, ws, "files"),
            params={"path": path},
            content=data,
            headers={"content-type": "application/octet-stream"},
        )
        assert response.status_code == 200, response.text


def test_a_wrong_token_shows_a_sign_in_error(tab):
    tab.open()
    expect(tab.page.locator("#view-signin")).to_be_visible()
    tab.shot("sign-in")
    tab.sign_in("not-the-token-" + "y" * 40)
    error = tab.page.locator("#signin-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("not accepted")
    expect(error).to_contain_text("unauthorized")
    tab.shot("refused")
    assert tab.page.evaluate(f"() => sessionStorage.getItem('{STORE_KEY}')") is None
    expect(tab.page.locator("#view-workspaces")).to_be_hidden()
    tab.check()


def test_sign_in_lists_the_workspaces_with_their_state(tab, api, server):
    make_workspace(api, "listed", {"/workspace/a.txt": b"a"})  # a file boots it: running
    make_workspace(api, "idle")  # never booted: created
    tab.open()
    tab.sign_in()
    expect(tab.page.locator("#view-workspaces")).to_be_visible()
    listed = tab.page.locator(f'#workspaces-body tr[data-workspace="{NS}/listed"]')
    idle = tab.page.locator(f'#workspaces-body tr[data-workspace="{NS}/idle"]')
    expect(listed.locator(".state")).to_have_text(api.get(ws_url(NS, "listed")).json()["state"])
    expect(listed.locator(".state")).to_have_text("running")
    expect(idle.locator(".state")).to_have_text("created")
    expect(tab.page.locator("#who-label")).to_have_text("Signed in with the deployment token")
    tab.shot("workspaces")
    # the credential is in this tab's sessionStorage, and a reload keeps it there
    assert tab.page.evaluate(f"() => sessionStorage.getItem('{STORE_KEY}')") == server.token
    tab.page.reload()
    expect(listed).to_be_visible()
    tab.check()
    tab.page.click("#sign-out")
    expect(tab.page.locator("#view-signin")).to_be_visible()
    assert tab.page.evaluate(f"() => sessionStorage.getItem('{STORE_KEY}')") is None
    tab.check()


def test_a_scoped_key_signs_in_and_sees_its_reach(tab, api, server):
    make_workspace(api, "keyed")
    assert put_workspace(api, "elsewhere", "hidden").status_code in (200, 201)
    minted = api.post("/v1/keys", json={"namespace": NS, "scopes": ["files"], "label": "console test"}).json()
    tab.open()
    tab.sign_in(minted["key"])
    expect(tab.page.locator(f'#workspaces-body tr[data-workspace="{NS}/keyed"]')).to_be_visible()
    expect(tab.page.locator('#workspaces-body tr[data-workspace="elsewhere/hidden"]')).to_have_count(0)
    expect(tab.page.locator("#who-label")).to_have_text(f"Signed in with the key {minted['id']}")
    tab.shot("key")
    # outside its scopes the page says why: a files key may not list processes
    tab.page.goto(server.url + "/#/w/console/keyed/processes")
    expect(tab.page.locator("#notice-text")).to_contain_text("forbidden")
    assert minted["key"] not in tab.page.evaluate("() => JSON.stringify(Object.entries(localStorage))")
    assert all(minted["key"] not in url for url in tab.requests)
    tab.check()


def test_the_workspace_list_pages_with_next(tab, api):
    # one page is 100 (the console's limit); another namespace, listed after NS, keeps NS's workspaces on page one
    for i in range(101):
        assert put_workspace(api, "paging", f"page-{i:03d}").status_code in (200, 201)
    tab.open()
    tab.sign_in()
    rows = tab.page.locator("#workspaces-body tr")
    expect(rows).to_have_count(100)
    more = tab.page.locator("#workspaces-more")
    expect(more).to_be_visible()
    more.click()
    expect(tab.page.locator('#workspaces-body tr[data-workspace="paging/page-100"]')).to_be_visible()
    expect(more).to_be_hidden()
    assert rows.count() == len(api.get("/v1/workspaces", params={"limit": 1000}).json()["workspaces"])
    tab.check()


def test_files_browse_download_and_upload(tab, api):
    payload = bytes(range(256)) * 40 + "ünïcode\n".encode()
    make_workspace(api, "files", {"/workspace/data.bin": payload, "/workspace/sub/inner.txt": b"inner\n"})
    tab.open()
    tab.sign_in()
    tab.workspace("files")
    page = tab.page
    expect(page.locator("#files-path")).to_have_value("/workspace")
    row = page.locator('#files-body tr[data-path="/workspace/data.bin"]')
    expect(row).to_be_visible()
    expect(row.locator("td").nth(1)).to_have_text("file")
    expect(page.locator('#files-body tr[data-path="/workspace/sub"] td').nth(1)).to_have_text("directory")
    tab.shot("listed")

    # into a directory and back up
    page.click('#files-body tr[data-path="/workspace/sub"] button.entry-dir')
    expect(page.locator('#files-body tr[data-path="/workspace/sub/inner.txt"]')).to_be_visible()
    expect(page.locator("#files-path")).to_have_value("/workspace/sub")
    tab.shot("subdirectory")
    page.click("#files-up")
    expect(row).to_be_visible()

    # download: fetched with the header, saved through a blob: URL
    with page.expect_download() as info:
        row.locator("button", has_text="Download").click()
    download = info.value
    assert download.suggested_filename == "data.bin"
    assert download.url.startswith("blob:")
    assert Path(download.path()).read_bytes() == payload

    # upload through the page's file input
    uploaded = b"uploaded from the browser\n" * 100
    chosen = {"name": "from-browser.txt", "mimeType": "text/plain", "buffer": uploaded}
    page.set_input_files("#files-upload", files=[chosen])
    new_row = page.locator('#files-body tr[data-path="/workspace/from-browser.txt"]')
    expect(new_row).to_be_visible()
    expect(page.locator("#notice-text")).to_contain_text("Uploaded /workspace/from-browser.txt")
    tab.shot("uploaded")
    assert api.get(ws_url(NS, "files", "files"), params={"path": "/workspace/from-browser.txt"}).content == uploaded
    tab.check()


def test_a_large_directory_pages_with_the_cursor(tab, api):
    make_workspace(api, "many")
    run_ok(api, NS, "many", "mkdir -p /workspace/many && cd /workspace/many && touch f{0000..1049}")
    tab.open("#/w/console/many/files")
    tab.sign_in()
    page = tab.page
    expect(page.locator('#files-body tr[data-path="/workspace/many"]')).to_be_visible()  # the cwd, listed first
    page.fill("#files-path", "/workspace/many")
    page.press("#files-path", "Enter")
    rows = page.locator("#files-body tr")
    expect(rows).to_have_count(1000)  # one page (the route's default limit)
    expect(page.locator("#files-more")).to_be_visible()
    page.click("#files-more")
    expect(rows).to_have_count(1050)
    expect(page.locator("#files-more")).to_be_hidden()
    tab.check()


def test_snapshots_take_label_and_roll_back(tab, api):
    make_workspace(api, "snaps", {"/workspace/state.txt": b"before\n"})
    tab.open("#/w/console/snaps/snapshots")
    tab.sign_in()
    page = tab.page
    expect(page.locator("#panel-snapshots")).to_be_visible()
    page.fill("#snapshot-label", "console-first")
    page.click("#snapshot-take")
    row = page.locator("#snapshots-body tr", has_text="console-first")
    expect(row).to_be_visible()
    tab.shot("taken")
    snapshots = api.get(ws_url(NS, "snaps", "snapshots")).json()["snapshots"]
    assert [s["label"] for s in snapshots] == ["console-first"]
    snap = snapshots[0]["id"]

    # label it anew
    row.locator("button", has_text="Label").click()
    page.locator(f'#snapshots-body tr[data-snapshot="{snap}"] input').fill("renamed in the console")
    tab.shot("labelling")
    page.locator(f'#snapshots-body tr[data-snapshot="{snap}"] button', has_text="Save").click()
    expect(page.locator(f'#snapshots-body tr[data-snapshot="{snap}"]')).to_contain_text("renamed in the console")
    assert api.get(ws_url(NS, "snaps", "snapshots")).json()["snapshots"][0]["label"] == "renamed in the console"

    # roll back to it (a second click confirms): the change made since is gone at the next start
    make_workspace(api, "snaps", {"/workspace/state.txt": b"after\n"})
    rollback = page.locator(f'#snapshots-body tr[data-snapshot="{snap}"] button', has_text="Roll back")
    rollback.click()
    expect(rollback).to_have_text("Click again to roll back")
    rollback.click()
    expect(page.locator("#notice-text")).to_contain_text(f"Rolled back to {snap}")
    expect(page.locator("#ws-state")).to_have_text("stopped")
    tab.shot("rolled-back")
    assert api.get(ws_url(NS, "snaps")).json()["state"] == "stopped"
    assert api.get(ws_url(NS, "snaps", "files"), params={"path": "/workspace/state.txt"}).content == b"before\n"
    # the safety snapshot of the rollback is listed too
    expect(page.locator("#snapshots-body tr", has_text="before restore")).to_be_visible()
    tab.check()


def test_processes_lists_a_background_process_and_signals_it(tab, api):
    make_workspace(api, "procs")
    run_ok(api, NS, "procs", "nohup sleep 4242 >/dev/null 2>&1 &")

    def sleepers():
        listed = api.get(ws_url(NS, "procs", "processes")).json()["processes"]
        return [p for p in listed if "sleep 4242" in p["command"]]

    wait_until(sleepers, 20, what="the background sleep to be listed")
    tab.open("#/w/console/procs/processes")
    tab.sign_in()
    page = tab.page
    row = page.locator("#processes-body tr", has_text="sleep 4242")
    expect(row).to_have_count(1)
    expect(page.locator("#commands-body tr", has_text="nohup sleep 4242")).to_be_visible()
    tab.shot("listed")
    row.locator("button", has_text="TERM").click()
    expect(page.locator("#notice-text")).to_contain_text("Sent SIGTERM")
    expect(row).to_have_count(0)  # the page lists again after a signal
    tab.shot("signalled")
    wait_until(lambda: not sleepers(), 10, what="the sleep to end")
    tab.check()


@needs_widget
def test_the_terminal_runs_what_is_typed(tab, api):
    make_workspace(api, "term")
    # the page's sockets, so the test can drop one (an init script: the page's CSP does not apply to it)
    tab.page.add_init_script(
        "window.__sockets = []; const Native = window.WebSocket;"
        " window.WebSocket = class extends Native { constructor(...a) { super(...a); window.__sockets.push(this); } };"
    )
    tab.open()
    tab.sign_in()
    tab.workspace("term", "terminal")
    page = tab.page
    expect(page.locator("#terminal .xterm")).to_be_visible()
    tab.shot("terminal")
    page.click("#terminal-connect")
    expect(page.locator("#terminal-status")).to_have_text(re.compile("^Connected"), timeout=90_000)
    page.locator("#terminal .xterm").click()
    page.keyboard.type("echo hello-$((6*7))")
    page.keyboard.press("Enter")
    wait_until(lambda: "hello-42" in page.evaluate("() => window.flareboxConsole.terminalText()"), 20, what="hello-42")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("hello-42")  # rendered, not only buffered
    tab.shot("hello-42")
    assert len(tab.sockets) == 1 and "/v1/workspaces/console/term/pty?cols=" in tab.sockets[0]
    assert "session=" not in tab.sockets[0]

    # a smaller window: the page fits the terminal and tells the server, and the shell's tty follows
    page.set_viewport_size({"width": 900, "height": 600})
    page.evaluate("() => window.dispatchEvent(new Event('resize'))")
    size = page.evaluate("() => window.flareboxConsole.terminalSize()")
    page.keyboard.type("stty size")
    page.keyboard.press("Enter")
    wanted = f"{size['rows']} {size['cols']}"
    wait_until(lambda: wanted in page.evaluate("() => window.flareboxConsole.terminalText()"), 20, what=wanted)

    # a dropped connection resumes the same session (&session=ID)
    page.evaluate("() => window.__sockets.at(-1).close()")
    expect(page.locator("#terminal-status")).to_have_text("Connected (session resumed).", timeout=30_000)
    assert len(tab.sockets) == 2 and "session=" in tab.sockets[1]
    page.keyboard.type("echo resumed-$((40+2))")
    page.keyboard.press("Enter")
    wait_until(lambda: "resumed-42" in page.evaluate("() => window.flareboxConsole.terminalText()"), 20, what="42")
    # the scrollback the server replays replaced the widget's text, so nothing shows twice
    assert page.evaluate("() => window.flareboxConsole.terminalText()").count("hello-42\n") == 1
    tab.shot("resumed")
    # the shell ends: the page says so
    page.keyboard.type("exit 3")
    page.keyboard.press("Enter")
    expect(page.locator("#terminal-status")).to_contain_text("exited with code 3", timeout=20_000)
    tab.check()


def test_without_the_widget_the_terminal_panel_says_how_to_get_it(tab, api):
    make_workspace(api, "nowidget", {"/workspace/ok.txt": b"ok"})

    def missing(route):
        route.fulfill(status=404, content_type="application/json", body='{"error":{"code":"not_found"}}')

    tab.page.route(re.compile(r"/console/vendor/"), missing)
    tab.open()
    tab.sign_in()
    tab.workspace("nowidget")
    expect(tab.page.locator('#files-body tr[data-path="/workspace/ok.txt"]')).to_be_visible()  # the rest works
    tab.page.click('.tabs button[data-tab="terminal"]')
    message = tab.page.locator("#terminal .terminal-message")
    expect(message).to_contain_text("not installed")
    expect(message).to_contain_text("scripts/setup.sh")
    expect(tab.page.locator("#terminal-connect")).to_be_disabled()
    tab.shot("no-widget")
    tab.errors.clear()  # the browser's refusals of the missing scripts are the point here
    tab.check()
