// Starts real drover servers for the tests: the binary from $DROVER_BIN, or
// built once from this repository (go build ./cmd/drover), on free loopback
// ports; ready when GET /readyz answers 200.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, existsSync, rmSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import net from "node:net";
import https from "node:https";
import { randomBytes } from "node:crypto";

const here = dirname(fileURLToPath(import.meta.url));
export const jsRoot = resolve(here, "..", "..");
export const repoRoot = resolve(jsRoot, "..", "..");

/** A name unique to this run: for namespaces, queues, locks, threads. */
export function uniq(prefix = "t") {
  return `${prefix}-${Date.now().toString(36)}-${randomBytes(4).toString("hex")}`;
}

/** A free loopback TCP port. */
export function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

let built;
/** The drover binary: $DROVER_BIN, else built once into a temporary directory. */
export function droverBin() {
  if (process.env.DROVER_BIN) return process.env.DROVER_BIN;
  if (built) return built;
  const dir = mkdtempSync(join(tmpdir(), "drover-bin-"));
  const out = join(dir, "drover");
  const env = { ...process.env, PATH: `${process.env.PATH}:/usr/local/go/bin` };
  execFileSync("go", ["build", "-o", out, "./cmd/drover"], { cwd: repoRoot, env, stdio: ["ignore", "inherit", "inherit"], timeout: 600_000 });
  built = out;
  process.env.DROVER_BIN = out;
  // Removed when this process ends (child processes were given its path and are done by then).
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return out;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** GET /readyz's status (https without checking the certificate: this only asks whether it listens). */
function readyStatus(scheme, port) {
  if (scheme === "http") return fetch(`http://127.0.0.1:${port}/readyz`, { signal: AbortSignal.timeout(1000) }).then((r) => r.status);
  return new Promise((res, rej) => {
    const req = https.get({ host: "127.0.0.1", port, path: "/readyz", rejectUnauthorized: false, timeout: 1000 }, (r) => {
      r.resume();
      res(r.statusCode);
    });
    req.on("error", rej);
    req.on("timeout", () => req.destroy(new Error("timeout")));
  });
}

/**
 * Starts a drover server; resolves once /readyz answers 200 (at most 30 s).
 * extraArgs are added to `drover server` (e.g. --auth-file). Returns
 * { url, etcd, dataDir, proc, stop() }.
 */
export async function startServer({ extraArgs = [], scheme = "http", env = {} } = {}) {
  const bin = droverBin();
  const dataDir = mkdtempSync(join(tmpdir(), "drover-data-"));
  const [p1, p2, p3] = [await freePort(), await freePort(), await freePort()];
  const args = [
    "server",
    "--data-dir", dataDir,
    "--etcd-listen", `http://127.0.0.1:${p1}`,
    "--etcd-peer-listen", `http://127.0.0.1:${p2}`,
    "--http-listen", `127.0.0.1:${p3}`,
    ...extraArgs,
  ];
  const proc = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...env } });
  let log = "";
  proc.stderr.on("data", (d) => {
    log += d;
    if (log.length > 200_000) log = log.slice(-100_000);
  });
  const url = `${scheme}://127.0.0.1:${p3}`;
  const etcd = `127.0.0.1:${p1}`;
  let exited = false;
  proc.on("exit", () => (exited = true));
  const stop = async () => {
    if (!exited) {
      proc.kill("SIGTERM");
      for (let i = 0; i < 100 && !exited; i++) await sleep(50);
      if (!exited) proc.kill("SIGKILL");
    }
    rmSync(dataDir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (exited) throw new Error(`drover server exited before it was ready:\n${log.slice(-4000)}`);
    try {
      if ((await readyStatus(scheme, p3)) === 200) break;
    } catch {
      /* not listening yet */
    }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`drover server not ready within 30 s:\n${log.slice(-4000)}`);
    }
    await sleep(100);
  }
  return { url, etcd, dataDir, proc, stop, log: () => log };
}

let shared;
/**
 * The server the tests share: $DROVER_URL (started by test/run.mjs), else
 * one started for this test file. Call `release` at the end.
 */
export async function sharedServer() {
  if (process.env.DROVER_URL) {
    return { url: process.env.DROVER_URL, etcd: process.env.DROVER_ETCD, release: async () => {} };
  }
  if (!shared) shared = startServer();
  const s = await shared;
  return { url: s.url, etcd: s.etcd, release: s.stop };
}

/** Runs `drover ARGS` against the shared server's etcd (for settings the HTTP API has no route for). */
export function droverCli(etcd, args, namespace) {
  const full = [...args, "--etcd-endpoints", etcd, ...(namespace ? ["--namespace", namespace] : [])];
  return execFileSync(droverBin(), full, { encoding: "utf8", timeout: 30_000 });
}

export function ensureDir(p) {
  if (!existsSync(p)) mkdirSync(p, { recursive: true });
  return p;
}

/** promise, or a rejection with msg after ms (the timer does not outlive it). */
export async function withTimeout(promise, ms, msg) {
  let t;
  try {
    return await Promise.race([promise, new Promise((_, rej) => (t = setTimeout(() => rej(new Error(typeof msg === "function" ? msg() : msg)), ms)))]);
  } finally {
    clearTimeout(t);
  }
}

/**
 * Waits (at most ms) until cond() is truthy, and returns its value; what
 * (a string, or a function giving one) says what did not happen.
 */
export async function until(cond, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${typeof what === "function" ? what() : what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Starts an n-member drover cluster (`--name`, `--initial-cluster`), each
 * member serving the HTTP API on its own loopback port; resolves once
 * every member's /readyz answers 200 (at most 60 s). Returns { members,
 * leader(), stop() }: each member { name, url, etcd, proc, alive(),
 * kill(signal) }; leader() is the member etcd names its leader, as a
 * member that answers says.
 */
export async function startCluster(n = 3, { env = {} } = {}) {
  const bin = droverBin();
  const members = [];
  for (let i = 0; i < n; i++) {
    members.push({ name: `m${i + 1}`, dir: mkdtempSync(join(tmpdir(), "drover-data-")), ports: [await freePort(), await freePort(), await freePort()] });
  }
  const initial = members.map((m) => `${m.name}=http://127.0.0.1:${m.ports[1]}`).join(",");
  for (const m of members) {
    const args = [
      "server",
      "--name", m.name,
      "--initial-cluster", initial,
      "--data-dir", m.dir,
      "--etcd-listen", `http://127.0.0.1:${m.ports[0]}`,
      "--etcd-peer-listen", `http://127.0.0.1:${m.ports[1]}`,
      "--http-listen", `127.0.0.1:${m.ports[2]}`,
      "--log-level", "warn",
    ];
    m.url = `http://127.0.0.1:${m.ports[2]}`;
    m.etcd = `127.0.0.1:${m.ports[0]}`;
    m.log = "";
    m.exited = false;
    m.proc = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...env } });
    m.proc.stderr.on("data", (d) => {
      m.log += d;
      if (m.log.length > 200_000) m.log = m.log.slice(-100_000);
    });
    m.proc.on("exit", () => (m.exited = true));
    m.alive = () => !m.exited;
    m.kill = (signal = "SIGKILL") => m.proc.kill(signal);
  }
  const stop = async () => {
    for (const m of members) if (!m.exited) m.proc.kill("SIGKILL");
    for (const m of members) for (let i = 0; i < 100 && !m.exited; i++) await sleep(20);
    for (const m of members) rmSync(m.dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 60_000;
  for (const m of members) {
    for (;;) {
      if (m.exited) {
        await stop();
        throw new Error(`drover member ${m.name} exited before it was ready:\n${m.log.slice(-4000)}`);
      }
      const st = await readyStatus("http", m.ports[2]).catch(() => 0);
      if (st === 200) break;
      if (Date.now() > deadline) {
        await stop();
        throw new Error(`drover member ${m.name} not ready within 60 s:\n${m.log.slice(-4000)}`);
      }
      await sleep(100);
    }
  }
  /** The leading member, from etcd's status as an alive member answers it (etcd's JSON gateway). */
  const leader = async () => {
    for (const m of members.filter((x) => x.alive())) {
      try {
        const r = await fetch(`http://${m.etcd}/v3/maintenance/status`, { method: "POST", body: "{}", signal: AbortSignal.timeout(2000) });
        const st = await r.json();
        if (!st.leader) continue;
        for (const o of members.filter((x) => x.alive())) {
          const r2 = await fetch(`http://${o.etcd}/v3/maintenance/status`, { method: "POST", body: "{}", signal: AbortSignal.timeout(2000) });
          if ((await r2.json()).header?.member_id === st.leader) return o;
        }
      } catch {
        /* this member does not answer: ask another */
      }
    }
    return undefined;
  };
  return { members, leader, stop };
}

/**
 * A TCP balancer on a loopback port in front of several servers, as a
 * load balancer of a cluster: each connection goes to the next target
 * that accepts it (round robin), so a client with one URL fails over when
 * a member dies. Returns { url, port, close() }.
 */
export async function startBalancer(ports) {
  const conns = new Set();
  let next = 0;
  const connectAny = (tries, done) => {
    if (tries >= ports.length) return done(undefined);
    const port = ports[next++ % ports.length];
    const up = net.connect(port, "127.0.0.1");
    up.once("connect", () => done(up));
    up.once("error", () => {
      up.destroy();
      connectAny(tries + 1, done);
    });
  };
  const server = net.createServer((c) => {
    c.pause();
    conns.add(c);
    c.on("error", () => c.destroy()).on("close", () => conns.delete(c));
    connectAny(0, (up) => {
      if (!up) return c.destroy();
      conns.add(up);
      const drop = () => {
        c.destroy();
        up.destroy();
        conns.delete(up);
      };
      up.on("error", drop).on("close", drop);
      c.on("close", drop);
      c.pipe(up);
      up.pipe(c);
      c.resume();
    });
  });
  await new Promise((res, rej) => {
    server.once("error", rej);
    server.listen(0, "127.0.0.1", res);
  });
  const port = server.address().port;
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise((res) => {
        for (const s of conns) s.destroy();
        server.close(() => res());
      }),
  };
}
