// A lock with a fencing token, released at the end of the block.
import { Drover, LockHeldError } from "@droverhq/client";

const drover = new Drover();

async function nightlyReport(): Promise<void> {
  // `await using` releases the lock when the block ends, however it ends.
  await using lock = await drover.lock("nightly-report", { ttl: 15, wait: "30s" });
  console.log(`holding nightly-report with token ${lock.token}`);
  // Pass lock.signal to the work (it fires if the lock's session is lost)
  // and lock.token with every write made under the lock.
  await fetch(`${drover.transport.url}/readyz`, { signal: lock.signal });
}

async function sameWithTryFinally(): Promise<void> {
  let lock;
  try {
    lock = await drover.lock("nightly-report"); // no wait: LockHeldError if held
  } catch (err) {
    if (err instanceof LockHeldError) return console.log("held by", err.holder?.holder?.id);
    throw err;
  }
  try {
    console.log(`holding nightly-report with token ${lock.token}`);
  } finally {
    await lock.release();
  }
}

await nightlyReport();
await sameWithTryFinally();
