// A small stand-in for the Workers runtime, so the real src/entry.py runs offline: Python Workers cannot start in
// workerd/wrangler dev without Cloudflare's Pyodide bundle, which no registry ships.
//
// What is real: Pyodide (the npm release matching wrangler.jsonc's compatibility_date), the vendored
// workers-runtime-sdk, src/entry.py and everything it imports, and the supervisor (python -m flarebox_supervisor)
// running in a bubblewrap sandbox. What is faked, keeping the binding shapes the SDK checks: env (vars and the
// WORKSPACE and DIRECTORY Durable Object namespaces, the BACKUPS R2 bucket: see "R2" below), ctx.storage (SQL on
// node:sqlite, alarms on timers) and, for
// Workspace objects only, ctx.container (start/monitor/destroy/getTcpPort/snapshotContainer/setInactivityTimeout
// over that sandbox). getTcpPort(port).fetch reaches the supervisor (8080, on its unix socket) and any other port a
// process of that container listens on — found in /proc: a listening socket held by a process of the sandbox's
// tree, which shares the host's network when enableInternet is true (a service on 127.0.0.1:<port> is on the host's
// loopback, so tests pick free ports). Any other port rejects, as workerd does; with enableInternet false the
// harness cannot reach a service's port at all and says so. WebSockets as workerd has them (see "WebSockets"
// below): a global WebSocketPair, a Response that carries status 101 with a webSocket, clients' upgrade requests
// answered by the Worker, upgrades through a Durable Object stub, and getTcpPort(port).fetch with
// `Upgrade: websocket` to the supervisor (the `ws` package on its unix socket). Container snapshots expire as on Cloudflare: 30 days after
// they were made or last restored, a restore fails — after start() returned, the container never comes up.
//
// The platform's rules it keeps, as strict as Cloudflare where the rule is known (issue 16; the constants below,
// GET /__harness/platform): start() returns at once and a bad start shows later through `running`/monitor(); its
// options are ContainerStartupOptions; the port fetch frames a body as workerd does (content-length only for a
// known length, else chunked) and FixedLengthStream exists; an object's storage refuses an instance that is gone; a
// pending monitor() keeps an idle object for 15 minutes at most, then time passing (POST /__harness/advance) evicts
// it; alarms are delivered at least once and a throwing handler is retried 6 times from 2 s; a deploy cuts the
// object requests in flight 30 s later; a request body over the plan's 100 MB gets 413 before the Worker runs; a
// client that does not read holds the response back. Knobs (POST /__harness/knobs) and routes (freeze, thaw,
// deploy, crash, evict, orphan) let tests break things the way the platform can.
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
import { WebSocket as NodeWebSocket, WebSocketServer } from "ws";
import { bootPython } from "./pyodide_boot.mjs";

const ROOT = path.resolve(process.env.HARNESS_ROOT);
const STATE = path.resolve(process.env.HARNESS_STATE);
const VARS = JSON.parse(process.env.HARNESS_VARS || "{}");
const PYTHON = process.env.HARNESS_PYTHON || "python3";
const PORT = Number(process.env.HARNESS_PORT || 0);
const BINDS = JSON.parse(process.env.HARNESS_BINDS || "[]"); // host paths the sandbox needs (may be under /tmp)
const SUPERVISOR_PORT = 8080;
const IMAGES = { hermes: "registry.cloudflare.com/harness/hermes@sha256:" + "0".repeat(64) };
// ContainerStartupOptions of @cloudflare/workers-types (tests/cloudflare/test_platform_rules_under_pyodide.py holds
// both against the declaration workerd embeds): its keys (start() refuses any other, where the runtime would
// silently ignore a misspelt one), its instance literals, and ContainerSnapshotRestoreParams' one field.
const START_OPTIONS = ["entrypoint", "enableInternet", "env", "hardTimeout", "image", "instance", "labels",
  "directorySnapshots", "containerSnapshot"];
const INSTANCE_TYPES = new Set(["lite", "basic", "standard-1", "standard-2", "standard-3", "standard-4"]);
const SNAPSHOT_RESTORE_FIELDS = ["id"];
// Platform rules the harness keeps, each pinned by a test (docs/deploy-cloudflare.md lists them):
const ALARM_MAX_RETRIES = 6; // an alarm whose handler throws is retried at most 6 times...
const ALARM_FIRST_BACKOFF_MS = 2000; // ...with exponential backoff from 2 s
const MONITOR_KEEPALIVE_MS = 15 * 60 * 1000; // a pending monitor() keeps an idle object in memory this long at most
const IDLE_EVICTION_MS = 70 * 1000; // an object with nothing keeping it may be evicted this long after its last event
const DEPLOY_GRACE_MS = 30 * 1000; // a deploy cuts the object requests still in flight this long after it
const PLAN_BODY_BYTES = 100 * 1024 * 1024; // Free/Pro: a larger request body is refused (413) before the Worker runs
const RESET_BY_DEPLOY = "Durable Object reset because its code was updated.";
// Cloudflare keeps a container snapshot this long after it was made or last restored; then a restore fails.
const SNAPSHOT_LIFETIME_MS = 30 * 24 * 3600 * 1000;
const snapshotAliveFrom = new Map(); // snapshot id -> when it was made or last restored (the platform's clock)

// Time travel for alarms: POST /__harness/advance moves the clock the Python code reads (Date.now) forward.
const realNow = Date.now;
let clockOffsetMs = 0;
Date.now = () => realNow() + clockOffsetMs;

// Knobs tests turn through POST /__harness/knobs. directoryFault breaks the DIRECTORY objects: "fetch" makes their
// stubs' fetch reject (the object unreachable, as when the runtime resets it), "storage" makes their SQL throw (the
// Python code fails inside the object). canned answers for an object instead of it, keyed "<BINDING>:<name>":
// { status, contentType, body, repeat, suffix } (body repeated `repeat` times, then suffix), to try the stubs on
// answers the real objects never give. proxyHeadSeconds sets how long a proxied request waits for the upstream's
// head (protocol.limits.PROXY_HEAD_SECONDS); silenceSeconds the Cloudflare silence guard (cloudflare.streams).
// startFailures: the next N container starts fail after start() returned (no capacity). alarmFaults {object: N}:
// the next N alarm deliveries of that object run with its storage failing (the handler throws). alarmRepeat
// {object: N}: the next N successful deliveries come again (at least once). bodyLengthKnown false: request bodies
// reach the Worker as streams of unknown length even when the client sent Content-Length. planBodyBytes: the
// plan's request body limit. r2Fault, r2FailAfterParts, r2CorruptReads, r2ListPage, backupsBinding: the fake R2
// bucket's (see "R2" below).
const knobs = {
  startDelayMs: 0, failSnapshot: false, directoryFault: null, canned: {}, proxyHeadSeconds: 60, silenceSeconds: null,
  startFailures: 0, alarmFaults: {}, alarmRepeat: {}, bodyLengthKnown: true, planBodyBytes: PLAN_BODY_BYTES,
  r2Fault: null, r2FailAfterParts: null, r2CorruptReads: false, r2ListPage: 1000, backupsBinding: true,
};
// Every binding call, in order, for tests to assert on.
const calls = [];
const record = (api, object, detail = {}) => calls.push({ api, object, at: Date.now(), ...detail });

process.on("unhandledRejection", (err) => console.error("harness: unhandled rejection:", err));

// Body lengths as workerd knows them. A stream's length is known when it came with one (a request whose client
// sent Content-Length, a FixedLengthStream's readable) and carries over to a Request made from it; a stream the
// code made itself (a TransformStream's readable) has none. The container port's fetch frames by it as workerd
// does: a known length goes out as Content-Length, an unknown one chunked — an explicit content-length header on
// such a stream is dropped, not an error (tests/workerd/test_stream_patterns.py).
const knownLengths = new WeakMap();
function lengthOf(body) {
  if (body === undefined || body === null) return 0;
  if (typeof body === "string") return Buffer.byteLength(body);
  if (body instanceof ArrayBuffer || ArrayBuffer.isView(body)) return body.byteLength;
  if (body instanceof ReadableStream) return knownLengths.get(body) ?? null;
  return null;
}
// The body a Request built from (input, init) takes: init's, else the input Request's.
function sourceBody(input, init) {
  if (init && init.body !== undefined) return init.body;
  return input instanceof Request ? input.body : null;
}
function keepLength(length, request) {
  if (request.body && length !== null) knownLengths.set(request.body, length);
  return request;
}

// workerd's FixedLengthStream: an identity byte stream whose readable has a known length; more bytes than that
// error it, fewer never make a complete body (the fetch carrying it fails).
class FixedLengthStream extends TransformStream {
  constructor(expectedLength) {
    const expected = Number(expectedLength);
    if (!Number.isSafeInteger(expected) || expected < 0) throw new TypeError("FixedLengthStream needs a length >= 0");
    let seen = 0;
    super({
      transform(chunk, controller) {
        if (!(chunk instanceof ArrayBuffer || ArrayBuffer.isView(chunk))) {
          throw new TypeError("This TransformStream is being used as a byte stream, but received an object of "
            + "non-ArrayBuffer/ArrayBufferView type on its writable side.");
        }
        seen += chunk.byteLength;
        if (seen > expected) throw new TypeError("Attempt to write too many bytes through a FixedLengthStream.");
        controller.enqueue(chunk instanceof ArrayBuffer ? new Uint8Array(chunk) : chunk);
      },
      flush() {
        if (seen < expected) throw new TypeError("FixedLengthStream did not see all expected bytes before close().");
      },
    });
    knownLengths.set(this.readable, expected);
  }
}
globalThis.FixedLengthStream = FixedLengthStream;

// ---------------------------------------------------------------------------------------------------------------
// WebSockets, as workerd has them (workerd 2026-11-17 at this compatibility date, each rule checked on the binary):
//   * WebSocketPair: two linked ends ({0, 1}). An end the code holds must be accept()ed before it sends or closes
//     ("You must call one of accept() …"); what reaches it before that waits, and is dispatched after accept(),
//     asynchronously and in order: "message" (data a string, or for a binary message a Blob — ArrayBuffer only
//     with binaryType "arraybuffer", the standard default since websocket_standard_binary_type), "close" (code,
//     reason, wasClean). A close is answered automatically, so after the peer's close send() throws as after one's
//     own ("Can't call WebSocket send() after close()."); a second close() is ignored; close codes and reasons are
//     checked (1000–4999 but 1004/1005/1006/1015, a reason needs a code, at most 123 bytes of UTF-8). A peer that
//     goes away without a close gives "close" 1006 (wasClean false).
//   * Response: status 101 only with a webSocket, and a webSocket only with status 101 and no body. Returning it
//     couples the end to whatever the response goes to; an end already accept()ed or already returned cannot be
//     ("Can't return WebSocket in a Response after calling accept()." / "… already used in a response."), nor an end
//     of a response to a request without `Upgrade: websocket`.
//   * A stub fetch with `Upgrade: websocket` reaches the object as a GET without a body, whatever its method; the
//     object's 101 comes back with a webSocket of its own (coupled to the object's end), and keeps the object's
//     request in flight — the object in memory — until the socket is closed (an accepted, non-hibernatable socket).
//     A reset of the object (deploy, eviction) cuts it: both sides see 1006.
//   * A client's upgrade request (node's "upgrade" event) is answered by the Worker: a 101 with a webSocket
//     completes the handshake (the ws package, with the Worker's Sec-WebSocket-Protocol and other headers), any
//     other answer is written as plain HTTP and the connection closed. getTcpPort(port).fetch with
//     `Upgrade: websocket` opens a WebSocket to the container (the ws package, over the supervisor's unix socket)
//     and answers a 101 whose webSocket must be accepted — or, when the upgrade is refused, the refusal as an
//     ordinary Response (status, headers, body).
//   * A message the runtime receives over the network is at most WS_MAX_MESSAGE_BYTES (1 MiB): a larger one closes
//     the connection with 1009. No compression is negotiated.

const WS_MAX_MESSAGE_BYTES = 1024 * 1024;
const WS_GONE = "WebSocket disconnected without sending Close frame.";

const isUpgrade = (headers) => (headers.get("upgrade") ?? "").split(",").some((t) => t.trim().toLowerCase() === "websocket");

class WorkersMessageEvent extends Event {
  constructor(data) {
    super("message");
    this.data = data;
  }
}
class WorkersCloseEvent extends Event {
  constructor(code, reason, wasClean) {
    super("close");
    this.code = code;
    this.reason = reason;
    this.wasClean = wasClean;
  }
}

// The bytes of what send() was given, copied now (the caller may reuse its buffer); anything else becomes a string,
// as workerd converts it.
function messageData(data) {
  if (typeof data === "string") return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data.slice(0));
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength));
  return String(data);
}

function closeCheck(code, reason) {
  if (code !== undefined) {
    const c = Number(code);
    if (!Number.isInteger(c) || c < 1000 || c >= 5000 || [1004, 1005, 1006, 1015].includes(c)) {
      throw new DOMException(`Invalid WebSocket close code: ${code}.`, "InvalidAccessError");
    }
  }
  if (reason !== undefined && code === undefined) {
    throw new DOMException("If you specify a WebSocket close reason, you must also specify a code.", "InvalidAccessError");
  }
  if (reason !== undefined && Buffer.byteLength(String(reason)) > 123) {
    throw new DOMException("WebSocket close reason must not be longer than 123 bytes when UTF-8 encoded.", "SyntaxError");
  }
}

// One end. Its events: { type: "message", data } | { type: "close", code, reason } | { type: "abort" } (the
// peer went away without a close).
class WebSocket {
  #peer = null;
  #state = "pending"; // pending (awaiting acceptance or coupling) | accepted | coupled (returned in a response)
  #inbox = [];
  #draining = false;
  #listeners = new Map();
  #sink = null; // a coupled end's events go here
  #closedOutgoing = false;
  #closedIncoming = false;
  #aborted = false;
  #binaryType = "blob";

  static pair() {
    const a = new WebSocket();
    const b = new WebSocket();
    a.#peer = b;
    b.#peer = a;
    return [a, b];
  }

  get readyState() {
    if (this.#closedIncoming && this.#closedOutgoing) return 3;
    return this.#closedIncoming || this.#closedOutgoing ? 2 : 1;
  }
  get binaryType() {
    return this.#binaryType;
  }
  set binaryType(value) {
    if (value === "blob" || value === "arraybuffer") this.#binaryType = value; // anything else is ignored
  }
  // the runtime's view (no property of workerd's): accepted by the code, or returned in a response
  get accepted() {
    return this.#state === "accepted";
  }
  get coupled() {
    return this.#state === "coupled";
  }

  addEventListener(type, listener) {
    if (!this.#listeners.has(type)) this.#listeners.set(type, new Set());
    this.#listeners.get(type).add(listener);
  }
  removeEventListener(type, listener) {
    this.#listeners.get(type)?.delete(listener);
  }

  accept() {
    if (this.#state === "coupled") throw new TypeError("Can't accept() WebSocket that was already used in a response.");
    if (this.#state === "accepted") return;
    this.#state = "accepted";
    this.#schedule();
  }

  send(data) {
    if (this.#closedOutgoing) throw new TypeError("Can't call WebSocket send() after close().");
    if (this.#aborted) return; // the peer is gone: ignored, as workerd does
    if (this.#state !== "accepted") {
      throw new TypeError("You must call one of accept() or state.acceptWebSocket() on this WebSocket before sending messages.");
    }
    this.#transmit({ type: "message", data: messageData(data) });
  }

  close(code, reason) {
    if (this.#closedOutgoing || this.#aborted) return; // a second close is ignored
    if (this.#state !== "accepted") {
      throw new TypeError("You must call one of accept() or state.acceptWebSocket() on this WebSocket before sending messages.");
    }
    closeCheck(code, reason);
    this.#closedOutgoing = true;
    this.#transmit({ type: "close", code: code === undefined ? 1005 : Number(code), reason: reason === undefined ? "" : String(reason) });
  }

  // The runtime's side: what this end sends without the code's checks (a coupled end relays), and taking an end
  // over when it is returned in a response.
  transmit(event) {
    this.#transmit(event);
  }
  couple(sink) {
    if (this.#state === "accepted") throw new TypeError("Can't return WebSocket in a Response after calling accept().");
    if (this.#state === "coupled") throw new TypeError("Can't return WebSocket that was already used in a response.");
    this.#state = "coupled";
    this.#sink = sink;
    for (const event of this.#inbox.splice(0)) sink(event);
  }

  #transmit(event) {
    this.#peer?.#deliver(event);
  }

  #deliver(event) {
    if (this.#state === "coupled") {
      this.#sink(event);
      return;
    }
    this.#inbox.push(event);
    if (this.#state === "accepted") this.#schedule();
  }

  #schedule() {
    if (this.#draining || this.#inbox.length === 0) return;
    this.#draining = true;
    setImmediate(() => {
      this.#draining = false;
      for (const event of this.#inbox.splice(0)) this.#dispatch(event);
    });
  }

  #dispatch(event) {
    if (this.#closedIncoming) return;
    if (event.type === "message") {
      const { data } = event;
      const value = typeof data === "string" ? data
        : this.#binaryType === "arraybuffer" ? data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength)
        : new Blob([data]);
      this.#fire(new WorkersMessageEvent(value));
      return;
    }
    this.#closedIncoming = true;
    if (event.type === "abort") {
      this.#aborted = true;
      this.#fire(new WorkersCloseEvent(1006, WS_GONE, false));
      return;
    }
    if (!this.#closedOutgoing) {
      // the close is answered at once (web_socket_auto_reply_to_close): from now on send() throws
      this.#closedOutgoing = true;
      this.#transmit({ type: "close", code: event.code, reason: event.reason });
    }
    this.#fire(new WorkersCloseEvent(event.code, event.reason, true));
  }

  #fire(event) {
    const handler = this[`on${event.type}`];
    const listeners = [...(this.#listeners.get(event.type) ?? []), ...(typeof handler === "function" ? [handler] : [])];
    for (const listener of listeners) {
      try {
        if (typeof listener === "function") listener.call(this, event);
        else listener.handleEvent(event);
      } catch (err) {
        console.error(`harness: a WebSocket ${event.type} listener threw:`, String(err).split("\n")[0]);
      }
    }
  }
}

class WebSocketPair {
  constructor() {
    const [a, b] = WebSocket.pair();
    this[0] = a;
    this[1] = b;
  }
}
globalThis.WebSocketPair = WebSocketPair;

// The fake's own WebSocket rules, each case run on fresh pairs: its error ("<name>: <message>"), or its value
// (GET /__harness/wsprobe). tests/cloudflare/test_terminals_under_pyodide.py holds them against what workerd
// 2026-11-17 answered to the same cases.
async function wsProbe() {
  const out = {};
  const ends = () => Object.values(new WebSocketPair());
  const run = (name, fn) => {
    try {
      out[name] = String(fn());
    } catch (err) {
      out[name] = `${err.name}: ${err.message}`;
    }
  };
  run("status101NoWs", () => new Response(null, { status: 101 }).status);
  run("ws200", () => new Response(null, { status: 200, webSocket: ends()[0] }).status);
  run("ws101Body", () => new Response("x", { status: 101, webSocket: ends()[0] }).status);
  run("sendBeforeAccept", () => ends()[0].send("x") ?? "ok");
  run("closeBeforeAccept", () => ends()[0].close(1000) ?? "ok");
  const accepted = () => {
    const [end] = ends();
    end.accept();
    return end;
  };
  run("close1006", () => accepted().close(1006) ?? "ok");
  run("closeReasonNoCode", () => accepted().close(undefined, "x") ?? "ok");
  run("closeLongReason", () => accepted().close(1000, "x".repeat(124)) ?? "ok");
  run("sendAfterClose", () => {
    const end = accepted();
    end.close(1000);
    return end.send("x") ?? "ok";
  });
  run("doubleClose", () => {
    const end = accepted();
    end.close(1000);
    return end.close(1000) ?? "ok";
  });
  run("binaryTypeBad", () => {
    const [end] = ends();
    end.binaryType = "nope";
    return end.binaryType;
  });
  run("pairKeys", () => Object.keys(new WebSocketPair()).join(","));
  const [a, b] = ends();
  const seen = [];
  const closed = new Promise((resolve) => {
    b.addEventListener("message", (e) => seen.push(typeof e.data === "string" ? "str" : e.data.constructor.name));
    b.addEventListener("close", (e) => {
      seen.push(`close ${e.code} ${e.reason} ${e.wasClean}`);
      resolve();
    });
  });
  a.accept();
  a.send("s");
  a.send(new Uint8Array([1]));
  a.send(new Uint8Array([1]).buffer);
  a.close(4001, "r");
  b.accept(); // what came before is dispatched now, in order
  await closed;
  out.pair = seen.join(" | ");
  run("sendAfterPeerClose", () => b.send("x") ?? "ok");
  run("closeAfterPeerClose", () => b.close(1000, "x") ?? "ok");
  const [c, d] = ends();
  const types = [];
  const got = new Promise((resolve) => d.addEventListener("message", (e) => resolve(types.push(e.data.constructor.name))));
  d.binaryType = "arraybuffer";
  d.accept();
  c.accept();
  c.send(new Uint8Array([1, 2]));
  await got;
  out.arraybuffer = types.join(",");
  return out;
}

// Join two ends a response handed over (a stub's hop, the object's end to the socket the caller gets): each one's
// events are sent on by the other. `closed` settles once a close went both ways, or the connection broke; abort()
// breaks it (both sides see 1006).
function coupleEnds(a, b) {
  let resolve;
  const closed = new Promise((r) => (resolve = r));
  const closes = new Set();
  const watch = (from, to) => (event) => {
    to.transmit(event);
    if (event.type === "abort") resolve();
    if (event.type === "close") closes.add(from);
    if (closes.size === 2) resolve();
  };
  a.couple(watch(a, b));
  b.couple(watch(b, a));
  return {
    closed,
    abort() {
      a.transmit({ type: "abort" });
      b.transmit({ type: "abort" });
      resolve();
    },
  };
}

// An end the runtime takes over for a real connection (the `ws` package's socket: a client's, or the container's):
// frames both ways; `onClosed` once the connection is closed.
function coupleNetwork(end, conn, onClosed = () => {}) {
  end.couple((event) => {
    if (event.type === "message") {
      conn.send(typeof event.data === "string" ? event.data : Buffer.from(event.data), { binary: typeof event.data !== "string" });
    } else if (event.type === "close") {
      try {
        if (event.code === 1005) conn.close();
        else conn.close(event.code, event.reason);
      } catch (err) { // a code the ws package does not send (1016-2999)
        console.error("harness: could not relay a WebSocket close:", err.message);
        conn.terminate();
      }
    } else {
      conn.terminate();
    }
  });
  conn.on("message", (data, isBinary) => {
    const bytes = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
    end.transmit(isBinary ? { type: "message", data: new Uint8Array(bytes) } : { type: "message", data: bytes.toString("utf8") });
  });
  conn.on("close", (code, reason) => {
    end.transmit(code === 1006 ? { type: "abort" } : { type: "close", code, reason: reason.toString("utf8") });
    onClosed(code);
  });
  conn.on("error", (err) => console.error("harness: a WebSocket connection failed:", err.message));
}

// workerd's Response: node's, plus status 101 with a webSocket (node refuses 101 outright).
const NodeResponse = globalThis.Response;
const responseSockets = new WeakMap();
class Response extends NodeResponse {
  constructor(body, init) {
    const webSocket = init?.webSocket ?? null;
    if (webSocket === null) {
      if (Number(init?.status) === 101) {
        throw new RangeError("Responses may only be constructed with status codes in the range 200 to 599, inclusive.");
      }
      super(body, init);
      return;
    }
    if (!(webSocket instanceof WebSocket)) throw new TypeError("Response's webSocket must be a WebSocket");
    if (Number(init.status) !== 101) throw new RangeError("Responses with a WebSocket must have status code 101.");
    if (body !== null && body !== undefined) {
      throw new TypeError("Response with null body status (101, 204, 205, or 304) cannot have a body.");
    }
    const { webSocket: _socket, status: _status, ...rest } = init;
    super(null, { ...rest, status: 200 });
    responseSockets.set(this, webSocket);
  }
  get status() {
    return responseSockets.has(this) ? 101 : super.status;
  }
  get ok() {
    return responseSockets.has(this) ? false : super.ok;
  }
  get statusText() {
    return responseSockets.has(this) ? "Switching Protocols" : super.statusText;
  }
  get webSocket() {
    return responseSockets.get(this) ?? null;
  }
}
globalThis.Response = Response;

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
  constructor(object, storage) {
    this.object = object;
    this.storage = storage;
    this.db = object.db;
  }
  exec(query, ...bindings) {
    this.storage.check();
    if (knobs.directoryFault === "storage" && this.object.kind === CLASSES.DIRECTORY) {
      throw new Error("SQLITE_IOERR: disk I/O error (harness knob directoryFault)");
    }
    if (this.object.storageFault) throw new Error("SQLITE_IOERR: disk I/O error (harness knob alarmFaults)");
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

// One per object instance: once the instance is gone (evicted, or reset by a deploy) its storage refuses, as the
// runtime's does for a superseded instance — a leftover task of the old instance cannot write.
class DurableObjectStorage {
  constructor(object, generation) {
    this.object = object;
    this.generation = generation;
    this.sql = new SqlStorage(object, this);
  }
  check() {
    if (this.object.generation !== this.generation) throw new Error(this.object.resetReason);
  }
  async setAlarm(ms) {
    this.check();
    // as the runtime: only a class with an alarm() handler may set an alarm
    if (!this.object.kind.alarms) throw new Error(`${this.object.kind.className} has no alarm() handler`);
    record("storage.setAlarm", this.object.name, { at: Number(ms) });
    this.object.armAlarm(Number(ms));
  }
  async getAlarm() {
    this.check();
    return this.object.alarmAt;
  }
  async deleteAlarm() {
    this.check();
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
    this.sharedNet = false; // enableInternet: the sandbox shares the host's network, so its ports are reachable
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
    for (const k of Object.keys(o)) if (!START_OPTIONS.includes(k)) throw new TypeError(`start(): unknown option ${k}`);
    if (this.running) throw new Error("start() cannot be called on a container that is already running.");
    if (typeof o.enableInternet !== "boolean") throw new TypeError("start(): enableInternet is required");
    if ((o.image === undefined) === (o.containerSnapshot === undefined)) {
      throw new TypeError("start(): pass exactly one of image and containerSnapshot");
    }
    if (o.image !== undefined && typeof o.image !== "string") throw new TypeError("start(): image must be a string");
    if (o.containerSnapshot !== undefined) {
      const fields = Object.keys(o.containerSnapshot ?? {});
      if (typeof o.containerSnapshot?.id !== "string" || fields.some((k) => !SNAPSHOT_RESTORE_FIELDS.includes(k))) {
        throw new TypeError(`start(): containerSnapshot is {id} (ContainerSnapshotRestoreParams), not {${fields}}`);
      }
    }
    if (o.instance !== undefined && !INSTANCE_TYPES.has(o.instance)) {
      throw new TypeError(`start(): unknown instance type ${o.instance}`);
    }
    for (const [k, v] of Object.entries(o.env ?? {})) {
      if (typeof v !== "string") throw new TypeError(`start(): env ${k} must be a string`);
    }
    // What the runtime finds out only after start() returned: the start then fails, which shows as `running`
    // turning false and monitor() rejecting, never as a throw from start().
    let failure = null;
    if (o.image !== undefined && !Object.values(IMAGES).includes(o.image)) failure = `no image ${o.image}`;
    if (knobs.startFailures > 0) {
      knobs.startFailures--;
      failure = "no container instance is available (harness knob startFailures)";
    }
    let archive = null;
    let expired = false;
    if (o.containerSnapshot !== undefined) {
      const id = o.containerSnapshot.id;
      archive = path.join(STATE, "snapshots", `${id}.tar`);
      if (!fs.existsSync(archive)) failure = `no container snapshot ${id}`;
      expired = Date.now() >= snapshotAliveFrom.get(id) + SNAPSHOT_LIFETIME_MS;
      if (!expired) snapshotAliveFrom.set(id, Date.now()); // a restore renews the snapshot's life
    }
    record("container.start", this.object.name, {
      image: o.image ?? null,
      containerSnapshot: o.containerSnapshot?.id ?? null,
      instance: o.instance ?? null,
      enableInternet: o.enableInternet,
      envKeys: Object.keys(o.env ?? {}).sort(),
      envValues: Object.values(o.env ?? {}),
      expiredSnapshot: expired,
      keys: Object.keys(o).sort(),
      containerSnapshotKeys: o.containerSnapshot === undefined ? null : Object.keys(o.containerSnapshot).sort(),
      failure,
    });
    this.state = "starting";
    // a new container's inactivity counts from its start (not from the last activity of the one before it, which a
    // clock advanced by a test may put days back: its inactivity stop would fire before the supervisor is up)
    this.lastActivity = Date.now();
    this.sharedNet = o.enableInternet;
    this.dir = fs.mkdtempSync(path.join(STATE, "c-"));
    fs.mkdirSync(path.join(this.dir, "run"));
    fs.mkdirSync(path.join(this.dir, "workspace"));
    fs.mkdirSync(path.join(this.dir, "home")); // the image's /home/sandbox: writable, snapshotted with the rest
    let resolve, reject;
    const promise = new Promise((res, rej) => ((resolve = res), (reject = rej)));
    promise.catch(() => {});
    this.exit = { promise, resolve, reject };
    this.boot(archive, o, expired, failure).catch((err) => this.stopped(err));
  }

  async boot(archive, o, expired, failure) {
    const dir = this.dir;
    if (knobs.startDelayMs) await new Promise((r) => setTimeout(r, knobs.startDelayMs)); // a slow cold start
    if (expired) throw new Error("the container snapshot has expired"); // start() accepted it; the restore fails
    if (failure) {
      await new Promise((r) => setTimeout(r, 200)); // the platform tries first
      if (this.dir === dir) throw new Error(`Container failed to start: ${failure}`);
      return;
    }
    if (archive) await run("tar", ["-xf", archive, "-C", dir]);
    if (this.dir !== dir) return; // destroyed while booting
    const argv = [
      "--die-with-parent", "--unshare-user", "--uid", "1000", "--gid", "1000",
      "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "container",
      ...(o.enableInternet ? [] : ["--unshare-net"]),
      ...hostRoot(), "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/home",
      ...BINDS.flatMap((p) => ["--ro-bind", p, p]), // the supervisor's code and interpreter, wherever they live
      "--bind", path.join(dir, "workspace"), "/workspace", "--bind", path.join(dir, "run"), "/run/flarebox",
      "--bind", path.join(dir, "home"), "/home/sandbox",
      "--chdir", "/workspace", "--clearenv",
      "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "--setenv", "HOME", "/workspace",
      // the sandbox user of the image is `sandbox` (home /home/sandbox); the host's passwd has no such user
      "--setenv", "FLAREBOX_ARCHIVE_HOME", "/home/sandbox",
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
    this.frozen = false;
    this.object.monitorSince = null; // a settled monitor() keeps nothing alive
    clearInterval(this.inactivityTimer);
    this.inactivityTimer = null;
    record("container.exited", this.object.name, { error: err ? String(err.message) : null });
    if (err) reject(err);
    else resolve();
  }

  monitor() {
    record("container.monitor", this.object.name);
    if (!this.running) return Promise.reject(new Error("monitor(): the container is not running"));
    this.object.monitorSince = Date.now(); // keeps the object in memory, MONITOR_KEEPALIVE_MS at most
    return this.exit.promise;
  }

  // A frozen container (test knob): every process of the sandbox stopped (SIGSTOP), so nothing answers — the
  // kernel still accepts connections on its sockets — until thawed (SIGCONT).
  freeze(frozen) {
    record(frozen ? "harness.freeze" : "harness.thaw", this.object.name);
    if (!this.proc) return false;
    for (const pid of processTree(this.proc.pid)) {
      try {
        process.kill(pid, frozen ? "SIGSTOP" : "SIGCONT");
      } catch {
        // exited meanwhile
      }
    }
    this.frozen = frozen;
    return true;
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
    snapshotAliveFrom.set(id, Date.now());
    const dir = path.join(STATE, "snapshots");
    fs.mkdirSync(dir, { recursive: true });
    const tmp = path.join(dir, `${id}.tmp`);
    await run("tar", ["-cf", tmp, "-C", this.dir, "workspace", "home"]);
    fs.renameSync(tmp, path.join(dir, `${id}.tar`));
    return { id, size: fs.statSync(path.join(dir, `${id}.tar`)).size, name };
  }

  getTcpPort(port) {
    return { fetch: (input, init) => this.portFetch(port, input, init) };
  }

  // Where the request to `port` goes: the supervisor's unix socket, or the address a process of this container
  // listens on. null when nothing of the container listens there (the platform's "not listening" error).
  target(port) {
    if (this.state !== "running") return null;
    if (port === SUPERVISOR_PORT) {
      const socket = this.dir && path.join(this.dir, "run", "s.sock");
      return socket && fs.existsSync(socket) ? { socketPath: socket } : null;
    }
    const listening = listeningSockets(port);
    if (listening.size === 0 || !this.proc) return null;
    for (const pid of processTree(this.proc.pid)) {
      let fds;
      try {
        fds = fs.readdirSync(`/proc/${pid}/fd`);
      } catch {
        continue; // exited meanwhile
      }
      for (const fd of fds) {
        let link;
        try {
          link = fs.readlinkSync(`/proc/${pid}/fd/${fd}`);
        } catch {
          continue;
        }
        const inode = /^socket:\[(\d+)\]$/.exec(link)?.[1];
        if (inode && listening.has(inode)) {
          if (!this.sharedNet) {
            console.error(`harness: port ${port} is unreachable without enableInternet (no shared network)`);
            throw new Error(`harness: port ${port} of a container started without enableInternet is out of reach`);
          }
          return { host: listening.get(inode), port };
        }
      }
    }
    return null;
  }

  async portFetch(port, input, init) {
    const length = lengthOf(sourceBody(input, init));
    const request = new Request(input, init);
    if (isUpgrade(request.headers)) return await this.portUpgrade(Number(port), request);
    const url = new URL(request.url);
    const framing = !request.body ? "none" : length === null ? "chunked" : "length";
    record("container.getTcpPort.fetch", this.object.name, {
      port, method: request.method, path: url.pathname, framing, length: request.body ? length : null,
    });
    const target = this.target(Number(port));
    if (!target) {
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
      // framing is the runtime's: the body's known length, or chunked (the code's content-length is dropped)
      delete headers["content-length"];
      delete headers["transfer-encoding"];
      if (request.body && length !== null) headers["content-length"] = String(length);
      const req = http.request({ ...target, method: request.method, path: url.pathname + url.search, headers });
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
      if (request.body) {
        const source = Readable.fromWeb(request.body);
        source.on("error", (err) => req.destroy(err)); // a body that fails midway (FixedLengthStream) fails the fetch
        source.pipe(req);
      } else {
        req.end();
      }
    });
  }
}

// getTcpPort(port).fetch with `Upgrade: websocket` (see "WebSockets" above): a WebSocket to what listens on the
// port (the supervisor's unix socket for 8080), with the `ws` package. Its 101 carries a webSocket the code must
// accept; a refused upgrade is the upstream's answer as it came. The container counts as in use (inflight) while the
// socket is open.
Container.prototype.portUpgrade = async function portUpgrade(port, request) {
  const url = new URL(request.url);
  record("container.getTcpPort.fetch", this.object.name, {
    port, method: request.method, path: url.pathname, framing: "none", length: null, upgrade: true,
  });
  const target = this.target(port);
  if (!target) throw new Error(`The container is not listening in the TCP address 10.0.0.1:${port}`);
  const address = target.socketPath
    ? `ws+unix://${target.socketPath}:${url.pathname}${url.search}`
    : `ws://${target.host.includes(":") ? `[${target.host}]` : target.host}:${port}${url.pathname}${url.search}`;
  const headers = {};
  for (const [k, v] of request.headers) {
    if (!["upgrade", "connection", "host"].includes(k) && !k.startsWith("sec-websocket-")) headers[k] = v;
  }
  this.inflight++;
  this.lastActivity = Date.now();
  let finished = false;
  const done = () => {
    if (finished) return;
    finished = true;
    this.inflight--;
    this.lastActivity = Date.now();
  };
  return await new Promise((resolve, reject) => {
    const conn = new NodeWebSocket(address, { headers, perMessageDeflate: false, maxPayload: WS_MAX_MESSAGE_BYTES });
    let settled = false;
    const answered = new Headers();
    conn.on("upgrade", (res) => {
      for (let i = 0; i < res.rawHeaders.length; i += 2) answered.append(res.rawHeaders[i], res.rawHeaders[i + 1]);
    });
    conn.on("unexpected-response", (req, res) => {
      settled = true;
      record("container.websocket.refused", this.object.name, { path: url.pathname, status: res.statusCode });
      const out = new Headers();
      for (let i = 0; i < res.rawHeaders.length; i += 2) out.append(res.rawHeaders[i], res.rawHeaders[i + 1]);
      res.on("close", () => {
        done();
        req.destroy();
      });
      resolve(new Response([204, 304].includes(res.statusCode) ? null : Readable.toWeb(res), { status: res.statusCode, headers: out }));
    });
    conn.on("open", () => {
      settled = true;
      record("container.websocket.open", this.object.name, { path: url.pathname });
      const [runtime, handed] = WebSocket.pair();
      coupleNetwork(runtime, conn, (code) => {
        record("container.websocket.closed", this.object.name, { path: url.pathname, code });
        done();
      });
      resolve(new Response(null, { status: 101, webSocket: handed, headers: answered }));
    });
    conn.on("error", (err) => {
      if (settled) return; // once open, its close follows
      settled = true;
      done();
      reject(new Error(`Network connection lost: ${err.message}`));
    });
    request.signal?.addEventListener("abort", () => {
      if (settled) return;
      settled = true;
      conn.terminate();
      done();
      reject(new Error("The operation was aborted"));
    });
  });
};

// The listening TCP sockets on `port` in this (the host's) network namespace: inode -> the address to connect to.
function listeningSockets(port) {
  const found = new Map();
  for (const [file, v6] of [["/proc/net/tcp", false], ["/proc/net/tcp6", true]]) {
    let text;
    try {
      text = fs.readFileSync(file, "utf8");
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10 || f[3] !== "0A") continue; // 0A: LISTEN
      const [hex, portHex] = f[1].split(":");
      if (parseInt(portHex, 16) !== port) continue;
      let host;
      if (!v6) {
        const ip = [0, 2, 4, 6].map((i) => parseInt(hex.slice(i, i + 2), 16)).reverse().join(".");
        host = ip === "0.0.0.0" ? "127.0.0.1" : ip;
      } else if (/^0{32}$/.test(hex) || hex === "00000000000000000000000001000000") {
        host = "::1"; // :: or ::1
      } else {
        continue; // a specific IPv6 address: no service the tests start binds one
      }
      found.set(f[9], host);
    }
  }
  return found;
}

// `root` and every process descending from it (the sandbox's processes, seen from the host).
function processTree(root) {
  const children = new Map();
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue;
    }
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (!children.has(ppid)) children.set(ppid, []);
    children.get(ppid).push(Number(entry));
  }
  const tree = [];
  const queue = [root];
  while (queue.length) {
    const pid = queue.shift();
    tree.push(pid);
    queue.push(...(children.get(pid) ?? []));
  }
  return tree;
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
    this.container = kind.container ? new Container(this) : null;
    this.alarmAt = null;
    this.alarmTimer = null;
    this.alarmRetry = 0; // the retryCount of the armed alarm (a retry of a failed delivery, or 0)
    this.instance = null;
    this.generation = 0; // bumped when the instance goes (evicted, reset by a deploy)
    this.resetReason = null;
    this.inflight = 0; // requests (until their response's last byte) and alarm deliveries being handled
    this.lastEvent = Date.now();
    this.monitorSince = null; // when the pending monitor() was called (it keeps the object alive for a while)
    this.flights = new Set(); // the requests in flight, each with cut(err)
    this.storageFault = false;
  }

  // The Python object, constructed on first use and again after an eviction or a deploy, as the runtime does.
  get py() {
    if (!this.instance) {
      record("object.construct", this.name, { generation: this.generation });
      const ctx = {
        id: new DurableObjectId(this.name),
        storage: new DurableObjectStorage(this, this.generation),
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

  // An event begins (a request, an alarm delivery): the object is busy until the returned function is called.
  begin() {
    this.inflight++;
    this.lastEvent = Date.now();
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.inflight--;
      this.lastEvent = Date.now();
    };
  }

  // The instance is gone: its storage refuses from now on and every request still in flight is cut with `message`.
  reset(reason, message) {
    record(reason === "deploy" ? "harness.reset" : "harness.evict", this.name, { reason, cut: this.flights.size });
    this.generation++;
    this.resetReason = message;
    this.instance = null;
    this.monitorSince = null;
    const err = new Error(message);
    for (const flight of [...this.flights]) flight.cut(err);
  }

  // Evictable: nothing in flight, idle for IDLE_EVICTION_MS, and no monitor() keeping it (for MONITOR_KEEPALIVE_MS).
  evictable(now) {
    if (!this.instance || this.inflight > 0 || now - this.lastEvent < IDLE_EVICTION_MS) return false;
    const watched = this.monitorSince !== null && this.container?.running;
    return !watched || now - this.monitorSince >= MONITOR_KEEPALIVE_MS;
  }

  armAlarm(at, retry = 0) {
    clearTimeout(this.alarmTimer);
    this.alarmTimer = null;
    this.alarmAt = at;
    this.alarmRetry = at === null ? 0 : retry;
    if (at !== null) this.alarmTimer = setTimeout(() => this.fireAlarm(), Math.max(0, at - Date.now()));
  }

  // The armed alarm is due: deliver it. At least once: a delivery that succeeded may come again (knob alarmRepeat).
  async fireAlarm() {
    const retryCount = this.alarmRetry;
    clearTimeout(this.alarmTimer);
    this.alarmTimer = null;
    this.alarmAt = null;
    this.alarmRetry = 0;
    const ok = await this.deliverAlarm(retryCount, false);
    if (ok && (knobs.alarmRepeat?.[this.name] ?? 0) > 0) {
      knobs.alarmRepeat[this.name]--;
      await this.deliverAlarm(0, true);
    }
    return ok;
  }

  // A handler that throws is retried up to ALARM_MAX_RETRIES times, ALARM_FIRST_BACKOFF_MS after the first failure
  // and doubling — unless it set a new alarm meanwhile. After the last retry the alarm is dropped.
  async deliverAlarm(retryCount, redelivery) {
    const faults = knobs.alarmFaults?.[this.name] ?? 0;
    if (faults > 0) knobs.alarmFaults[this.name] = faults - 1;
    record("alarm", this.name, { retryCount, redelivery, storageFault: faults > 0 });
    const end = this.begin();
    this.storageFault = faults > 0;
    try {
      await this.py.alarm({ retryCount, isRetry: retryCount > 0 });
    } catch (err) {
      console.error(`harness: alarm of ${this.name} failed:`, String(err).split("\n")[0]);
      if (!redelivery && this.alarmAt === null) {
        if (retryCount < ALARM_MAX_RETRIES) {
          this.armAlarm(Date.now() + ALARM_FIRST_BACKOFF_MS * 2 ** retryCount, retryCount + 1);
        } else {
          record("alarm.dropped", this.name, { retryCount });
        }
      }
      return false;
    } finally {
      this.storageFault = false;
      end();
    }
    return true;
  }

  // A request to the object. Its response counts as in flight until its last byte; a reset cuts it midway (the
  // client's read fails), and one still waiting for its response fails with the reset's error.
  async fetch(request) {
    const upgrade = isUpgrade(request.headers);
    record("object.fetch", this.name, {
      binding: this.kind.binding, path: new URL(request.url).pathname, bodyLength: lengthOf(request.body),
      ...(upgrade ? { upgrade: true } : {}),
    });
    const end = this.begin();
    const flight = {};
    const cut = new Promise((_, reject) => (flight.reject = reject));
    cut.catch(() => {});
    flight.cut = (err) => {
      flight.reject(err);
      flight.controller?.abort(err);
    };
    this.flights.add(flight);
    const finish = () => {
      this.flights.delete(flight);
      end();
    };
    let response;
    try {
      response = await Promise.race([this.py.fetch(python.Request(request)).then((r) => r.js_object), cut]);
    } catch (err) {
      finish();
      throw err;
    }
    if (response.webSocket) return this.passSocket(request, response, flight, finish, upgrade);
    if (!response.body) {
      finish();
      return response;
    }
    const relay = new TransformStream();
    flight.controller = new AbortController();
    response.body.pipeTo(relay.writable, { signal: flight.controller.signal }).catch(() => {}).finally(finish);
    return new Response(relay.readable, { status: response.status, headers: response.headers });
  }
}

// The object answered 101 with a webSocket: the caller gets a socket of its own, coupled to the object's end. The
// request stays in flight (the object busy, in memory) until the socket is closed; a reset of the object cuts it.
DurableObject.prototype.passSocket = function passSocket(request, response, flight, finish, upgrade) {
  const path = new URL(request.url).pathname;
  let link;
  let handed;
  try {
    if (!upgrade) {
      throw new TypeError("Worker tried to return a WebSocket in a response to a request which did not contain the "
        + "header \"Upgrade: websocket\".");
    }
    let hop;
    [handed, hop] = WebSocket.pair();
    link = coupleEnds(response.webSocket, hop);
  } catch (err) {
    finish();
    throw err;
  }
  record("object.websocket", this.name, { path });
  flight.cut = (err) => {
    flight.reject(err);
    link.abort();
  };
  link.closed.then(() => {
    record("object.websocket.closed", this.name, { path });
    finish();
  });
  return new Response(null, { status: 101, webSocket: handed, headers: response.headers });
};

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
        const length = lengthOf(sourceBody(input, init));
        const request = new Request(input, init?.body ? { ...init, duplex: "half" } : init);
        if (isUpgrade(request.headers)) {
          // an upgrade reaches the object as a GET without a body, whatever the caller's method (workerd's openWebSocket)
          request.body?.cancel().catch(() => {});
          return object.fetch(new Request(request.url, { method: "GET", headers: request.headers, signal: request.signal }));
        }
        return object.fetch(keepLength(length, request));
      },
    };
  }
}

// ---------------------------------------------------------------------------------------------------------------
// R2: env.BACKUPS, an R2 bucket binding (r2_buckets in wrangler.jsonc) as strict as R2 where its rules are known
// (developers.cloudflare.com/r2/api/workers/workers-api-reference, r2/objects/multipart-objects):
//   put/uploadPart of a ReadableStream need a known length (a request/response body or a FixedLengthStream's
//   readable), else TypeError; multipart parts are checked at complete(): each {partNumber, etag} as uploadPart
//   answered, every part but the last >= 5 MiB, all but the last the same size, the last no larger; an upload
//   that is unknown, aborted or completed refuses uploadPart/complete (resumeMultipartUpload checks nothing, as on
//   R2); list() pages by `limit` (1..1000) with {objects, truncated, cursor, delimitedPrefixes}, and returns
//   customMetadata/httpMetadata only when asked with `include`. Stricter than R2 where R2 would silently ignore a
//   mistake: unknown option keys throw. Errors read like workerd's: "<op>: <message> (<R2 error code>)".
// Objects live on disk: STATE/r2/objects/<sha256 of the key> (the bytes; a test may damage them there), their
// metadata in memory. Knobs: r2Fault "full" (every write throws; reads work) or "gone" (every call throws: the
// bucket was deleted); r2FailAfterParts N (uploadPart throws once N parts went up); r2CorruptReads (get() bodies
// come back with one byte flipped); r2ListPage N (a page holds at most N objects, as R2 may return fewer than
// `limit`); backupsBinding false (objects constructed from then on find no env.BACKUPS). r2FailAfterParts counts
// down: N more parts succeed, then every uploadPart throws until the knob is reset (null).
// GET /__harness/r2 shows the bucket (objects, uploads); POST /__harness/r2?delete=<key> removes an object behind
// the code's back; GET /__harness/r2probe runs the fake's own rules (each case's error, or "ok").

const R2_MIN_PART_BYTES = 5 * 1024 * 1024;
const R2_MAX_PART_BYTES = 5 * 1024 * 1024 * 1024;
const R2_MAX_PARTS = 10000;
const R2_MAX_LIST = 1000;
const R2_MAX_KEY_BYTES = 1024;
const R2_MAX_PUT_BYTES = 5363466240; // 5 GiB - 5 MiB: larger objects need a multipart upload
const R2_MAX_METADATA_BYTES = 8192;
const R2_KNOWN_LENGTH = "Provided readable stream must have a known length (request/response body or readable half of "
  + "FixedLengthStream)";

function r2Error(op, message, code) {
  return new Error(`${op}: ${message} (${code})`);
}
const r2Errors = {
  noSuchBucket: (op) => r2Error(op, "The specified bucket does not exist.", 10006),
  noSuchUpload: (op) => r2Error(op, "The specified multipart upload does not exist.", 10024),
  invalidPart: (op) => r2Error(op, "One or more of the specified parts could not be found.", 10025),
  entityTooSmall: (op) => r2Error(op, "Your proposed upload is smaller than the minimum allowed object size.", 10011),
  entityTooLarge: (op) => r2Error(op, "Your proposed upload exceeds the maximum allowed object size.", 100100),
  badUpload: (op) => r2Error(op, "There was a problem with the multipart upload.", 10048),
  internal: (op) => r2Error(op, "We encountered an internal error. Please try again.", 10001),
  invalidMaxKeys: (op) => r2Error(op, "MaxKeys params must be positive integer <= 1000.", 10022),
  invalidKey: (op) => r2Error(op, "The specified object name is not valid.", 10020),
  invalidArgument: (op, what) => r2Error(op, `Invalid argument: ${what}.`, 10029),
  metadataTooLarge: (op) => r2Error(op, "Your metadata headers exceed the maximum allowed metadata size.", 10012),
  full: (op) => r2Error(op, "The account's R2 storage is full (harness knob r2Fault=full).", 10001),
};

function r2Options(op, options, allowed) {
  if (options === undefined || options === null) return {};
  if (typeof options !== "object") throw new TypeError(`${op}(): options must be an object`);
  for (const k of Object.keys(options)) {
    if (!allowed.includes(k)) throw new TypeError(`${op}(): unknown option ${k} (harness: R2 would ignore it)`);
  }
  return options;
}

function r2Key(op, key) {
  if (typeof key !== "string") throw new TypeError(`${op}(): the key must be a string`);
  if (Buffer.byteLength(key) > R2_MAX_KEY_BYTES || key === "") throw r2Errors.invalidKey(op);
  return key;
}

function r2Metadata(op, options) {
  const custom = options.customMetadata ?? {};
  if (typeof custom !== "object" || custom instanceof Map) throw new TypeError(`${op}(): customMetadata is an object`);
  let bytes = 0;
  for (const [k, v] of Object.entries(custom)) {
    if (typeof v !== "string") throw new TypeError(`${op}(): customMetadata ${k} must be a string`);
    bytes += Buffer.byteLength(k) + Buffer.byteLength(v);
  }
  if (bytes > R2_MAX_METADATA_BYTES) throw r2Errors.metadataTooLarge(op);
  const http = options.httpMetadata ?? {};
  if (typeof http !== "object" || http instanceof Headers) {
    throw new TypeError(`${op}(): harness takes httpMetadata as an R2HTTPMetadata object only`);
  }
  return { customMetadata: { ...custom }, httpMetadata: { ...http } };
}

// The bytes of a put()/uploadPart() value: string, ArrayBuffer(View), Blob, null, or a ReadableStream of known
// length (which must deliver exactly that many bytes).
async function r2Value(op, value) {
  if (value === null || value === undefined) return Buffer.alloc(0);
  if (typeof value === "string") return Buffer.from(value);
  if (value instanceof ArrayBuffer) return Buffer.from(new Uint8Array(value));
  if (ArrayBuffer.isView(value)) return Buffer.from(new Uint8Array(value.buffer, value.byteOffset, value.byteLength));
  if (value instanceof Blob) return Buffer.from(await value.arrayBuffer());
  if (value instanceof ReadableStream) {
    const length = lengthOf(value);
    if (length === null) throw new TypeError(`${op}: ${R2_KNOWN_LENGTH}`);
    const chunks = [];
    let seen = 0;
    for await (const chunk of value) {
      const bytes = Buffer.from(chunk.buffer ? new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength) : chunk);
      seen += bytes.length;
      chunks.push(bytes);
    }
    if (seen !== length) throw new TypeError(`${op}: the stream delivered ${seen} bytes, not its length ${length}`);
    return Buffer.concat(chunks);
  }
  throw new TypeError(`${op}(): unsupported value type ${value?.constructor?.name ?? typeof value}`);
}

class R2Object {
  constructor(meta) {
    this.key = meta.key;
    this.version = meta.version;
    this.size = meta.size;
    this.etag = meta.etag;
    this.httpEtag = `"${meta.etag}"`;
    this.uploaded = new Date(meta.uploaded);
    this.checksums = meta.md5 ? { md5: Buffer.from(meta.md5, "hex").buffer } : {};
    this.storageClass = "Standard";
    this.httpMetadata = { ...meta.httpMetadata };
    this.customMetadata = { ...meta.customMetadata };
  }
  writeHttpMetadata(headers) {
    for (const [k, v] of Object.entries(this.httpMetadata)) if (k === "contentType") headers.set("content-type", v);
  }
}

class R2ObjectBody extends R2Object {
  constructor(meta, body) {
    super(meta);
    this.body = body;
  }
  get bodyUsed() {
    return this.body.locked;
  }
  async arrayBuffer() {
    return await new Response(this.body).arrayBuffer();
  }
  async text() {
    return await new Response(this.body).text();
  }
  async json() {
    return JSON.parse(await this.text());
  }
}

class R2MultipartUpload {
  constructor(bucket, key, uploadId) {
    this.bucket = bucket;
    this.key = key;
    this.uploadId = uploadId;
  }
  // The upload as the bucket knows it, if it may still take parts (unknown, other key, done, aborted: it may not).
  open(op) {
    const upload = this.bucket.uploads.get(this.uploadId);
    if (!upload || upload.key !== this.key || upload.state !== "open") throw r2Errors.noSuchUpload(op);
    return upload;
  }
  async uploadPart(partNumber, value, options) {
    const op = "uploadPart";
    this.bucket.check(op, true);
    r2Options(op, options, ["ssecKey"]);
    record("r2.uploadPart", null, { key: this.key, uploadId: this.uploadId, partNumber, length: lengthOf(value) });
    const upload = this.open(op);
    if (!Number.isInteger(partNumber) || partNumber < 1 || partNumber > R2_MAX_PARTS) {
      throw r2Errors.invalidArgument(op, "part number must be an integer from 1 to 10000");
    }
    if (knobs.r2FailAfterParts !== null && knobs.r2FailAfterParts !== undefined) {
      if (knobs.r2FailAfterParts <= 0) throw r2Errors.internal(op);
      knobs.r2FailAfterParts--;
    }
    const bytes = await r2Value(op, value);
    if (bytes.length > R2_MAX_PART_BYTES) throw r2Errors.entityTooLarge(op);
    this.open(op); // aborted while the value was read?
    const file = path.join(upload.dir, String(partNumber));
    fs.writeFileSync(file, bytes);
    const etag = createHash("md5").update(bytes).digest("hex");
    upload.parts.set(partNumber, { size: bytes.length, etag, file });
    return { partNumber, etag };
  }
  async complete(uploadedParts) {
    const op = "completeMultipartUpload";
    this.bucket.check(op, true);
    const list = Array.isArray(uploadedParts) ? uploadedParts : null;
    record("r2.complete", null, { key: this.key, uploadId: this.uploadId, parts: list?.length ?? null });
    if (!list) throw new TypeError("complete(): uploadedParts must be an array of R2UploadedPart");
    const upload = this.open(op);
    if (list.length === 0) throw r2Errors.invalidArgument(op, "at least one part is needed");
    const seen = new Set();
    const parts = list.map((p) => {
      const fields = Object.keys(p ?? {});
      if (fields.some((k) => !["partNumber", "etag"].includes(k))) {
        throw new TypeError(`complete(): an R2UploadedPart is {partNumber, etag}, not {${fields}}`);
      }
      if (seen.has(p.partNumber)) throw r2Errors.internal(op);
      seen.add(p.partNumber);
      const stored = upload.parts.get(p.partNumber);
      if (!stored || stored.etag !== p.etag) throw r2Errors.invalidPart(op);
      return { number: p.partNumber, ...stored };
    });
    parts.sort((a, b) => a.number - b.number);
    const head = parts.slice(0, -1);
    if (head.some((p) => p.size < R2_MIN_PART_BYTES)) throw r2Errors.entityTooSmall(op);
    if (head.some((p) => p.size !== head[0].size)) throw r2Errors.badUpload(op);
    if (head.length && parts[parts.length - 1].size > head[0].size) throw r2Errors.badUpload(op);
    const tmp = path.join(upload.dir, "assembled");
    fs.writeFileSync(tmp, Buffer.alloc(0));
    for (const p of parts) fs.appendFileSync(tmp, fs.readFileSync(p.file));
    const md5s = Buffer.concat(parts.map((p) => Buffer.from(p.etag, "hex")));
    const etag = `${createHash("md5").update(md5s).digest("hex")}-${parts.length}`;
    const meta = this.bucket.store(this.key, tmp, { ...upload.metadata, etag, md5: null });
    upload.state = "completed";
    fs.rmSync(upload.dir, { recursive: true, force: true });
    return new R2Object(meta);
  }
  async abort() {
    const op = "abortMultipartUpload";
    this.bucket.check(op, false);
    record("r2.abort", null, { key: this.key, uploadId: this.uploadId });
    const upload = this.bucket.uploads.get(this.uploadId);
    if (!upload || upload.key !== this.key) throw r2Errors.internal(op);
    if (upload.state !== "open") return; // aborting a finished upload changes nothing
    upload.state = "aborted";
    fs.rmSync(upload.dir, { recursive: true, force: true });
  }
}

// The class name matters: the Workers SDK wraps an env binding whose constructor is named "R2Bucket".
class R2Bucket {
  constructor(dir) {
    this.dir = dir;
    this.objects = new Map(); // key -> { key, version, size, etag, md5, uploaded, httpMetadata, customMetadata }
    this.uploads = new Map(); // uploadId -> { key, state: open | completed | aborted, parts, metadata, dir }
    fs.mkdirSync(path.join(dir, "objects"), { recursive: true });
    fs.mkdirSync(path.join(dir, "uploads"), { recursive: true });
  }
  file(key) {
    return path.join(this.dir, "objects", createHash("sha256").update(key).digest("hex"));
  }
  check(op, writes) {
    if (knobs.r2Fault === "gone") throw r2Errors.noSuchBucket(op);
    if (writes && knobs.r2Fault === "full") throw r2Errors.full(op);
  }
  // Make the file at `tmp` the object `key` (an atomic rename: a reader sees the old object or the new one).
  store(key, tmp, { httpMetadata, customMetadata, etag, md5 }) {
    const file = this.file(key);
    fs.renameSync(tmp, file);
    const meta = {
      key, version: randomBytes(16).toString("hex"), size: fs.statSync(file).size, etag, md5, uploaded: Date.now(),
      httpMetadata, customMetadata,
    };
    this.objects.set(key, meta);
    return meta;
  }
  async head(key) {
    this.check("head", false);
    record("r2.head", null, { key });
    const meta = this.objects.get(r2Key("head", key));
    return meta ? new R2Object(meta) : null;
  }
  async get(key, options) {
    this.check("get", false);
    record("r2.get", null, { key });
    r2Options("get", options, []); // onlyIf, range, ssecKey: nothing here uses them
    const meta = this.objects.get(r2Key("get", key));
    if (!meta) return null;
    let flipped = !knobs.r2CorruptReads;
    const body = Readable.toWeb(fs.createReadStream(this.file(key))).pipeThrough(new TransformStream({
      transform(chunk, controller) {
        const bytes = new Uint8Array(chunk);
        if (!flipped && bytes.length) {
          bytes[bytes.length >> 1] ^= 0x01; // a disk that went bad under R2
          flipped = true;
        }
        controller.enqueue(bytes);
      },
    }));
    knownLengths.set(body, meta.size);
    return new R2ObjectBody(meta, body);
  }
  async put(key, value, options) {
    this.check("put", true);
    const o = r2Options("put", options, ["httpMetadata", "customMetadata", "md5", "sha1", "sha256", "onlyIf",
      "storageClass", "ssecKey"]);
    record("r2.put", null, { key, length: lengthOf(value) });
    r2Key("put", key);
    for (const k of ["md5", "sha1", "sha256", "onlyIf", "storageClass", "ssecKey"]) {
      if (o[k] !== undefined) throw new TypeError(`put(): harness: option ${k} is not implemented`);
    }
    const metadata = r2Metadata("put", o);
    const bytes = await r2Value("put", value);
    if (bytes.length > R2_MAX_PUT_BYTES) throw r2Errors.entityTooLarge("put");
    this.check("put", true);
    const tmp = path.join(this.dir, `put-${randomBytes(8).toString("hex")}`);
    fs.writeFileSync(tmp, bytes);
    const md5 = createHash("md5").update(bytes).digest("hex");
    return new R2Object(this.store(key, tmp, { ...metadata, etag: md5, md5 }));
  }
  async delete(keys) {
    this.check("delete", false);
    const list = typeof keys === "string" ? [keys] : Array.isArray(keys) ? keys : null;
    record("r2.delete", null, { keys: list });
    if (!list) throw new TypeError("delete(): keys must be a string or an array of strings");
    if (list.length > 1000) throw r2Errors.invalidArgument("delete", "at most 1000 keys");
    for (const key of list) {
      r2Key("delete", key);
      if (this.objects.delete(key)) fs.rmSync(this.file(key), { force: true });
    }
  }
  async list(options) {
    const op = "list";
    this.check(op, false);
    const o = r2Options(op, options, ["limit", "prefix", "cursor", "delimiter", "startAfter", "include"]);
    record("r2.list", null, { prefix: o.prefix ?? null, cursor: o.cursor ?? null, limit: o.limit ?? null });
    const limit = o.limit ?? R2_MAX_LIST;
    if (!Number.isInteger(limit) || limit < 1 || limit > R2_MAX_LIST) throw r2Errors.invalidMaxKeys(op);
    const include = o.include ?? [];
    if (!Array.isArray(include) || include.some((i) => !["httpMetadata", "customMetadata"].includes(i))) {
      throw new TypeError("list(): include is a list of \"httpMetadata\" and \"customMetadata\"");
    }
    const prefix = o.prefix ?? "";
    let after = o.startAfter ?? null;
    if (o.cursor !== undefined) {
      const decoded = Buffer.from(String(o.cursor), "base64url").toString();
      if (!decoded.startsWith("c:")) throw r2Errors.invalidArgument(op, "cursor");
      after = decoded.slice(2);
    }
    const page = Math.min(limit, knobs.r2ListPage ?? R2_MAX_LIST);
    const keys = [...this.objects.keys()].filter((k) => k.startsWith(prefix) && (after === null || k > after)).sort();
    const objects = [];
    const delimitedPrefixes = [];
    let last = null;
    let i = 0;
    for (; i < keys.length && objects.length + delimitedPrefixes.length < page; i++) {
      const key = keys[i];
      last = key;
      const cut = o.delimiter ? key.indexOf(o.delimiter, prefix.length) : -1;
      if (cut >= 0) {
        const group = key.slice(0, cut + o.delimiter.length);
        if (!delimitedPrefixes.includes(group)) delimitedPrefixes.push(group);
        continue;
      }
      const object = new R2Object(this.objects.get(key));
      if (!include.includes("httpMetadata")) object.httpMetadata = undefined;
      if (!include.includes("customMetadata")) object.customMetadata = undefined;
      objects.push(object);
    }
    const truncated = i < keys.length;
    const result = { objects, truncated, delimitedPrefixes };
    if (truncated) result.cursor = Buffer.from(`c:${last}`).toString("base64url");
    return result;
  }
  async createMultipartUpload(key, options) {
    const op = "createMultipartUpload";
    this.check(op, true);
    const o = r2Options(op, options, ["httpMetadata", "customMetadata", "storageClass", "ssecKey"]);
    record("r2.createMultipartUpload", null, { key });
    r2Key(op, key);
    const uploadId = randomBytes(24).toString("base64url");
    const dir = path.join(this.dir, "uploads", uploadId);
    fs.mkdirSync(dir, { recursive: true });
    this.uploads.set(uploadId, { key, state: "open", parts: new Map(), metadata: r2Metadata(op, o), dir });
    return new R2MultipartUpload(this, key, uploadId);
  }
  resumeMultipartUpload(key, uploadId) {
    record("r2.resumeMultipartUpload", null, { key, uploadId });
    return new R2MultipartUpload(this, String(key), String(uploadId)); // no check, as on R2: its calls fail later
  }
}

const backups = new R2Bucket(path.join(STATE, "r2"));

// The fake's own rules, each case run against a scratch bucket: its error message, or "ok" (GET /__harness/r2probe).
async function r2Probe() {
  const scratch = path.join(STATE, `r2probe-${randomBytes(4).toString("hex")}`);
  const bucket = new R2Bucket(scratch);
  const MiB = 1024 * 1024;
  const bytes = (n) => new Uint8Array(n);
  const unknownLength = () => new Response(bytes(10)).body; // a stream the code made: no known length
  const knownLength = () => {
    const fixed = new FixedLengthStream(10);
    const w = fixed.writable.getWriter();
    w.write(bytes(10)).then(() => w.close());
    return fixed.readable;
  };
  const parts = async (key, sizes) => {
    const upload = await bucket.createMultipartUpload(key);
    const done = [];
    for (const [i, n] of sizes.entries()) done.push(await upload.uploadPart(i + 1, bytes(n)));
    return { upload, done };
  };
  const cases = {
    putUnknownLengthStream: async () => bucket.put("p/a", unknownLength()),
    putKnownLengthStream: async () => bucket.put("p/b", knownLength()),
    putCustomMetadataNotString: async () => bucket.put("p/c", "x", { customMetadata: { size: 3 } }),
    putUnknownOption: async () => bucket.put("p/d", "x", { customMetdata: {} }),
    uploadPartUnknownLengthStream: async () => {
      const upload = await bucket.createMultipartUpload("m/a");
      await upload.uploadPart(1, unknownLength());
    },
    uploadPartBadNumber: async () => (await bucket.createMultipartUpload("m/b")).uploadPart(0, bytes(1)),
    completeOnePartAnySize: async () => {
      const { upload, done } = await parts("m/c", [3]);
      await upload.complete(done);
    },
    completeSmallFirstPart: async () => {
      const { upload, done } = await parts("m/d", [4 * MiB, 1]);
      await upload.complete(done);
    },
    completeUnequalParts: async () => {
      const { upload, done } = await parts("m/e", [5 * MiB, 6 * MiB, 1]);
      await upload.complete(done);
    },
    completeLastPartLarger: async () => {
      const { upload, done } = await parts("m/f", [5 * MiB, 6 * MiB]);
      await upload.complete(done);
    },
    completeEqualParts: async () => {
      const { upload, done } = await parts("m/g", [5 * MiB, 5 * MiB, 2 * MiB]);
      const object = await upload.complete(done);
      if (object.size !== 12 * MiB || !object.etag.endsWith("-3")) throw new Error(`bad object ${object.size}`);
    },
    completeWrongEtag: async () => {
      const { upload, done } = await parts("m/h", [1]);
      await upload.complete([{ partNumber: 1, etag: "0".repeat(32) }]);
    },
    completeNoParts: async () => (await bucket.createMultipartUpload("m/i")).complete([]),
    completeTwice: async () => {
      const { upload, done } = await parts("m/j", [1]);
      await upload.complete(done);
      await upload.complete(done);
    },
    uploadPartAfterAbort: async () => {
      const upload = await bucket.createMultipartUpload("m/k");
      await upload.abort();
      await upload.uploadPart(1, bytes(1));
    },
    resumeUnknownUploadId: async () => bucket.resumeMultipartUpload("m/l", "no-such-upload").uploadPart(1, bytes(1)),
    resumeOtherKey: async () => {
      const upload = await bucket.createMultipartUpload("m/m");
      await bucket.resumeMultipartUpload("m/other", upload.uploadId).uploadPart(1, bytes(1));
    },
    resumeAndComplete: async () => {
      const upload = await bucket.createMultipartUpload("m/n");
      const part = await upload.uploadPart(1, bytes(7));
      const object = await bucket.resumeMultipartUpload("m/n", upload.uploadId).complete([part]);
      if (object.size !== 7) throw new Error(`bad size ${object.size}`);
    },
    abortUnknownUpload: async () => bucket.resumeMultipartUpload("m/o", "no-such-upload").abort(),
    listLimitZero: async () => bucket.list({ limit: 0 }),
    listLimitTooLarge: async () => bucket.list({ limit: 1001 }),
    listPages: async () => {
      for (const k of ["l/1", "l/2", "l/3", "l/4", "l/5", "other/1"]) await bucket.put(k, k, { customMetadata: { k } });
      const seen = [];
      let cursor;
      let pages = 0;
      for (;;) {
        const page = await bucket.list({ prefix: "l/", limit: 2, cursor, include: ["customMetadata"] });
        pages++;
        seen.push(...page.objects.map((o) => `${o.key}=${o.customMetadata.k}`));
        if (!page.truncated) {
          if (page.cursor !== undefined) throw new Error("a last page has no cursor");
          break;
        }
        cursor = page.cursor;
      }
      if (pages !== 3 || seen.join(",") !== "l/1=l/1,l/2=l/2,l/3=l/3,l/4=l/4,l/5=l/5") throw new Error(seen.join());
      const bare = await bucket.list({ prefix: "l/", limit: 1 });
      if (bare.objects[0].customMetadata !== undefined) throw new Error("metadata without include");
    },
    getMissing: async () => {
      if ((await bucket.get("nothing/here")) !== null || (await bucket.head("nothing/here")) !== null) {
        throw new Error("a missing object is not null");
      }
    },
    getKnownLength: async () => {
      await bucket.put("g/a", "hello");
      const object = await bucket.get("g/a");
      if (lengthOf(object.body) !== 5 || (await object.text()) !== "hello") throw new Error("bad body");
    },
  };
  const results = {};
  for (const [name, run] of Object.entries(cases)) {
    try {
      await run();
      results[name] = "ok";
    } catch (err) {
      results[name] = String(err.message ?? err);
    }
  }
  fs.rmSync(scratch, { recursive: true, force: true });
  return results;
}

const namespace = new DurableObjectNamespace(CLASSES.WORKSPACE);
const directories = new DurableObjectNamespace(CLASSES.DIRECTORY);
const env = { ...VARS, WORKSPACE: namespace, DIRECTORY: directories };
// read when an object is constructed: knob backupsBinding false makes it absent, as without r2_buckets
Object.defineProperty(env, "BACKUPS", { get: () => (knobs.backupsBinding ? backups : undefined), enumerable: true });

// ---------------------------------------------------------------------------------------------------------------
// Python: Pyodide with src/ and the vendored SDK mounted, plus the two modules workerd injects (pyodide_boot.mjs).

const py = await bootPython(ROOT, env);
py.runPython(`
import logging
logging.basicConfig(level=logging.INFO, format="py %(name)s %(levelname)s %(message)s")
`);
// The WebCrypto cipher on its own (POST /__harness/cipher), so tests can hold it against the standalone one.
py.runPython(`
import base64, json
from cloudflare.cipher import WebCryptoCipher

async def harness_cipher(raw):
    args = json.loads(raw)
    cipher = WebCryptoCipher(args["key"])
    if not cipher.available:
        return json.dumps({"available": False})
    run = cipher.seal if args["op"] == "seal" else cipher.open
    try:
        out = await run(base64.b64decode(args["data"]), base64.b64decode(args["aad"]))
    except ValueError as err:
        return json.dumps({"available": True, "error": str(err)})
    return json.dumps({"available": True, "data": base64.b64encode(out).decode()})
`);
// The R2 backup store on its own (POST|GET /__harness/backups), over env.BACKUPS as the SDK hands it to an object.
py.runPython(`
import json
from pyodide.ffi import to_js
from workers.rpc import _EnvWrapper
from cloudflare.backups import R2BackupStore
from durable.ports import ContainerGone
from protocol.errors import ProtocolError

async def harness_backups(raw, body, env):
    args = json.loads(raw)
    store = R2BackupStore(getattr(_EnvWrapper(env), "BACKUPS", None))
    op, ns, ws, bid = args["op"], args.get("ns"), args.get("ws"), args.get("id")
    try:
        if op == "available":
            return json.dumps({"available": store.available})
        if op == "write":
            info = await store.write(ns, ws, bid, body, int(args["at"]))
            return json.dumps({"info": info.__dict__})
        if op == "list":
            return json.dumps({"backups": [b.__dict__ for b in await store.list(ns, ws)]})
        if op == "open":
            info, stream = await store.open(ns, ws, bid)
            return to_js([json.dumps({"info": info.__dict__}), stream])
        if op == "delete":
            await store.delete(ns, ws, bid)
            return json.dumps({"deleted": True})
        return json.dumps({"error": {"code": "harness", "message": f"unknown op {op}"}})
    except ProtocolError as err:
        return json.dumps({"error": {"code": err.code, "message": err.message}})
    except ContainerGone as err:
        return json.dumps({"error": {"code": "container_gone", "message": str(err)}})
`);
const python = {
  entry: py.pyimport("entry"),
  Request: py.pyimport("workers").Request,
  cipher: py.globals.get("harness_cipher"),
  backups: py.globals.get("harness_backups"),
};

// ---------------------------------------------------------------------------------------------------------------
// HTTP: the Worker's fetch for everything, except the harness's own test routes.

async function admin(url, req) {
  const name = url.searchParams.get("object");
  // ?binding=DIRECTORY addresses a directory object (evict); the default is a workspace object
  const objects = url.searchParams.get("binding") === "DIRECTORY" ? directories : namespace;
  const json = (obj, status = 200) => new Response(JSON.stringify(obj), { status, headers: { "content-type": "application/json" } });
  if (url.pathname === "/__harness/calls") return json(calls);
  if (url.pathname === "/__harness/knobs") {
    const values = JSON.parse(await new Response(Readable.toWeb(req)).text() || "{}");
    if ("proxyHeadSeconds" in values) {
      // protocol.limits.PROXY_HEAD_SECONDS inside Pyodide (read at each proxied request): 60 s is long for a test
      py.runPython(`import protocol.limits; protocol.limits.PROXY_HEAD_SECONDS = ${Number(values.proxyHeadSeconds)}`);
    }
    if ("silenceSeconds" in values) {
      // cloudflare.streams.SILENCE_SECONDS (read at each use): 3 heartbeats, 30 s, is long for a test; null puts
      // the glue's own value back
      const value = values.silenceSeconds === null ? "s._harness_default" : Number(values.silenceSeconds);
      py.runPython(`import cloudflare.streams as s
s.__dict__.setdefault("_harness_default", s.SILENCE_SECONDS)
s.SILENCE_SECONDS = ${value}`);
    }
    Object.assign(knobs, values);
    return json(knobs);
  }
  if (url.pathname === "/__harness/cipher") {
    // { op: "seal" | "open", key: SECRETS_KEY's text, data, aad (base64) } -> { available, data | error }
    const raw = await new Response(Readable.toWeb(req)).text();
    return new Response(await python.cipher(raw), { headers: { "content-type": "application/json" } });
  }
  if (url.pathname === "/__harness/backups") {
    // ?op=available|write|list|open|delete&ns=&ws=&id=&at= : cloudflare.backups.R2BackupStore over env.BACKUPS.
    // write hands it the request body as a stream of unknown length in 64 KiB chunks, like an export
    // (breakAfter=N: a stream of N zero bytes that then fails, as when the container stops mid-export); the body is
    // read whole first, so a store that stops reading early never stalls the test's upload. open answers the
    // archive's stream, its info in x-backup-info.
    const args = Object.fromEntries(url.searchParams);
    let body = null;
    if (args.op === "write") {
      const data = args.breakAfter === undefined
        ? Buffer.from(await new Response(Readable.toWeb(req)).arrayBuffer())
        : Buffer.alloc(Number(args.breakAfter));
      let offset = 0;
      body = new ReadableStream({
        pull(controller) {
          if (offset >= data.length) {
            if (args.breakAfter === undefined) controller.close();
            else controller.error(new Error("Network connection lost. (harness: breakAfter)"));
            return;
          }
          controller.enqueue(new Uint8Array(data.subarray(offset, offset + 65536)));
          offset += 65536;
        },
      });
    }
    const answer = await python.backups(JSON.stringify(args), body, env);
    if (typeof answer === "string") return json(JSON.parse(answer));
    const [info, stream] = answer;
    return new Response(stream, { headers: { "content-type": "application/zstd", "x-backup-info": info } });
  }
  if (url.pathname === "/__harness/r2") {
    const key = url.searchParams.get("delete");
    if (key !== null) {
      record("harness.r2.delete", null, { key });
      if (backups.objects.delete(key)) fs.rmSync(backups.file(key), { force: true });
    }
    return json({
      objects: [...backups.objects.values()].map((m) => ({ key: m.key, size: m.size, file: backups.file(m.key) })),
      uploads: [...backups.uploads.entries()].map(([id, u]) => ({ uploadId: id, key: u.key, state: u.state })),
    });
  }
  if (url.pathname === "/__harness/r2probe") return json(await r2Probe());
  if (url.pathname === "/__harness/wsprobe") return json(await wsProbe());
  if (url.pathname === "/__harness/advance") {
    // Move time forward and deliver every alarm that is now due, answering once their handlers finished.
    // Idle objects are evicted first, as time passing would have (a due alarm then wakes a fresh instance).
    clockOffsetMs += Number(url.searchParams.get("ms"));
    for (const o of namespace.objects.values()) {
      if (o.evictable(Date.now())) {
        const watched = o.monitorSince !== null && o.container?.running;
        o.reset(watched ? "monitor keep-alive ended" : "idle", "harness: this object instance was evicted");
      }
    }
    const pending = [...namespace.objects.values()].filter((o) => o.alarmAt !== null);
    const due = pending.filter((o) => o.alarmAt <= Date.now());
    for (const o of pending) if (!due.includes(o)) o.armAlarm(o.alarmAt, o.alarmRetry); // their timers, on the new clock
    const results = await Promise.all(due.map(async (o) => [o.name, await o.fireAlarm()]));
    return json({ fired: Object.fromEntries(results) });
  }
  if (url.pathname === "/__harness/platform") {
    // the rules this harness keeps, for tests to hold against the platform's declarations
    return json({
      startOptions: START_OPTIONS, instanceTypes: [...INSTANCE_TYPES], snapshotRestoreFields: SNAPSHOT_RESTORE_FIELDS,
      alarmMaxRetries: ALARM_MAX_RETRIES, alarmFirstBackoffMs: ALARM_FIRST_BACKOFF_MS,
      monitorKeepaliveMs: MONITOR_KEEPALIVE_MS, idleEvictionMs: IDLE_EVICTION_MS, deployGraceMs: DEPLOY_GRACE_MS,
      planBodyBytes: PLAN_BODY_BYTES, webSocketMaxMessageBytes: WS_MAX_MESSAGE_BYTES,
      silenceSeconds: py.runPython("import cloudflare.streams as s; s.SILENCE_SECONDS"), // the glue's, as it is now
    });
  }
  if (url.pathname === "/__harness/deploy") {
    // A new version of the Worker: each object instance running now is reset graceMs later (DEPLOY_GRACE_MS by
    // default), cutting what it still has in flight; the next request constructs the new version's instance.
    const grace = Number(url.searchParams.get("graceMs") ?? DEPLOY_GRACE_MS);
    const running = [...namespace.objects.values(), ...directories.objects.values()].filter((o) => o.instance);
    const generations = new Map(running.map((o) => [o, o.generation]));
    record("harness.deploy", null, { graceMs: grace, objects: running.map((o) => o.name) });
    setTimeout(() => {
      for (const [o, generation] of generations) if (o.generation === generation) o.reset("deploy", RESET_BY_DEPLOY);
    }, grace);
    return json({ deployed: true, objects: running.map((o) => o.name) });
  }
  const object = name && objects.objects.get(name);
  if (!object) return json({ error: "unknown object" }, 404);
  if (url.pathname === "/__harness/evict") {
    object.reset("evicted by the test", "harness: this object instance was evicted");
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
  if (url.pathname === "/__harness/freeze" || url.pathname === "/__harness/thaw") {
    return json({ frozen: object.container.freeze(url.pathname === "/__harness/freeze") });
  }
  if (url.pathname === "/__harness/container") {
    const { running, state, inflight, frozen } = object.container;
    // inflight: getTcpPort fetches not done; object: the object's own state
    const { instance, generation, monitorSince } = object;
    return json({
      running, state, inflight, frozen: Boolean(frozen), alarmAt: object.alarmAt,
      object: { constructed: instance !== null, generation, inflight: object.inflight, monitorSince },
    });
  }
  return json({ error: "unknown harness route" }, 404);
}

// A chunked request body is cut (the Worker's read fails) once more than `limit` bytes came.
function atMost(limit) {
  let seen = 0;
  return new TransformStream({
    transform(chunk, controller) {
      seen += chunk.byteLength;
      if (seen > limit) throw new Error(`the request body is over the plan's ${limit}-byte limit`);
      controller.enqueue(chunk);
    },
  });
}

// The Worker's view of a client's request headers: as sent, CF-Connecting-IP set (as Cloudflare: the client's,
// replacing a sent one).
function clientHeaders(req) {
  const headers = new Headers();
  for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
  headers.set("cf-connecting-ip", req.socket.remoteAddress);
  return headers;
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
      // Cloudflare's front line: a body over the plan's limit is refused (413, Cloudflare's own page) before the
      // Worker runs; one of unknown length (chunked) fails once past the limit.
      const declared = req.headers["transfer-encoding"] === undefined && req.headers["content-length"] !== undefined
        ? Number(req.headers["content-length"]) : null;
      if (declared !== null && declared > knobs.planBodyBytes) {
        record("harness.bodyTooLarge", null, { declared, limit: knobs.planBodyBytes });
        res.writeHead(413, { "content-type": "text/html", connection: "close" });
        res.end("<html><head><title>413 Request Entity Too Large</title></head><body>cloudflare</body></html>");
        return;
      }
      const headers = clientHeaders(req);
      const hasBody = !["GET", "HEAD"].includes(req.method);
      let body = hasBody ? Readable.toWeb(req) : undefined;
      if (hasBody && declared === null) body = body.pipeThrough(atMost(knobs.planBodyBytes));
      const request = new Request(`http://${req.headers.host ?? "127.0.0.1"}${req.url}`, {
        method: req.method,
        headers,
        body,
        duplex: hasBody ? "half" : undefined,
      });
      // the client's Content-Length gives the body a known length (unless a test says otherwise: bodyLengthKnown)
      if (hasBody && declared !== null && knobs.bodyLengthKnown) keepLength(declared, request);
      record("worker.fetch", null, { method: req.method, path: url.pathname, bodyLength: lengthOf(request.body) });
      response = await worker(request);
    }
  } catch (err) {
    console.error("harness: the Worker threw:", err);
    response = new Response("internal error", { status: 500 });
  }
  if (response.webSocket) { // only an upgrade request may be answered with a socket (this one has no Upgrade)
    console.error("harness: the Worker threw: TypeError: Worker tried to return a WebSocket in a response to a request "
      + "which did not contain the header \"Upgrade: websocket\".");
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
      // the client's pace: a client that does not read holds the response back (backpressure), as on Cloudflare
      if (!res.write(value)) await new Promise((resolve) => res.once("drain", resolve).once("close", resolve));
    }
    res.end();
  } catch (err) {
    res.destroy(err);
  }
});

// A client's upgrade request (see "WebSockets" above): the Worker answers it like any request. Its 101 with a
// webSocket completes the handshake, with the Worker's Sec-WebSocket-Protocol (the ws package checks that the client
// offered it) and its other headers; any other answer is written as plain HTTP and the connection closed.
const clientSockets = new WebSocketServer({
  noServer: true,
  perMessageDeflate: false,
  maxPayload: WS_MAX_MESSAGE_BYTES,
  handleProtocols: (_offered, req) => req.flareboxProtocol ?? false,
});
clientSockets.on("headers", (lines, req) => lines.push(...(req.flareboxHeaders ?? [])));
const HANDSHAKE_HEADERS = ["sec-websocket-protocol", "sec-websocket-accept", "sec-websocket-extensions", "upgrade",
  "connection", "content-length", "transfer-encoding"];

server.on("upgrade", async (req, socket, head) => {
  socket.on("error", () => {}); // a client that left; its close is all there is to it
  const url = new URL(req.url, "http://127.0.0.1");
  const headers = clientHeaders(req);
  let response;
  try {
    if (url.pathname.startsWith("/__harness/")) {
      response = new Response(JSON.stringify({ error: "harness routes take no upgrade" }), { status: 400 });
    } else {
      const request = new Request(`http://${req.headers.host ?? "127.0.0.1"}${req.url}`, { method: req.method, headers });
      record("worker.fetch", null, { method: req.method, path: url.pathname, bodyLength: 0, upgrade: isUpgrade(headers) });
      response = await worker(request);
    }
    const end = response.webSocket;
    if (end) {
      if (!isUpgrade(headers)) {
        throw new TypeError("Worker tried to return a WebSocket in a response to a request which did not contain the "
          + "header \"Upgrade: websocket\".");
      }
      if (end.accepted) throw new TypeError("Can't return WebSocket in a Response after calling accept().");
      if (end.coupled) throw new TypeError("Can't return WebSocket that was already used in a response.");
      req.flareboxProtocol = response.headers.get("sec-websocket-protocol") ?? undefined;
      req.flareboxHeaders = [...response.headers].filter(([k]) => !HANDSHAKE_HEADERS.includes(k)).map(([k, v]) => `${k}: ${v}`);
      clientSockets.handleUpgrade(req, socket, head, (conn) => {
        record("worker.websocket", null, {
          path: url.pathname, protocol: conn.protocol || null, offered: req.headers["sec-websocket-protocol"] ?? null,
        });
        coupleNetwork(end, conn, (code) => record("worker.websocket.closed", null, { path: url.pathname, code }));
      });
      return;
    }
  } catch (err) {
    console.error("harness: the Worker threw:", err);
    response = new Response("internal error", { status: 500 });
  }
  let body;
  try {
    body = response.body ? Buffer.from(await response.arrayBuffer()) : Buffer.alloc(0);
  } catch {
    socket.destroy(); // the answer broke off
    return;
  }
  record("worker.upgradeRefused", null, { path: url.pathname, status: response.status });
  const lines = [`HTTP/1.1 ${response.status} ${http.STATUS_CODES[response.status] ?? ""}`];
  for (const [k, v] of response.headers) if (!HANDSHAKE_HEADERS.includes(k)) lines.push(`${k}: ${v}`);
  lines.push(`content-length: ${body.length}`, "connection: close", "", "");
  socket.end(Buffer.concat([Buffer.from(lines.join("\r\n")), body]));
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
