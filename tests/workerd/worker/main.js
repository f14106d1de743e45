// A small JS Worker + Durable Object for tests/workerd/test_stream_patterns.py: the stream patterns the Python glue
// (src/cloudflare/streams.py, container.py, entry.py) relies on, run on the real workerd. Each route answers with
// what it observed, so the test asserts on the runtime's behaviour, not on this file's.
//
//   /do/<name>/boot?id=X         (1) a shared boot, started by the first request, writes every waiter's stream
//   /do/<name>/alarm             (2) the alarm handler writes and closes the stream this request returned
//   /do/<name>/pipe              (3) status lines, then an upstream body piped into the TransformStream's writable
//   /do/<name>/fixed?n=N         (4) the request body (unknown length) through FixedLengthStream(N) to the upstream
//   /do/<name>/passthrough       (5) the request body forwarded to the upstream as is, with an explicit
//                                    content-length header when x-declared-length is given
//   /stateless/boot?round=R&id=X control for (1): the same shared boot across two requests of a stateless Worker,
//                                    where each request has its own I/O context (workerd refuses the second
//                                    request's use of the boot's I/O object there)
import { DurableObject } from "cloudflare:workers";

const enc = (text) => new TextEncoder().encode(text);

// Like cloudflare/streams.py's JsSink: the readable side buffers 64 chunks, so lines written before the client
// reads never block the writer.
function sink() {
  return new TransformStream(undefined, { highWaterMark: 1 }, { highWaterMark: 64 });
}

function textResponse(readable) {
  return new Response(readable, { headers: { "content-type": "text/plain" } });
}

// One boot shared by the waiters that join before it finishes. It waits (up to 2 s) for a second waiter, so it
// provably writes the stream of a request that did not start it. Returns the id of the request that started it.
async function runBoot(state, startedBy, upstream) {
  await Promise.race([state.joined.promise, scheduler.wait(2000)]);
  // the boot's own I/O, which a waiter that did not start the boot reads (the glue: the container start)
  state.health = await fetch(`${upstream}/stream?chunks=2`);
  for (const phase of ["booting", "ready"]) {
    for (const w of state.waiters) {
      try {
        await w.writer.write(enc(`${w.id}: ${phase} (boot started by ${startedBy})\n`));
      } catch (err) {
        state.errors.push(`${w.id}: ${err}`);
      }
    }
    await scheduler.wait(20);
  }
  return startedBy;
}

function newBootState() {
  return { waiters: [], boot: null, boots: 0, errors: [], joined: Promise.withResolvers() };
}

// The request's own continuation (like the glue's exec relay): await the shared boot, use the I/O object the boot
// made (a response body read by a request that did not make it), then write and close.
async function afterBoot(state, id, writer) {
  const lines = [];
  try {
    const by = await Promise.race([state.boot, scheduler.wait(3000).then(() => "nobody (timed out)")]);
    lines.push(`${id}: continued after the boot by ${by}; boots=${state.boots}`);
    if (id !== by) lines.push(`${id}: read the boot's upstream body: ${JSON.stringify(await state.health.text())}`);
  } catch (err) {
    lines.push(`${id}: failed after the boot: ${err}`);
  }
  for (const e of state.errors) lines.push(`${id}: boot error ${e}`);
  try {
    for (const line of lines) await writer.write(enc(`${line}\n`));
    await writer.close();
  } catch {
    // this request's own stream refused the write: nothing left to report on
  }
}

function joinBoot(state, id, waitUntil, upstream) {
  const { readable, writable } = sink();
  const writer = writable.getWriter();
  state.waiters.push({ id, writer });
  if (state.waiters.length >= 2) state.joined.resolve();
  if (state.boot === null) {
    state.boots += 1;
    state.boot = runBoot(state, id, upstream);
  }
  waitUntil(afterBoot(state, id, writer));
  return textResponse(readable);
}

export class Patterns extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.bootState = newBootState();
    this.alarmWriter = null;
    this.alarms = 0;
  }

  async fetch(request) {
    const url = new URL(request.url);
    const op = url.pathname.split("/")[3];
    if (op === "boot") {
      const waitUntil = (p) => this.ctx.waitUntil(p);
      return joinBoot(this.bootState, url.searchParams.get("id"), waitUntil, this.env.UPSTREAM);
    }
    if (op === "alarm") return this.alarmStream();
    if (op === "pipe") return this.pipe();
    if (op === "fixed") return this.fixedLength(request, Number(url.searchParams.get("n")));
    if (op === "passthrough") return this.passThrough(request);
    return new Response("no such route", { status: 404 });
  }

  async alarmStream() {
    const { readable, writable } = sink();
    this.alarmWriter = writable.getWriter();
    this.alarmWriter.write(enc("request: alarm set\n"));
    await this.ctx.storage.setAlarm(Date.now() + 200);
    return textResponse(readable);
  }

  async alarm() {
    this.alarms += 1;
    const writer = this.alarmWriter;
    this.alarmWriter = null;
    if (writer === null) return;
    await writer.write(enc(`alarm ${this.alarms}: written by the alarm handler\n`));
    await writer.close();
  }

  pipe() {
    const out = sink();
    const relay = async () => {
      let writer = out.writable.getWriter();
      await writer.write(enc("status: starting\n"));
      const upstream = await fetch(`${this.env.UPSTREAM}/stream?chunks=5`);
      writer.releaseLock(); // pipeTo needs the writable unlocked
      await upstream.body.pipeTo(out.writable, { preventClose: true, preventAbort: true });
      writer = out.writable.getWriter();
      await writer.write(enc("status: piped\n"));
      await writer.close();
    };
    this.ctx.waitUntil(relay());
    return textResponse(out.readable);
  }

  async fixedLength(request, n) {
    const { readable, writable } = new FixedLengthStream(n);
    const piping = request.body.pipeTo(writable).then(
      () => "ok",
      (err) => `${err}`,
    );
    let upstream;
    try {
      const resp = await fetch(`${this.env.UPSTREAM}/record`, { method: "PUT", body: readable });
      upstream = await resp.json();
    } catch (err) {
      upstream = { error: `${err}` };
    }
    const objectSawContentLength = request.headers.get("content-length");
    return Response.json({ upstream, pipe: await piping, objectSawContentLength });
  }

  async passThrough(request) {
    const headers = {};
    const declared = request.headers.get("x-declared-length");
    if (declared !== null) headers["content-length"] = declared;
    const seen = request.headers.get("content-length");
    try {
      const resp = await fetch(`${this.env.UPSTREAM}/record`, { method: "PUT", headers, body: request.body });
      return Response.json({ upstream: await resp.json(), objectSawContentLength: seen });
    } catch (err) {
      return Response.json({ error: `${err}`, objectSawContentLength: seen });
    }
  }
}

// module state, shared by every request of the stateless Worker; one boot per `round` (a fresh one per test)
const statelessRounds = new Map();

export default {
  async fetch(request, env, ctx) {
    const url = new URL(request.url);
    const parts = url.pathname.split("/");
    if (url.pathname === "/health") return new Response("ok");
    if (parts[1] === "do") return env.PATTERNS.get(env.PATTERNS.idFromName(parts[2])).fetch(request);
    if (url.pathname === "/stateless/boot") {
      const round = url.searchParams.get("round");
      if (!statelessRounds.has(round)) statelessRounds.set(round, newBootState());
      return joinBoot(statelessRounds.get(round), url.searchParams.get("id"), (p) => ctx.waitUntil(p), env.UPSTREAM);
    }
    return new Response("no such route", { status: 404 });
  },
};
