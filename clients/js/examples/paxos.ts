// A fenced lock on a `drover paxos serve` group: acquire, renew, release,
// and what a second owner sees meanwhile.
import { hostname } from "node:os";
import { PaxosLockHeldError, PaxosLocks, PaxosNotHeldError } from "@droverhq/client";

// Every node of the group; the client finds the leader and fails over.
const endpoints = process.env.PAXOS_ENDPOINTS ?? "127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102";
const locks = new PaxosLocks(endpoints, { timeoutMs: 15_000 });

const owner = `${hostname()}-${process.pid}`;
const lock = await locks.acquire("nightly-report", { owner, ttl: 30, holder: { host: hostname(), pid: process.pid } });
console.log(`holding nightly-report with token ${lock.token}`);
try {
  // Another owner is refused, and told who holds the lock.
  try {
    await locks.acquire("nightly-report", { owner: "someone-else", ttl: 30 });
  } catch (err) {
    if (!(err instanceof PaxosLockHeldError)) throw err;
    console.log(`someone-else: held by ${err.current.owner} with token ${err.current.token}`);
  }
  // Work longer than the TTL? Renew before it runs out. Pass lock.token
  // with every write made under the lock.
  const renewed = await locks.renew("nightly-report", owner, lock.token, 30);
  console.log(`renewed until ${new Date(renewed.expires).toISOString()}`);
} finally {
  // Fenced: a token that no longer holds the lock (it expired, another
  // owner took it) frees nothing and throws PaxosNotHeldError.
  await locks.release("nightly-report", owner, lock.token).catch((err) => {
    if (!(err instanceof PaxosNotHeldError)) throw err;
  });
}
console.log("released; free now:", (await locks.list()).every((l) => l.lockId !== "nightly-report"));
