// PaxosLocks, the client of `drover paxos serve`: how it reads endpoints,
// then the API and the failover rules against a real group of three
// `drover paxos serve` processes over the direct transport on loopback
// ports: nodes paused with SIGSTOP (one, then two), ending with the group's
// leader killed.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";
import {
  ConflictError,
  ConnectionError,
  FencedError,
  InvalidInputError,
  LockHeldError,
  NotFoundError,
  PaxosLockHeldError,
  PaxosLocks,
  PaxosNotHeldError,
  PaxosTimeoutError,
  PaxosUnreachableError,
  UnavailableError,
  parsePaxosEndpoint,
} from "../dist/index.js";
import { droverBin, freePort, uniq, until, withTimeout } from "./helpers/server.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------
// Endpoints.

const [A, B] = ["127.0.0.1:7901", "127.0.0.1:7902"];

test("endpoints: host:port means http://host:port, as the Go client's ParseEndpoint reads them", () => {
  assert.equal(parsePaxosEndpoint("127.0.0.1:7100"), "http://127.0.0.1:7100");
  assert.equal(parsePaxosEndpoint(" HTTPS://lock-0.svc:7443/ "), "https://lock-0.svc:7443");
  assert.equal(parsePaxosEndpoint("[::1]:7100"), "http://[::1]:7100");
  for (const bad of ["127.0.0.1", "ftp://h:1", "http://h:1/locks", "http://h:1?x=1", "h:70000", "", "http://:1"]) {
    assert.throws(() => parsePaxosEndpoint(bad), TypeError, bad);
  }
  assert.deepEqual(new PaxosLocks(`${A},http://${B}`).endpoints, [`http://${A}`, `http://${B}`]);
  assert.throws(() => new PaxosLocks([]), /at least one endpoint/);
});

// ---------------------------------------------------------------------------
// A real group.

/**
 * How long a node waits for a quorum before it answers 504 (--request-timeout):
 * short, so the test with two nodes paused gets its 504 soon, yet well above
 * an election (500 ms to 1 s of silence, then one round).
 */
const REQUEST_TIMEOUT_MS = 3_000;

/** Starts three `drover paxos serve` nodes over the direct transport. */
async function startGroup() {
  const bin = droverBin();
  const dir = mkdtempSync(join(tmpdir(), "drover-paxos-js-"));
  const ports = [await freePort(), await freePort(), await freePort()];
  const peers = ports.map((p, i) => `${i}=127.0.0.1:${p}`).join(",");
  const group = uniq("js");
  const nodes = ports.map((port, id) => {
    const args = ["paxos", "serve", "--id", String(id), "--peers", peers, "--transport", "direct"];
    args.push("--listen", `127.0.0.1:${port}`, "--group", group, "--data-dir", join(dir, `node-${id}`));
    args.push("--request-timeout", `${REQUEST_TIMEOUT_MS}ms`);
    const proc = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RABBITMQ_URL: "" } });
    const node = { id, port, endpoint: `127.0.0.1:${port}`, url: `http://127.0.0.1:${port}`, proc, log: "", exited: false, killed: false };
    const keep = (d) => {
      node.log += d;
      if (node.log.length > 100_000) node.log = node.log.slice(-50_000);
    };
    proc.stdout.on("data", keep);
    proc.stderr.on("data", keep);
    node.done = new Promise((resolve) => proc.on("exit", resolve)).then(() => (node.exited = true));
    proc.on("error", (err) => keep(`spawn: ${err.message}\n`));
    return node;
  });
  const logs = () => nodes.map((n) => `--- node ${n.id}${n.exited ? " (exited)" : ""}:\n${n.log.slice(-3000)}`).join("\n");
  return { dir, nodes, logs, endpoints: nodes.map((n) => n.endpoint) };
}

/** Stops every node (SIGTERM, then SIGKILL after 5 s) and removes the data dirs. */
async function stopGroup(g) {
  await Promise.all(
    g.nodes.map(async (n) => {
      if (n.exited) return;
      n.proc.kill("SIGCONT"); // a node a failed test left paused would not see the SIGTERM
      n.proc.kill("SIGTERM");
      await Promise.race([n.done, sleep(5_000)]);
      if (n.exited) return;
      n.proc.kill("SIGKILL");
      await Promise.race([n.done, sleep(2_000)]);
    }),
  );
  rmSync(g.dir, { recursive: true, force: true });
}

/** A node's GET /status, or null. */
const nodeStatus = (n) =>
  fetch(`${n.url}/status`, { signal: AbortSignal.timeout(1_000) })
    .then((r) => (r.ok ? r.json() : null))
    .catch(() => null);

/** Pauses (SIGSTOP) or resumes (SIGCONT) nodes' processes. */
const signal = (nodes, sig) => {
  for (const n of nodes) if (!n.exited) process.kill(n.proc.pid, sig);
};

/**
 * Pauses nodes (SIGSTOP) and waits, at most 5 s, until the kernel shows
 * each process stopped (state T in /proc/PID/stat): a signal sent is not
 * yet a process stopped, and a request sent in between could still be
 * served.
 */
async function pause(nodes) {
  signal(nodes, "SIGSTOP");
  const state = (n) => readFileSync(`/proc/${n.proc.pid}/stat`, "utf8").replace(/^.*\) /s, "")[0];
  await until(async () => nodes.every((n) => state(n) === "T") || undefined, 5_000, () => `nodes ${nodes.map((n) => n.id)} to stop`);
}

/** The node every live node names as the leader, and which says it leads (waits at most 30 s). */
function agreedLeader(g) {
  return until(
    async () => {
      const live = g.nodes.filter((n) => !n.killed);
      const dead = live.find((n) => n.exited);
      if (dead) throw new Error(`node ${dead.id} exited:\n${g.logs()}`);
      const sts = await Promise.all(live.map(nodeStatus));
      if (sts.some((s) => !s?.has_leader) || new Set(sts.map((s) => s.leader)).size !== 1) return undefined;
      const i = live.findIndex((n) => n.id === sts[0].leader);
      return i >= 0 && sts[i].role === "leader" ? live[i] : undefined;
    },
    30_000,
    () => `the live nodes to agree on a leader\n${g.logs()}`,
  );
}

describe("a group of three drover paxos serve nodes", () => {
  let g;
  let locks;
  before(async () => {
    g = await startGroup();
    await agreedLeader(g);
    locks = new PaxosLocks(g.endpoints, { timeoutMs: 15_000 });
  });
  after(async () => {
    if (g) await stopGroup(g);
  });

  test("acquire, get, renew, list, release: the answers' shapes, and fencing tokens that grow", async () => {
    const id = uniq("shape");
    const a = await locks.acquire(id, { owner: "alice", ttl: 30, holder: { host: "h1", pid: 42 } });
    assert.deepEqual(Object.keys(a).sort(), ["acquired", "expires", "holder", "lockId", "owner", "token", "ttl"]);
    assert.equal(a.lockId, id);
    assert.equal(a.owner, "alice");
    assert.ok(Number.isInteger(a.token) && a.token > 0, `token ${a.token}`);
    assert.equal(a.ttl, 30);
    assert.equal(a.expires - a.acquired, 30_000);
    assert.deepEqual(a.holder, { host: "h1", pid: 42 });

    const got = await locks.get(id);
    assert.equal(got.token, a.token);
    assert.equal(got.owner, "alice");
    assert.equal(got.expires, a.expires);
    assert.ok(got.ttl > 0 && got.ttl <= 30, `ttl ${got.ttl}`);
    assert.deepEqual(got.holder, { host: "h1", pid: 42 });

    const r = await locks.renew(id, "alice", a.token, 60);
    assert.deepEqual(Object.keys(r).sort(), ["expires", "lockId", "owner", "token", "ttl"]);
    assert.equal(r.token, a.token, "a renewal keeps the token");
    assert.ok(r.expires > a.expires, "and moves the expiry");
    assert.ok((await locks.list()).some((l) => l.lockId === id && l.token === a.token && l.expires === r.expires));

    assert.equal(await locks.release(id, "alice", a.token), undefined);
    await assert.rejects(locks.get(id), (err) => err instanceof NotFoundError && err.status === 404 && /is free.*acquire it/.test(err.message));
    const b = await locks.acquire(id, { owner: "bob", ttl: 30 });
    assert.ok(b.token > a.token, `token ${b.token} after ${a.token}`);
    assert.equal(b.holder, undefined);
    const other = await locks.acquire(uniq("shape"), { owner: "carol", ttl: 30 });
    assert.ok(other.token > b.token, "tokens are log indexes: they grow across locks too");
  });

  test("a second owner gets PaxosLockHeldError naming the holder", async () => {
    const id = uniq("held");
    const a = await locks.acquire(id, { owner: "alice", ttl: 30 });
    for (const owner of ["bob", "alice"]) {
      await assert.rejects(locks.acquire(id, { owner, ttl: 30 }), (err) => {
        assert.ok(err instanceof PaxosLockHeldError && err instanceof LockHeldError);
        assert.equal(err.status, 409);
        assert.equal(err.lock, id);
        assert.equal(err.current.owner, "alice");
        assert.equal(err.current.token, a.token);
        assert.match(err.message, new RegExp(`held by owner "alice" with token ${a.token}.*try again`));
        return true;
      });
    }
    await locks.release(id, "alice", a.token);
  });

  test("a release or renewal with a stale token is refused and changes nothing", async () => {
    const id = uniq("stale");
    const a = await locks.acquire(id, { owner: "alice", ttl: 30 });
    await locks.release(id, "alice", a.token);
    const b = await locks.acquire(id, { owner: "bob", ttl: 30 });
    const stale = (owner) => (err) => {
      assert.ok(err instanceof PaxosNotHeldError && err instanceof FencedError);
      assert.equal(err.status, 409);
      assert.equal(err.owner, owner);
      assert.equal(err.token, a.token);
      assert.equal(err.current.owner, "bob");
      assert.equal(err.current.token, b.token);
      assert.match(err.message, /stop the work done under token/);
      return true;
    };
    await assert.rejects(locks.release(id, "alice", a.token), stale("alice"));
    await assert.rejects(locks.renew(id, "alice", a.token, 30), stale("alice"));
    await assert.rejects(locks.release(id, "bob", a.token), stale("bob"));
    assert.equal((await locks.get(id)).token, b.token, "bob still holds it");
    await locks.release(id, "bob", b.token);
    await assert.rejects(locks.release(id, "bob", b.token), (err) => {
      assert.ok(err instanceof PaxosNotHeldError);
      assert.equal(err.current, undefined);
      assert.match(err.message, /it is free/);
      return true;
    });
  });

  test("bad input is an InvalidInputError, and nothing is applied", async () => {
    const id = uniq("bad");
    const bad = (re) => (err) => err instanceof InvalidInputError && err.status === 400 && re.test(err.message) && /fix the request/.test(err.message);
    await assert.rejects(locks.acquire(id, { owner: "", ttl: 30 }), bad(/owner and ttl are required/));
    await assert.rejects(locks.acquire(id, { owner: "alice", ttl: 100_000 }), bad(/ttl must be/));
    await assert.rejects(locks.acquire(id, { owner: "alice", ttl: 30, holder: [1] }), bad(/holder must be a JSON object/));
    await assert.rejects(locks.release(id, "alice", 0), bad(/owner and token are required/));
    await assert.rejects(locks.renew(id, "", 5, 30), bad(/owner and token are required/));
    await assert.rejects(locks.get(id), NotFoundError);
  });

  test("a first endpoint where nothing listens: calls go on to the nodes, then straight to the leader", async () => {
    const nowhere = await freePort();
    const c = new PaxosLocks([`127.0.0.1:${nowhere}`, ...g.endpoints]);
    const id = uniq("skip");
    const a = await c.acquire(id, { owner: "alice", ttl: 30 });
    assert.equal(c.nextEndpoint, (await agreedLeader(g)).url, "the answer named the leader");
    assert.equal((await c.get(id)).token, a.token);
    await c.release(id, "alice", a.token);

    const none = new PaxosLocks([`127.0.0.1:${nowhere}`, `127.0.0.1:${await freePort()}`], { timeoutMs: 5_000 });
    await assert.rejects(none.list(), (err) => {
      assert.ok(err instanceof PaxosUnreachableError && err instanceof ConnectionError);
      assert.equal(err.status, 0);
      assert.equal(err.attempts.length, 2);
      assert.match(err.message, /ECONNREFUSED/);
      return true;
    });
  });

  test("status and statusAll show the group", async () => {
    const leader = await agreedLeader(g);
    const st = await locks.status();
    assert.ok(["leader", "follower"].includes(st.role), st.role);
    assert.equal(st.leader, leader.id);
    assert.deepEqual(st.members.map((m) => m.addr).sort(), [...g.endpoints].sort());
    const all = await locks.statusAll();
    assert.deepEqual(all.map((s) => s.endpoint), g.nodes.map((n) => n.url));
    assert.deepEqual(all.map((s) => s.status?.role === "leader"), g.nodes.map((n) => n === leader));
  });

  test("idempotency: the same acquisition sent again with its key, to another node, is applied once", async () => {
    const id = uniq("idem");
    const key = uniq("key");
    const [n0, n1] = g.nodes.map((n) => new PaxosLocks([n.endpoint]));
    const a = await n0.acquire(id, { owner: "alice", ttl: 30, idempotencyKey: key });
    const again = await n1.acquire(id, { owner: "alice", ttl: 30, idempotencyKey: key });
    assert.equal(again.token, a.token, "the first answer, not a second grant");
    await assert.rejects(n1.acquire(id, { owner: "alice", ttl: 30 }), PaxosLockHeldError, "without the key it is a new request");
    await assert.rejects(n0.acquire(id, { owner: "bob", ttl: 30, idempotencyKey: key }), (err) => err instanceof InvalidInputError && err.status === 422);
    const got = await n0.get(id);
    assert.equal(got.owner, "alice");
    assert.equal(got.token, a.token);
    await n0.release(id, "alice", a.token);
  });

  test("idempotency: an answer lost within a call, the next node's attempt gets the first grant", async () => {
    const id = uniq("lost");
    let lost;
    const keys = [];
    const losing = async (url, init) => {
      if (init.method !== "POST") return fetch(url, init);
      keys.push(init.headers["Idempotency-Key"]);
      if (lost) return fetch(url, init);
      lost = await (await fetch(url, init)).json(); // the node applied it...
      throw new TypeError("fetch failed", { cause: { code: "ECONNRESET" } }); // ...and its answer was lost
    };
    const c = new PaxosLocks(g.endpoints, { fetch: losing });
    const a = await c.acquire(id, { owner: "alice", ttl: 30 });
    assert.equal(lost.status, "acquired");
    assert.equal(keys.length, 2);
    assert.equal(keys[1], keys[0], "the same key on the next node");
    assert.equal(a.token, lost.token, "the grant the lost answer carried");
    assert.deepEqual((await c.list()).filter((l) => l.lockId === id).map((l) => l.token), [a.token]);
    await c.release(id, "alice", a.token);
  });

  test("the README's example runs against the group", async () => {
    const example = fileURLToPath(new URL("../build/examples/paxos.js", import.meta.url));
    const env = { ...process.env, PAXOS_ENDPOINTS: g.endpoints.join(",") };
    const { stdout } = await promisify(execFile)(process.execPath, [example], { env, timeout: 60_000 });
    assert.match(stdout, /^holding nightly-report with token \d+$/m);
    assert.match(stdout, /^someone-else: held by .+ with token \d+$/m);
    assert.match(stdout, /^released; free now: true$/m);
  });

  test("a node that hangs (SIGSTOP) costs its share of the call's time only", async () => {
    const leader = await agreedLeader(g);
    const hung = g.nodes.find((n) => n !== leader);
    const c = new PaxosLocks([hung.endpoint, ...g.nodes.filter((n) => n !== hung).map((n) => n.endpoint)], { timeoutMs: 3_000 });
    const id = uniq("hang");
    await pause([hung]);
    try {
      const t0 = Date.now();
      const a = await c.acquire(id, { owner: "alice", ttl: 30 });
      const took = Date.now() - t0;
      assert.ok(took >= 900, `${took} ms: the first attempt should have waited out its share (1000 ms) on the paused node`);
      assert.ok(took < 2_500, `${took} ms: a paused node should cost its share of 3000 ms over 3 nodes (1000 ms), not the call's time`);
      assert.ok(Number.isInteger(a.token) && a.token > 0, `token ${a.token}`);
      assert.notEqual(c.nextEndpoint, hung.url, "the next call does not start at the paused node");
      assert.equal((await c.get(id, { timeoutMs: 3_000 })).token, a.token);
      await c.release(id, "alice", a.token, { timeoutMs: 3_000 });
    } finally {
      signal([hung], "SIGCONT");
    }
    await agreedLeader(g); // one leader again, the resumed node answering /status
  });

  test("with two nodes paused, a write answers PaxosTimeoutError (504) carrying its idempotency key, and repeating it with that key once the nodes are back applies it once", async () => {
    const leader = await agreedLeader(g);
    const live = g.nodes.find((n) => n !== leader);
    const paused = g.nodes.filter((n) => n !== live); // the leader and the other follower
    // The paused nodes first: each hangs for its share (4 s), then the live
    // node, without a quorum, answers 504 after its --request-timeout (3 s).
    const c = new PaxosLocks([...paused.map((n) => n.endpoint), live.endpoint], { timeoutMs: 12_000 });
    const id = uniq("noquorum");
    let key;
    await pause(paused);
    try {
      const t0 = Date.now();
      // A grant here would name who answered: said in the failure.
      const granted = (a) => {
        throw new Error(`granted with two of three nodes paused: ${JSON.stringify(a)}; next endpoint ${c.nextEndpoint}; paused ${paused.map((n) => n.id)}`);
      };
      await assert.rejects(c.acquire(id, { owner: "alice", ttl: 60 }).then(granted), (err) => {
        assert.ok(err instanceof PaxosTimeoutError && err instanceof UnavailableError, `${err?.constructor?.name}: ${err?.message}`);
        assert.equal(err.status, 504);
        assert.match(err.message, new RegExp(`${live.url.replace(/[.]/g, "\\.")} answered 504.*repeat the call with the error's idempotencyKey`));
        assert.equal(typeof err.idempotencyKey, "string");
        assert.ok(err.idempotencyKey.length > 0);
        key = err.idempotencyKey;
        return true;
      });
      const took = Date.now() - t0;
      assert.ok(took >= 8_000 + REQUEST_TIMEOUT_MS - 500 && took < 12_000, `${took} ms: two shares of 4 s, then the live node's 504`);
    } finally {
      signal(paused, "SIGCONT");
    }
    await agreedLeader(g);

    // The paused nodes may have applied it on waking (the requests they were
    // sent, the forward they were sent): the key makes every copy one grant.
    const all = new PaxosLocks(g.endpoints, { timeoutMs: 15_000 });
    const a = await all.acquire(id, { owner: "alice", ttl: 60, idempotencyKey: key });
    const again = await all.acquire(id, { owner: "alice", ttl: 60, idempotencyKey: key });
    assert.equal(again.token, a.token, "the same grant, not a second one");
    assert.deepEqual((await all.list()).filter((l) => l.lockId === id).map((l) => [l.owner, l.token]), [["alice", a.token]]);
    await assert.rejects(all.acquire(id, { owner: "alice", ttl: 60 }), (err) => err instanceof PaxosLockHeldError && err.current.token === a.token);
    await all.release(id, "alice", a.token);
  });

  // Last: it leaves two nodes of three.
  test("the leader killed with SIGKILL: the next call succeeds on a new leader, nothing lost or granted twice", async () => {
    const old = await agreedLeader(g);
    const id = uniq("kept");
    const kept = await locks.acquire(id, { owner: "alice", ttl: 120 });
    assert.equal(locks.nextEndpoint, old.url, "calls go to the leader");

    old.killed = true;
    old.proc.kill("SIGKILL");
    await withTimeout(old.done, 5_000, "the killed leader did not exit");

    const t0 = Date.now();
    const next = await locks.acquire(uniq("after"), { owner: "bob", ttl: 30, timeoutMs: 15_000 });
    assert.ok(Date.now() - t0 < 15_000);
    assert.ok(next.token > kept.token, `token ${next.token} after ${kept.token}`);
    assert.notEqual(locks.nextEndpoint, old.url);

    const now = await agreedLeader(g);
    assert.notEqual(now.id, old.id);
    const got = await locks.get(id);
    assert.equal(got.owner, "alice");
    assert.equal(got.token, kept.token, "the grant made before the kill is kept, with its token");
    await assert.rejects(locks.acquire(id, { owner: "mallory", ttl: 30 }), (err) => err instanceof PaxosLockHeldError && err.current.token === kept.token);
    await locks.release(id, "alice", kept.token);
  });
});
