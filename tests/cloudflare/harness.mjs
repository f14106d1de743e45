// A small stand-in for the Workers runtime, so the real src/entry.py runs offline: Python Workers cannot start in
// workerd/wrangler dev without Cloudflare's Pyodide bundle, which no registry ships.
//
// What is real: Pyodide (the npm release matching wrangler.jsonc's compatibility_date), the vendored
// workers-runtime-sdk, src/entry.py and everything it imports, and the supervisor (python -m flarebox_supervisor)
// running in a bubblewrap sandbox. What is faked, keeping the binding shapes the SDK checks: env (vars and the
// WORKSPACE and DIRECTORY Durable Object namespaces), ctx.storage (SQL on node:sqlite, alarms on timers) and, for
// Workspace objects only, ctx.container (start/monitor/destroy/getTcpPort/snapshotContainer/setInactivityTimeout
// over that sandbox).
//
// Configuration (environment):
//   HARNESS_ROOT    the repository (src/, python_modules/)       HARNESS_STATE  a scratch directory
//   HARNESS_VARS    JSON: the Worker's vars and secrets          HARNESS_PORT   listen port (0: any)
//   HARNESS_PYTHON  interpreter for the supervisor (has flarebox_supervisor and aiohttp)
//   HARNESS_BINDS   JSON list of host paths the sandbox must see (the checkout, the interpreter's prefixes)
// Prints "HARNESS READY <port>" once serving. Test-only routes live under /__harness/ (see `admin` below).

import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { Readable } from "node:stream";
import { DatabaseSync } from "node:sqlite";
import { loadPyodide } from "pyodide";

const ROOT = path.resolve(process.env.HARNESS_ROOT);
const STATE = path.resolve(process.env.HARNESS_STATE);
const VARS = JSON.parse(process.env.HARNESS_VARS || "{}");
const PYTHON = process.env.HARNESS_PYTHON || "python3";
const PORT = Number(process.env.HARNESS_PORT || 0);
const BINDS = JSON.parse(process.env.HARNESS_BINDS || "[]"); // host paths the sandbox needs (may be under /tmp)
const SUPERVISOR_PORT = 8080;
const IMAGES = { hermes: "registry.cloudflare.com/harness/hermes@sha256:" + "0".repeat(64) };
const INSTANCE_TYPES = new Set(["lite", "standard-1", "standard-2", "standard-3", "standard-4"]);

// Time travel for alarms: POST /__harness/advance moves the clock the Python code reads (Date.now) forward.
const realNow = Date.now;
let clockOffsetMs = 0;
Date.now = () => realNow() + clockOffsetMs;

// Knobs tests turn through POST /__harness/knobs. directoryFault breaks the DIRECTORY objects: "fetch" makes their
// stubs' fetch reject (the object unreachable, as when the runtime resets it), "storage" makes their SQL throw (the
// Python code fails inside the object). canned answers for an object instead of it, keyed "<BINDING>:<name>":
// { status, contentType, body, repeat, suffix } (body repeated `repeat` times, then suffix), to try the stubs on
// answers the real objects never give.
const knobs = { startDelayMs: 0, failSnapshot: false, directoryFault: null, canned: {} };
// Every binding call, in order, for tests to assert on.
const calls = [];
const record = (api, object, detail = {}) => calls.push({ api, object, at: Date.now(), ...detail });

process.on("unhandledRejection", (err) => console.error("harness: unhandled rejection:", err));

// ---------------------------------------------------------------------------------------------------------------
// Storage: ctx.storage (class names matter: the SDK wraps only a "DurableObjectStorage").

class SqlStorageCursor {
  constructor(rows) {
    this.rows = rows;
  }
  toArray() {
    return this.rows;
  }
  one() {
    if (this.rows.length !== 1) throw new Error(`Expected exactly one result from SQL query, got ${this.rows.length}`);
    return this.rows[0];
  }
  [Symbol.iterator]() {
    return this.rows[Symbol.iterator]();
  }
}

function sqlValue(v) {
  // The runtime's bindings are string | number | ArrayBuffer(view) | null; a boolean or object is a bug to surface.
  if (v === null || typeof v === "string" || typeof v === "number" || typeof v === "bigint") return v;
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  throw new TypeError(`SQL binding of unsupported type ${typeof v}`);
}

class SqlStorage {
  constructor(object) {
    this.object = object;
    this.db = object.db;
  }
  exec(query, ...bindings) {
    if (knobs.directoryFault === "storage" && this.object.kind === CLASSES.DIRECTORY) {
      throw new Error("SQLITE_IOERR: disk I/O error (harness knob directoryFault)");
    }
    const trimmed = query.trim().replace(/;\s*$/, "");
    if (bindings.length === 0 && trimmed.includes(";")) {
      this.db.exec(query); // several statements, as the runtime allows without bindings
      return new SqlStorageCursor([]);
    }
    const stmt = this.db.prepare(query);
    const args = bindings.map(sqlValue);
    if (stmt.columns().length === 0) {
      stmt.run(...args);
      return new SqlStorageCursor([]);
    }
    const rows = stmt.all(...args).map((row) => {
      const plain = {};
      for (const [k, v] of Object.entries(row)) plain[k] = v instanceof Uint8Array ? v.slice().buffer : v;
      return plain;
    });
    return new SqlStorageCursor(rows);
  }
}

class DurableObjectStorage {
  constructor(object) {
    this.object = object;
    this.sql = new SqlStorage(object);
  }
  async setAlarm(ms) {
    // as the runtime: only a class with an alarm() handler may set an alarm
    if (!this.object.kind.alarms) throw new Error(`${this.object.kind.className} has no alarm() handler`);
    record("storage.setAlarm", this.object.name, { at: Number(ms) });
    this.object.armAlarm(Number(ms));
  }
  async getAlarm() {
    return this.object.alarmAt;
  }
  async deleteAlarm() {
    record("storage.deleteAlarm", this.object.name);
    this.object.armAlarm(null);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Container: ctx.container over a bubblewrap sandbox running the real supervisor on a unix socket.

function run(cmd, args) {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    p.stderr.on("data", (d) => (err += d));
    p.on("error", reject);
    p.on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} exited ${code}: ${err}`))));
  });
}

// The host's top-level directories, read-only, on a tmpfs root (so /workspace and /run/flarebox can be added).
function hostRoot() {
  const argv = ["--tmpfs", "/"];
  for (const entry of fs.readdirSync("/", { withFileTypes: true })) {
    const p = "/" + entry.name;
    if (["proc", "dev", "tmp", "sys", "run", "workspace"].includes(entry.name)) continue;
    if (entry.isSymbolicLink()) argv.push("--symlink", fs.readlinkSync(p), p);
    else if (entry.isDirectory()) argv.push("--ro-bind", p, p);
  }
  return argv;
}

class Container {
  constructor(object) {
    this.object = object;
    this.images = IMAGES;
    this.proc = null; // the bwrap process once spawned
    this.state = "stopped"; // stopped | starting | running
    this.dir = null; // this run's filesystem (gone with the container, as on Cloudflare)
    this.exit = null; // { promise, resolve, reject } for monitor()
    this.inflight = 0;
    this.lastActivity = Date.now();
    this.inactivityMs = null;
    this.inactivityTimer = null;
  }

  get running() {
    return this.state !== "stopped";
  }

  start(options) {
    const o = options ?? {};
    const known = ["image", "containerSnapshot", "instance", "env", "entrypoint", "enableInternet", "labels",
      "hardTimeout", "directorySnapshots"];
    for (const k of Object.keys(o)) if (!known.includes(k)) throw new TypeError(`start(): unknown option ${k}`);
    if (this.running) throw new Error("start() cannot be called on a container that is already running.");
    if (typeof o.enableInternet !== "boolean") throw new TypeError("start(): enableInternet is required");
    if ((o.image === undefined) === (o.containerSnapshot === undefined)) {
      throw new TypeError("start(): pass exactly one of image and containerSnapshot");
    }
    if (o.image !== undefined && !Object.values(IMAGES).includes(o.image)) {
      throw new TypeError(`start(): unknown image ${o.image}`);
    }
    if (o.instance !== undefined && !INSTANCE_TYPES.has(o.instance)) {
      throw new TypeError(`start(): unknown instance type ${o.instance}`);
    }
    for (const [k, v] of Object.entries(o.env ?? {})) {
      if (typeof v !== "string") throw new TypeError(`start(): env ${k} must be a string`);
    }
    let archive = null;
    if (o.containerSnapshot !== undefined) {
      archive = path.join(STATE, "snapshots", `${o.containerSnapshot.id}.tar`);
      if (!fs.existsSync(archive)) throw new Error(`start(): unknown container snapshot ${o.containerSnapshot.id}`);
    }
    record("container.start", this.object.name, {
      image: o.image ?? null,
      containerSnapshot: o.containerSnapshot?.id ?? null,
      instance: o.instance ?? null,
      enableInternet: o.enableInternet,
      envKeys: Object.keys(o.env ?? {}).sort(),
      envValues: Object.values(o.env ?? {}),
    });
    this.state = "starting";
    this.dir = fs.mkdtempSync(path.join(STATE, "c-"));
    fs.mkdirSync(path.join(this.dir, "run"));
    fs.mkdirSync(path.join(this.dir, "workspace"));
    let resolve, reject;
    const promise = new Promise((res, rej) => ((resolve = res), (reject = rej)));
    promise.catch(() => {});
    this.exit = { promise, resolve, reject };
    this.boot(archive, o).catch((err) => this.stopped(err));
  }

  async boot(archive, o) {
    const dir = this.dir;
    if (knobs.startDelayMs) await new Promise((r) => setTimeout(r, knobs.startDelayMs)); // a slow cold start
    if (archive) await run("tar", ["-xf", archive, "-C", dir]);
    if (this.dir !== dir) return; // destroyed while booting
    const argv = [
      "--die-with-parent", "--unshare-user", "--uid", "1000", "--gid", "1000",
      "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "container",
      ...(o.enableInternet ? [] : ["--unshare-net"]),
      ...hostRoot(), "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
      ...BINDS.flatMap((p) => ["--ro-bind", p, p]), // the supervisor's code and interpreter, wherever they live
      "--bind", path.join(dir, "workspace"), "/workspace", "--bind", path.join(dir, "run"), "/run/flarebox",
      "--chdir", "/workspace", "--clearenv",
      "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "--setenv", "HOME", "/workspace",
    ];
    for (const [k, v] of Object.entries(o.env ?? {})) argv.push("--setenv", k, v);
    argv.push(PYTHON, "-m", "flarebox_supervisor", "--unix", "/run/flarebox/s.sock", "--workdir", "/workspace");
    // bwrap itself stays as the sandbox's PID 1: give it no environment of ours (HARNESS_VARS holds the token).
    const proc = spawn("bwrap", argv, { stdio: ["ignore", "inherit", "inherit"], env: { PATH: process.env.PATH } });
    this.proc = proc;
    this.state = "running";
    proc.on("exit", (code, signal) => {
      if (this.proc !== proc) return;
      this.stopped(code === 0 ? null : new Error(`Container exited with ${signal ?? `code ${code}`}`));
    });
  }

  stopped(err) {
    if (this.state === "stopped") return;
    const { resolve, reject } = this.exit;
    this.state = "stopped";
    this.proc = null;
    if (this.dir) fs.rmSync(this.dir, { recursive: true, force: true });
    this.dir = null;
    clearInterval(this.inactivityTimer);
    this.inactivityTimer = null;
    record("container.exited", this.object.name, { error: err ? String(err.message) : null });
    if (err) reject(err);
    else resolve();
  }

  monitor() {
    record("container.monitor", this.object.name);
    if (!this.running) return Promise.reject(new Error("monitor(): the container is not running"));
    return this.exit.promise;
  }

  async destroy(reason) {
    record("container.destroy", this.object.name, { reason: reason ?? null });
    if (!this.running) return;
    const proc = this.proc;
    this.proc = null; // its exit is this destroy, not a crash
    if (proc) {
      const gone = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGKILL");
      await gone;
    }
    this.stopped(new Error("Container destroyed"));
  }

  // A crash: the sandbox dies without anyone asking (test knob).
  crash() {
    record("harness.crash", this.object.name);
    if (this.proc) this.proc.kill("SIGKILL");
  }

  signal(signo) {
    record("container.signal", this.object.name, { signo });
    if (this.proc) this.proc.kill(signo);
  }

  async setInactivityTimeout(ms) {
    record("container.setInactivityTimeout", this.object.name, { ms: Number(ms) });
    this.inactivityMs = Number(ms);
    clearInterval(this.inactivityTimer);
    this.inactivityTimer = setInterval(() => {
      if (this.running && this.inflight === 0 && Date.now() - this.lastActivity > this.inactivityMs) {
        record("harness.inactivityStop", this.object.name);
        this.destroy("inactivity").catch(() => {});
      }
    }, 500);
    this.inactivityTimer.unref();
  }

  async snapshotContainer(options) {
    const name = options?.name ?? null;
    record("container.snapshotContainer", this.object.name, { name });
    if (this.state !== "running" || !this.dir) throw new Error("snapshotContainer(): the container is not running");
    if (knobs.failSnapshot) throw new Error("snapshotContainer(): snapshot service unavailable");
    const id = "snap-" + randomBytes(8).toString("hex");
    const dir = path.join(STATE, "snapshots");
    fs.mkdirSync(dir, { recursive: true });
    const tmp = path.join(dir, `${id}.tmp`);
    await run("tar", ["-cf", tmp, "-C", this.dir, "workspace"]);
    fs.renameSync(tmp, path.join(dir, `${id}.tar`));
    return { id, size: fs.statSync(path.join(dir, `${id}.tar`)).size, name };
  }

  getTcpPort(port) {
    return { fetch: (input, init) => this.portFetch(port, input, init) };
  }

  async portFetch(port, input, init) {
    const request = new Request(input, init);
    const url = new URL(request.url);
    record("container.getTcpPort.fetch", this.object.name, { port, method: request.method, path: url.pathname });
    const socket = this.dir && path.join(this.dir, "run", "s.sock");
    if (port !== SUPERVISOR_PORT || this.state !== "running" || !fs.existsSync(socket)) {
      throw new Error(`The container is not listening in the TCP address 10.0.0.1:${port}`);
    }
    this.inflight++;
    this.lastActivity = Date.now();
    const done = () => {
      this.inflight--;
      this.lastActivity = Date.now();
    };
    return await new Promise((resolve, reject) => {
      const headers = Object.fromEntries(request.headers);
      const req = http.request({ socketPath: socket, method: request.method, path: url.pathname + url.search, headers });
      req.on("error", (err) => {
        done();
        reject(new Error(`Network connection lost: ${err.message}`));
      });
      req.on("response", (res) => {
        const out = new Headers();
        for (let i = 0; i < res.rawHeaders.length; i += 2) out.append(res.rawHeaders[i], res.rawHeaders[i + 1]);
        res.on("close", done);
        const body = [204, 304].includes(res.statusCode) || request.method === "HEAD" ? null : Readable.toWeb(res);
        resolve(new Response(body, { status: res.statusCode, headers: out }));
      });
      request.signal?.addEventListener("abort", () => req.destroy(new Error("aborted")));
      if (request.body) Readable.fromWeb(request.body).pipe(req);
      else req.end();
    });
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Durable Objects: one Python instance per name, its storage, container and alarm.

class DurableObjectId {
  constructor(name) {
    this.name = name;
  }
  toString() {
    return createHash("sha256").update(this.name).digest("hex");
  }
}

// The Durable Object classes of wrangler.jsonc, by binding. Only a class with a "containers" entry has
// ctx.container on the platform; only a class with an alarm() handler may set alarms.
const CLASSES = {
  WORKSPACE: { binding: "WORKSPACE", className: "Workspace", container: true, alarms: true },
  DIRECTORY: { binding: "DIRECTORY", className: "Directory", container: false, alarms: false },
};

class DurableObject {
  constructor(kind, name) {
    this.kind = kind;
    this.name = name;
    const dir = path.join(STATE, "do", kind.binding.toLowerCase()); // one directory per class: no file collides
    fs.mkdirSync(dir, { recursive: true });
    this.db = new DatabaseSync(path.join(dir, new DurableObjectId(name).toString() + ".sqlite"));
    this.storage = new DurableObjectStorage(this);
    this.container = kind.container ? new Container(this) : null;
    this.alarmAt = null;
    this.alarmTimer = null;
    this.instance = null;
  }

  // The Python object, constructed on first use and again after an eviction (test knob), as the runtime does.
  get py() {
    if (!this.instance) {
      record("object.construct", this.name);
      const ctx = {
        id: new DurableObjectId(this.name),
        storage: this.storage,
        ...(this.container ? { container: this.container } : {}), // absent, not null, as on the platform
        waitUntil: (p) => {
          record("ctx.waitUntil", this.name);
          Promise.resolve(p).then(() => record("ctx.waitUntil.settled", this.name), () => {});
        },
        blockConcurrencyWhile: async (fn) => await fn(),
      };
      this.instance = python.entry[this.kind.className](ctx, env);
    }
    return this.instance;
  }

  armAlarm(at) {
    clearTimeout(this.alarmTimer);
    this.alarmTimer = null;
    this.alarmAt = at;
    if (at !== null) this.alarmTimer = setTimeout(() => this.fireAlarm(), Math.max(0, at - Date.now()));
  }

  // Deliver the alarm (retried like the runtime does when the handler throws).
  async fireAlarm(retryCount = 0) {
    clearTimeout(this.alarmTimer);
    this.alarmTimer = null;
    this.alarmAt = null;
    record("alarm", this.name, { retryCount });
    try {
      await this.py.alarm({ retryCount, isRetry: retryCount > 0 });
    } catch (err) {
      console.error(`harness: alarm of ${this.name} failed:`, err);
      if (retryCount < 2 && this.alarmAt === null) this.armAlarm(Date.now() + 1000 * 2 ** retryCount);
      return false;
    }
    return true;
  }

  async fetch(request) {
    record("object.fetch", this.name, { binding: this.kind.binding, path: new URL(request.url).pathname });
    const response = await this.py.fetch(python.Request(request));
    return response.js_object;
  }
}

class DurableObjectNamespace {
  constructor(kind) {
    this.kind = kind;
    this.objects = new Map();
  }
  object(name) {
    if (!this.objects.has(name)) this.objects.set(name, new DurableObject(this.kind, name));
    return this.objects.get(name);
  }
  idFromName(name) {
    return new DurableObjectId(name);
  }
  get(id) {
    return this.getByName(id.name);
  }
  getByName(name) {
    record("namespace.getByName", name);
    const object = this.object(name);
    return {
      fetch: async (input, init) => {
        if (knobs.directoryFault === "fetch" && this.kind === CLASSES.DIRECTORY) {
          record("harness.directoryFault", name);
          throw new Error("Durable Object reset because its code was updated. (harness knob directoryFault)");
        }
        const canned = knobs.canned?.[`${this.kind.binding}:${name}`];
        if (canned) {
          record("harness.canned", name, { status: canned.status });
          const body = canned.body.repeat(canned.repeat ?? 1) + (canned.suffix ?? "");
          return new Response(body, { status: canned.status, headers: { "content-type": canned.contentType } });
        }
        return object.fetch(new Request(input, init?.body ? { ...init, duplex: "half" } : init));
      },
    };
  }
}

const namespace = new DurableObjectNamespace(CLASSES.WORKSPACE);
const directories = new DurableObjectNamespace(CLASSES.DIRECTORY);
const env = { ...VARS, WORKSPACE: namespace, DIRECTORY: directories };

// ---------------------------------------------------------------------------------------------------------------
// Python: Pyodide with src/ and the vendored SDK mounted, plus the two modules workerd injects.

const py = await loadPyodide();
for (const [dir, mount] of [[path.join(ROOT, "src"), "/flarebox/src"], [path.join(ROOT, "python_modules"), "/flarebox/python_modules"]]) {
  py.FS.mkdirTree(mount);
  py.FS.mount(py.FS.filesystems.NODEFS, { root: dir }, mount);
}
py.registerJsModule("_cloudflare_compat_flags", {
  python_workflows_implicit_dependencies: false,
  python_request_headers_preserve_commas: true,
});
py.registerJsModule("_pyodide_entrypoint_helper", {
  cloudflareWorkersModule: { env },
  cloudflareSocketsModule: {},
  doAnImport: async (name) => {
    throw new Error(`harness: no module ${name}`);
  },
  patchWaitUntil() {},
  *patch_env_helper() {
    yield;
  },
});
py.runPython(`
import sys, logging
sys.path[:0] = ["/flarebox/src", "/flarebox/python_modules"]
logging.basicConfig(level=logging.INFO, format="py %(name)s %(levelname)s %(message)s")
`);
const python = { entry: py.pyimport("entry"), Request: py.pyimport("workers").Request };

// ---------------------------------------------------------------------------------------------------------------
// HTTP: the Worker's fetch for everything, except the harness's own test routes.

async function admin(url, req) {
  const name = url.searchParams.get("object");
  // ?binding=DIRECTORY addresses a directory object (evict); the default is a workspace object
  const objects = url.searchParams.get("binding") === "DIRECTORY" ? directories : namespace;
  const json = (obj, status = 200) => new Response(JSON.stringify(obj), { status, headers: { "content-type": "application/json" } });
  if (url.pathname === "/__harness/calls") return json(calls);
  if (url.pathname === "/__harness/knobs") {
    Object.assign(knobs, JSON.parse(await new Response(Readable.toWeb(req)).text() || "{}"));
    return json(knobs);
  }
  if (url.pathname === "/__harness/advance") {
    // Move time forward and deliver every alarm that is now due, answering once their handlers finished.
    clockOffsetMs += Number(url.searchParams.get("ms"));
    const pending = [...namespace.objects.values()].filter((o) => o.alarmAt !== null);
    const due = pending.filter((o) => o.alarmAt <= Date.now());
    for (const o of pending) if (!due.includes(o)) o.armAlarm(o.alarmAt); // their timers, on the new clock
    const results = await Promise.all(due.map(async (o) => [o.name, await o.fireAlarm()]));
    return json({ fired: Object.fromEntries(results) });
  }
  const object = name && objects.objects.get(name);
  if (!object) return json({ error: "unknown object" }, 404);
  if (url.pathname === "/__harness/evict") {
    record("harness.evict", name);
    object.instance = null;
    return json({ evicted: true });
  }
  if (!object.container) return json({ error: "the object has no container" }, 400);
  if (url.pathname === "/__harness/crash") {
    object.container.crash();
    return json({ crashed: true });
  }
  if (url.pathname === "/__harness/orphan") {
    // A container the object does not know about (left running by a boot an eviction interrupted).
    object.container.start({ image: IMAGES.hermes, enableInternet: true });
    return json({ started: true });
  }
  if (url.pathname === "/__harness/container") {
    return json({ running: object.container.running, state: object.container.state, alarmAt: object.alarmAt });
  }
  return json({ error: "unknown harness route" }, 404);
}

async function worker(request) {
  const entry = python.entry.Default({ waitUntil: (p) => Promise.resolve(p).catch(() => {}), passThroughOnException() {} }, env);
  const response = await entry.fetch(python.Request(request));
  return response.js_object;
}

const server = http.createServer(async (req, res) => {
  let response;
  const url = new URL(req.url, "http://127.0.0.1");
  try {
    if (url.pathname.startsWith("/__harness/")) {
      response = await admin(url, req);
    } else {
      const headers = new Headers();
      for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
      const hasBody = !["GET", "HEAD"].includes(req.method);
      const request = new Request(`http://${req.headers.host ?? "127.0.0.1"}${req.url}`, {
        method: req.method,
        headers,
        body: hasBody ? Readable.toWeb(req) : undefined,
        duplex: hasBody ? "half" : undefined,
      });
      response = await worker(request);
    }
  } catch (err) {
    console.error("harness: the Worker threw:", err);
    response = new Response("internal error", { status: 500 });
  }
  const headers = [];
  for (const [k, v] of response.headers) headers.push(k, v);
  res.writeHead(response.status, headers);
  if (!response.body) return res.end();
  const reader = response.body.getReader();
  res.on("close", () => reader.cancel().catch(() => {}));
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      res.write(value);
    }
    res.end();
  } catch (err) {
    res.destroy(err);
  }
});

async function shutdown() {
  server.close();
  await Promise.all([...namespace.objects.values()].map((o) => o.container.destroy("shutdown").catch(() => {})));
  process.exit(0);
}
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);

server.listen(PORT, "127.0.0.1", () => {
  console.log(`HARNESS READY ${server.address().port}`);
});
