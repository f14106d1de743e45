// The Flarebox web console: a plain ES module, no framework, no build step. It is a client of the /v1 API like curl:
// every request carries the credential in an Authorization header, and the terminal's WebSocket (which cannot send
// headers) offers it as a subprotocol, `flarebox.bearer.<base64url>`, beside `flarebox`, which the server selects.
//
// The credential lives in this tab's sessionStorage only: never localStorage, never a cookie, never a URL. Files are
// downloaded with fetch() and saved through a blob: URL, so no credential ever appears in a link. Everything shown
// is built with textContent (no innerHTML), and the page has no inline script or style (its CSP forbids both).

const STORE_KEY = "flarebox.credential";
const PAGE_LIMIT = 100;
const encoder = new TextEncoder();

let credential = sessionStorage.getItem(STORE_KEY) || "";

// --- small helpers ----------------------------------------------------------------------------------------------

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function td(content, cls) {
  return el("td", { class: cls }, content ?? "—");
}

function fmtSize(n) {
  if (typeof n !== "number") return "—";
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = "B";
  for (const u of units) {
    if (value < 1024) break;
    value /= 1024;
    unit = u;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${unit}`;
}

function fmtTime(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return iso;
  const pad = (v) => String(v).padStart(2, "0");
  return (
    `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`
  );
}

function stateBadge(state, error) {
  const label = state ?? (error ? `error: ${error}` : "unknown");
  return el("span", { class: `state ${state ?? "error"}`, text: label });
}

function joinPath(dir, name) {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

function parentOf(path) {
  if (path === "/" || !path.includes("/")) return "/";
  const trimmed = path.replace(/\/+$/, "");
  const cut = trimmed.lastIndexOf("/");
  return cut <= 0 ? "/" : trimmed.slice(0, cut);
}

function base64url(text) {
  let binary = "";
  for (const byte of encoder.encode(text)) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function describeCredential(value) {
  const match = /^fbk_([0-9a-f]{16})_/.exec(value);
  return match ? `key ${match[1]}` : "deployment token";
}

// --- notices ----------------------------------------------------------------------------------------------------

let noticeTimer = null;

function notify(text, kind = "info") {
  $("notice-text").textContent = text;
  $("notice").className = `notice ${kind}`;
  $("notice").hidden = false;
  clearTimeout(noticeTimer);
  if (kind !== "error") noticeTimer = setTimeout(() => ($("notice").hidden = true), 8000);
}

function notifyError(err, what) {
  const text = err instanceof ApiError ? `${err.code}: ${err.message}` : String(err?.message ?? err);
  notify(what ? `${what} — ${text}` : text, "error");
}

$("notice-close").addEventListener("click", () => ($("notice").hidden = true));

// --- the API ----------------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function errorOf(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || "request failed";
  try {
    const body = await response.json();
    if (body?.error?.code) {
      code = body.error.code;
      message = body.error.message;
    }
  } catch {
    // not a JSON error (a proxy in front, say): keep the status line
  }
  return new ApiError(response.status, code, message);
}

// fetch() against this server with the credential. `raw`: return the Response (downloads), else its JSON.
async function api(path, { method = "GET", json, body, headers = {}, raw = false } = {}) {
  const sent = { Authorization: `Bearer ${credential}`, ...headers };
  let payload = body;
  if (json !== undefined) {
    sent["Content-Type"] = "application/json";
    payload = JSON.stringify(json);
  }
  const response = await fetch(path, { method, headers: sent, body: payload, cache: "no-store" });
  if (!response.ok) {
    const err = await errorOf(response);
    if (response.status === 401) signOut(`Signed out: ${err.message}`);
    throw err;
  }
  return raw ? response : response.json();
}

// --- views and routing ------------------------------------------------------------------------------------------
// The hash names what is shown (#/ the list, #/w/<namespace>/<workspace>/<tab>); it never holds a credential.

const VIEWS = ["view-signin", "view-workspaces", "view-workspace"];

function show(view) {
  for (const id of VIEWS) $(id).hidden = id !== view;
  $("who").hidden = view === "view-signin";
  $("who-label").textContent = credential ? `Signed in with the ${describeCredential(credential)}` : "";
}

function crumbs(...items) {
  const nav = $("crumbs");
  nav.replaceChildren();
  items.forEach((item, index) => {
    if (index) nav.append(el("span", { class: "sep", text: "/" }));
    nav.append(item.href ? el("a", { href: item.href, text: item.text }) : el("span", { text: item.text }));
  });
}

function route() {
  if (!credential) {
    closeWorkspace();
    showSignin();
    return;
  }
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "w" && parts.length >= 3) {
    openWorkspace(parts[1], parts[2], parts[3] || "files");
  } else {
    closeWorkspace();
    showWorkspaces();
  }
}

window.addEventListener("hashchange", route);

// --- sign in ----------------------------------------------------------------------------------------------------

function showSignin(message) {
  show("view-signin");
  crumbs();
  const error = $("signin-error");
  error.hidden = !message;
  error.textContent = message || "";
  $("credential").focus();
}

$("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = $("credential").value.trim();
  const error = $("signin-error");
  error.hidden = true;
  if (!value) return;
  $("signin-button").disabled = true;
  try {
    // GET /v1/health answers any valid credential: 401 means the token or key is wrong (or revoked, or expired)
    const response = await fetch("/v1/health", { headers: { Authorization: `Bearer ${value}` }, cache: "no-store" });
    if (!response.ok) {
      const err = await errorOf(response);
      error.textContent =
        response.status === 401
          ? `Sign-in failed: this token or key was not accepted (${err.code}). Check it and try again.`
          : `Sign-in failed: ${err.code}: ${err.message}`;
      error.hidden = false;
      return;
    }
    credential = value;
    sessionStorage.setItem(STORE_KEY, value);
    $("credential").value = "";
    route();
  } catch (err) {
    error.textContent = `Sign-in failed: the server did not answer (${err.message}).`;
    error.hidden = false;
  } finally {
    $("signin-button").disabled = false;
  }
});

function signOut(message) {
  credential = "";
  sessionStorage.removeItem(STORE_KEY);
  closeWorkspace();
  showSignin(message);
}

$("sign-out").addEventListener("click", () => {
  signOut();
  if (location.hash) location.hash = "";
});

// --- the workspace list -----------------------------------------------------------------------------------------

let workspacesNext = null;

function showWorkspaces() {
  show("view-workspaces");
  crumbs({ text: "Workspaces" });
  loadWorkspaces(null);
}

async function loadWorkspaces(after) {
  const body = $("workspaces-body");
  if (!after) body.replaceChildren();
  $("workspaces-more").hidden = true;
  try {
    let next = after;
    let shown = 0;
    // a page may hold no workspace while `next` is not null (forgotten ephemeral ones): follow it a little
    for (let pages = 0; pages < 10; pages++) {
      const query = new URLSearchParams({ limit: String(PAGE_LIMIT) });
      if (next) query.set("after", next);
      const data = await api(`/v1/workspaces?${query}`);
      for (const item of data.workspaces) body.append(workspaceRow(item));
      shown += data.workspaces.length;
      next = data.next;
      if (shown || !next) break;
    }
    workspacesNext = next;
  } catch (err) {
    notifyError(err, "Could not list the workspaces");
  }
  $("workspaces-more").hidden = !workspacesNext;
  $("workspaces-empty").hidden = body.children.length > 0;
}

function workspaceHref(ns, ws, tab = "files") {
  return `#/w/${encodeURIComponent(ns)}/${encodeURIComponent(ws)}/${tab}`;
}

function workspaceRow(item) {
  const href = workspaceHref(item.namespace, item.workspace);
  return el(
    "tr",
    { "data-workspace": `${item.namespace}/${item.workspace}` },
    td(item.namespace),
    td(el("a", { href, text: item.workspace })),
    td(stateBadge(item.state, item.error)),
    td(item.config?.image),
    td(fmtTime(item.last_activity_at)),
    td(item.last_snapshot ? fmtTime(item.last_snapshot.created_at) : "—"),
    el("td", { class: "actions" }, el("a", { href, text: "Open" })),
  );
}

$("workspaces-refresh").addEventListener("click", () => loadWorkspaces(null));
$("workspaces-more").addEventListener("click", () => loadWorkspaces(workspacesNext));

// --- one workspace ----------------------------------------------------------------------------------------------

let current = null; // {ns, ws, base, dir, cursor, tab}

function openWorkspace(ns, ws, tab) {
  if (!current || current.ns !== ns || current.ws !== ws) {
    closeWorkspace();
    current = { ns, ws, base: `/v1/workspaces/${encodeURIComponent(ns)}/${encodeURIComponent(ws)}`, dir: null };
    $("ws-title").textContent = `${ns} / ${ws}`;
    $("ws-state").replaceChildren();
    $("ws-detail").textContent = "";
    crumbs({ text: "Workspaces", href: "#/" }, { text: ns }, { text: ws });
    loadStatus().then((status) => {
      if (current && current.dir === null) {
        listDirectory(status?.config?.cwd || "/workspace");
      }
    });
  }
  show("view-workspace");
  selectTab(tab);
}

function closeWorkspace() {
  terminal.close();
  current = null;
}

async function loadStatus() {
  const scope = current;
  try {
    const status = await api(scope.base);
    if (scope !== current) return null;
    $("ws-state").replaceChildren(stateBadge(status.state));
    const config = status.config || {};
    $("ws-detail").textContent = [
      config.image && `image ${config.image}`,
      config.instance,
      config.persistent === false ? "ephemeral" : "persistent",
      status.busy ? "busy" : null,
    ]
      .filter(Boolean)
      .join(" · ");
    return status;
  } catch (err) {
    notifyError(err, "Could not read the workspace");
    return null;
  }
}

const TABS = ["files", "snapshots", "processes", "terminal"];

function selectTab(tab) {
  if (!TABS.includes(tab)) tab = "files";
  current.tab = tab;
  for (const button of document.querySelectorAll(".tabs button")) {
    button.setAttribute("aria-selected", String(button.dataset.tab === tab));
  }
  for (const name of TABS) $(`panel-${name}`).hidden = name !== tab;
  if (tab === "snapshots") loadSnapshots();
  if (tab === "processes") loadProcesses();
  if (tab === "terminal") terminal.shown();
}

for (const button of document.querySelectorAll(".tabs button")) {
  button.addEventListener("click", () => {
    if (current) location.hash = workspaceHref(current.ns, current.ws, button.dataset.tab);
  });
}

// --- files ------------------------------------------------------------------------------------------------------

// One listing at a time: a newer one (another directory, or the same anew) makes the pages of older ones stale.
async function listDirectory(dir, cursor = null) {
  const scope = current;
  const body = $("files-body");
  if (!cursor) {
    scope.listing = (scope.listing || 0) + 1;
    scope.dir = dir;
    scope.cursor = null;
    $("files-path").value = dir;
    body.replaceChildren();
    $("files-empty").hidden = true;
  }
  const listing = scope.listing;
  $("files-more").hidden = true;
  try {
    const query = new URLSearchParams({ path: dir, list: "1" });
    if (cursor) query.set("cursor", cursor);
    const data = await api(`${scope.base}/files?${query}`);
    if (scope !== current || scope.listing !== listing) return;
    for (const entry of data.entries) body.append(fileRow(entry));
    scope.cursor = data.cursor;
  } catch (err) {
    if (scope !== current || scope.listing !== listing) return;
    scope.cursor = null;
    notifyError(err, `Could not list ${dir}`);
  }
  $("files-more").hidden = !scope.cursor;
  $("files-empty").hidden = body.children.length > 0;
}

function fileRow(entry) {
  let name;
  if (entry.type === "directory") {
    name = el("button", {
      type: "button",
      class: "link entry-dir",
      text: entry.name,
      onclick: () => listDirectory(entry.path),
    });
  } else if (entry.type === "symlink" && entry.target) {
    name = el("span", {}, entry.name, el("span", { class: "muted", text: ` → ${entry.target}` }));
  } else {
    name = entry.name;
  }
  const actions = el("td", { class: "actions" });
  if (entry.type === "file") {
    actions.append(
      el("button", { type: "button", class: "ghost small", text: "Download", onclick: () => download(entry) }),
    );
  }
  return el(
    "tr",
    { "data-path": entry.path, "data-type": entry.type },
    td(name),
    td(entry.type),
    td(entry.type === "directory" ? "—" : fmtSize(entry.size), "num"),
    td(entry.mode, "mono"),
    td(fmtTime(entry.mtime)),
    actions,
  );
}

async function download(entry) {
  try {
    const response = await api(`${current.base}/files?${new URLSearchParams({ path: entry.path })}`, { raw: true });
    const blob = await response.blob();
    // a blob: URL, so the credential never sits in a link (the request above sent it in its header)
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: entry.name, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (err) {
    notifyError(err, `Could not download ${entry.path}`);
  }
}

$("files-upload").addEventListener("change", async (event) => {
  const input = event.target;
  const files = [...input.files];
  input.value = "";
  if (!current || !files.length) return;
  const scope = current;
  const dir = scope.dir || "/workspace";
  for (const file of files) {
    const path = joinPath(dir, file.name);
    try {
      // a File body: the browser sends its Content-Length (the route refuses a chunked upload)
      const answer = await api(`${scope.base}/files?${new URLSearchParams({ path })}`, {
        method: "PUT",
        body: file,
        headers: { "Content-Type": "application/octet-stream" },
      });
      notify(`Uploaded ${answer.path} (${fmtSize(answer.size)}).`);
    } catch (err) {
      notifyError(err, `Could not upload ${path}`);
    }
  }
  if (scope === current) listDirectory(dir);
});

$("files-go").addEventListener("submit", (event) => {
  event.preventDefault();
  const dir = $("files-path").value.trim() || "/";
  listDirectory(dir.startsWith("/") ? dir : `/${dir}`);
});
$("files-up").addEventListener("click", () => current && listDirectory(parentOf(current.dir || "/workspace")));
$("files-more").addEventListener("click", () => current && listDirectory(current.dir, current.cursor));

// --- snapshots --------------------------------------------------------------------------------------------------

async function loadSnapshots() {
  const scope = current;
  const body = $("snapshots-body");
  try {
    const data = await api(`${scope.base}/snapshots`);
    if (scope !== current) return;
    body.replaceChildren(...data.snapshots.map(snapshotRow));
  } catch (err) {
    if (scope !== current) return;
    body.replaceChildren();
    notifyError(err, "Could not list the snapshots");
  }
  $("snapshots-empty").hidden = body.children.length > 0;
}

function snapshotRow(snap) {
  const labelCell = td(snap.label ?? el("span", { class: "muted", text: "—" }));
  const row = el(
    "tr",
    { "data-snapshot": snap.id },
    td(fmtTime(snap.created_at)),
    labelCell,
    td(fmtSize(snap.size), "num"),
    td(snap.kept ? "pinned" : ""),
    td(snap.id, "mono"),
  );
  const rollback = el("button", { type: "button", class: "danger small", text: "Roll back" });
  let armed = null;
  rollback.addEventListener("click", async () => {
    if (!armed) {
      // a second click confirms: a rollback stops the workspace and makes this snapshot its next start
      rollback.textContent = "Click again to roll back";
      armed = setTimeout(() => {
        armed = null;
        rollback.textContent = "Roll back";
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    rollback.disabled = true;
    try {
      const answer = await api(`${current.base}/restore`, { method: "POST", json: { snapshot: snap.id } });
      const safety = answer.safety_snapshot ? ` Your files before it were saved as ${answer.safety_snapshot.id}.` : "";
      notify(`Rolled back to ${snap.id}: the workspace is ${answer.state}; its next start restores it.${safety}`);
      loadStatus();
      loadSnapshots();
    } catch (err) {
      notifyError(err, "Could not roll back");
      rollback.disabled = false;
      rollback.textContent = "Roll back";
    }
  });
  const labelButton = el("button", {
    type: "button",
    class: "ghost small",
    text: "Label…",
    onclick: () => editLabel(snap, labelCell),
  });
  row.append(el("td", { class: "actions" }, labelButton, rollback));
  return row;
}

function editLabel(snap, cell) {
  const input = el("input", { type: "text", maxlength: "100", value: snap.label ?? "", "aria-label": "New label" });
  const save = async (event) => {
    event.preventDefault();
    const label = input.value.trim();
    try {
      await api(`${current.base}/snapshots/${encodeURIComponent(snap.id)}`, {
        method: "PATCH",
        json: { label: label || null },
      });
      notify(label ? `Labelled ${snap.id} "${label}".` : `Removed the label of ${snap.id}.`);
    } catch (err) {
      notifyError(err, "Could not change the label");
    }
    loadSnapshots();
  };
  const form = el(
    "form",
    { class: "inline", onsubmit: save },
    input,
    el("button", { type: "submit", class: "small", text: "Save" }),
    el("button", { type: "button", class: "ghost small", text: "Cancel", onclick: () => loadSnapshots() }),
  );
  cell.replaceChildren(form);
  input.focus();
}

$("snapshot-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const label = $("snapshot-label").value.trim();
  const button = $("snapshot-take");
  button.disabled = true;
  try {
    const snap = await api(`${current.base}/snapshot`, { method: "POST", json: label ? { label } : {} });
    $("snapshot-label").value = "";
    notify(`Snapshot ${snap.id} taken (${fmtSize(snap.size)}).`);
    loadSnapshots();
    loadStatus();
  } catch (err) {
    notifyError(err, "Could not take a snapshot");
  } finally {
    button.disabled = false;
  }
});
$("snapshots-refresh").addEventListener("click", () => loadSnapshots());

// --- processes --------------------------------------------------------------------------------------------------

async function loadProcesses() {
  const scope = current;
  try {
    const data = await api(`${scope.base}/processes`);
    if (scope !== current) return;
    $("commands-body").replaceChildren(...(data.commands || []).map(commandRow));
    $("processes-body").replaceChildren(...(data.processes || []).map(processRow));
  } catch (err) {
    if (scope !== current) return;
    $("commands-body").replaceChildren();
    $("processes-body").replaceChildren();
    notifyError(err, "Could not list the processes");
  }
  $("commands-empty").hidden = $("commands-body").children.length > 0;
  $("processes-empty").hidden = $("processes-body").children.length > 0;
}

function commandRow(command) {
  return el(
    "tr",
    { "data-request": command.request_id },
    td(fmtTime(command.started_at)),
    td(command.command, "cmd"),
    td(command.state),
    td(command.pid, "num"),
    td(command.exit_code, "num"),
    td(command.request_id, "mono"),
  );
}

function processRow(proc) {
  const actions = el("td", { class: "actions" });
  for (const signal of ["TERM", "KILL"]) {
    actions.append(
      el("button", {
        type: "button",
        class: signal === "KILL" ? "danger small" : "ghost small",
        text: signal,
        title: `Send SIG${signal} to ${proc.pid}`,
        onclick: () => sendSignal(proc, signal),
      }),
    );
  }
  return el(
    "tr",
    { "data-pid": String(proc.pid) },
    td(proc.pid, "num"),
    td(proc.ppid, "num"),
    td(proc.user),
    td(proc.command, "cmd"),
    td(proc.state),
    td(fmtTime(proc.started_at)),
    actions,
  );
}

async function sendSignal(proc, signal) {
  try {
    await api(`${current.base}/processes/${proc.pid}/signal`, { method: "POST", json: { signal } });
    notify(`Sent SIG${signal} to process ${proc.pid}.`);
  } catch (err) {
    notifyError(err, `Could not signal process ${proc.pid}`);
  }
  setTimeout(() => current && loadProcesses(), 400);
}

$("processes-refresh").addEventListener("click", () => loadProcesses());

// --- the terminal -----------------------------------------------------------------------------------------------
// xterm.js (node_modules/@xterm, served at /console/vendor/) over the PTY WebSocket: binary frames are terminal bytes
// both ways, text frames JSON control messages. A dropped connection resumes its session with &session=ID.

const terminal = {
  term: null,
  fit: null,
  socket: null,
  session: null, // the session id the server gave, to resume after a drop
  retries: 0,
  ending: false, // the user (or the shell's exit) closes: no reconnect

  status(text) {
    $("terminal-status").textContent = text;
  },

  available() {
    return typeof window.Terminal === "function" && typeof window.FitAddon?.FitAddon === "function";
  },

  // The panel became visible: make the widget (or say how to get it) and fit it to the panel.
  shown() {
    if (!this.available()) {
      this.missing();
      return;
    }
    if (!this.term) this.create();
    this.refit();
    this.term.focus();
  },

  missing() {
    $("terminal-connect").disabled = true;
    this.status("The terminal is unavailable.");
    const box = $("terminal");
    if (box.querySelector(".terminal-message")) return;
    box.replaceChildren(
      el(
        "div",
        { class: "terminal-message" },
        "The terminal widget (xterm.js) is not installed on this server.\n\n",
        "On the server, run ",
        el("code", { text: "scripts/setup.sh" }),
        " in the Flarebox checkout (it installs the widget into node_modules/ with ",
        el("code", { text: "npm ci" }),
        "), then reload this page.",
      ),
    );
  },

  create() {
    this.term = new window.Terminal({
      cursorBlink: true,
      fontFamily: '"DejaVu Sans Mono", ui-monospace, Menlo, Consolas, monospace',
      fontSize: 13,
      scrollback: 5000,
      theme: { background: "#14161b", foreground: "#d0d4dc", cursor: "#ffc078" },
    });
    this.fit = new window.FitAddon.FitAddon();
    this.term.loadAddon(this.fit);
    this.term.open($("terminal"));
    this.term.onData((data) => this.sendBytes(encoder.encode(data)));
    this.term.onBinary((data) => this.sendBytes(Uint8Array.from(data, (c) => c.charCodeAt(0) & 255)));
    this.term.onResize(({ cols, rows }) => this.sendControl({ type: "resize", cols, rows }));
    window.addEventListener("resize", () => this.refit());
    this.term.writeln("\x1b[2mPress Connect to open a shell in this workspace.\x1b[0m");
  },

  refit() {
    if (this.fit && !$("panel-terminal").hidden) {
      try {
        this.fit.fit();
      } catch {
        // not laid out yet
      }
    }
  },

  sendBytes(bytes) {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(bytes);
  },

  sendControl(message) {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(message));
  },

  buttons(connected) {
    $("terminal-connect").hidden = connected;
    $("terminal-disconnect").hidden = !connected;
  },

  connect() {
    if (!current || !this.available()) return;
    if (!this.term) this.create();
    this.refit();
    if (this.socket) this.socket.close(1000);
    this.ending = false;
    const query = new URLSearchParams({ cols: String(this.term.cols), rows: String(this.term.rows) });
    if (this.session) query.set("session", this.session);
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}${current.base}/pty?${query}`;
    // the credential rides in a subprotocol (a browser WebSocket cannot send an Authorization header); the server
    // selects "flarebox" and never echoes the bearer one
    const socket = new WebSocket(url, ["flarebox", `flarebox.bearer.${base64url(credential)}`]);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    let opened = false;
    this.buttons(true);
    this.status(this.session ? "Reconnecting…" : "Connecting…");
    socket.addEventListener("open", () => {
      opened = true;
    });
    socket.addEventListener("message", (event) => {
      if (socket !== this.socket) return;
      if (typeof event.data === "string") {
        let message;
        try {
          message = JSON.parse(event.data);
        } catch {
          return;
        }
        this.control(message);
      } else {
        this.term.write(new Uint8Array(event.data));
      }
    });
    socket.addEventListener("close", (event) => {
      if (socket !== this.socket) return;
      this.socket = null;
      this.buttons(false);
      if (this.ending) return;
      if (!opened) {
        this.status(
          "Could not open the terminal: the server refused the connection " +
            "(the credential needs the exec scope) or did not answer.",
        );
        loadStatus();
        return;
      }
      if (this.session && this.retries < 3) {
        this.retries += 1;
        this.status(`Connection lost (${event.code}); reconnecting to the session…`);
        setTimeout(() => this.connect(), 1000 * this.retries);
        return;
      }
      this.status(`Disconnected (${event.code}${event.reason ? `: ${event.reason}` : ""}).`);
    });
  },

  control(message) {
    switch (message.type) {
      case "status":
        this.status(`Workspace ${message.phase}${message.message ? `: ${message.message}` : ""}…`);
        break;
      case "started":
        this.status("Starting a shell…");
        break;
      case "session":
        this.session = message.session;
        this.retries = 0;
        // a resumed session's scrollback follows this message: it replaces what the widget shows, not repeats it
        if (message.resumed) this.term.reset();
        this.status(`Connected${message.resumed ? " (session resumed)" : ""}.`);
        if (message.cols !== this.term.cols || message.rows !== this.term.rows) {
          this.sendControl({ type: "resize", cols: this.term.cols, rows: this.term.rows });
        }
        this.term.focus();
        loadStatus();
        break;
      case "exit":
        this.ending = true;
        this.session = null;
        this.status(`The shell exited with code ${message.exit_code}. Connect opens a new one.`);
        break;
      case "error":
        this.ending = true;
        if (message.code === "session_not_found") this.session = null;
        this.status(`Refused: ${message.code}: ${message.message}`);
        break;
      case "detached":
        this.ending = true;
        this.status("Another client took over this session. Connect takes it back.");
        break;
      default:
        break; // a control message of a later version: ignored
    }
  },

  disconnect() {
    this.ending = true;
    if (this.socket) this.socket.close(1000);
    this.status("Disconnected. Connect resumes the session.");
  },

  // Leaving the workspace: close the socket, forget the widget and its session.
  close() {
    this.ending = true;
    if (this.socket) this.socket.close(1000);
    this.socket = null;
    this.session = null;
    this.retries = 0;
    if (this.term) this.term.dispose();
    this.term = null;
    this.fit = null;
    $("terminal").replaceChildren();
    this.buttons(false);
    $("terminal-connect").disabled = false;
    this.status("Not connected.");
  },
};

$("terminal-connect").addEventListener("click", () => terminal.connect());
$("terminal-disconnect").addEventListener("click", () => terminal.disconnect());

// for tests and the curious: the terminal's text (xterm's buffer) and size; nothing here reaches the credential
window.flareboxConsole = {
  terminalSize() {
    return terminal.term ? { cols: terminal.term.cols, rows: terminal.term.rows } : null;
  },
  terminalText() {
    const buffer = terminal.term?.buffer.active;
    if (!buffer) return "";
    const lines = [];
    for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i)?.translateToString(true) ?? "");
    return lines.join("\n");
  },
};

route();
