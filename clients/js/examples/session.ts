// A session kept alive in the background; its signal stops the work the
// moment the session is lost.
import { Drover, SessionLostError } from "@droverhq/client";

const drover = new Drover(); // $DROVER_URL, else http://127.0.0.1:8080
const session = await drover.session({ ttl: 15, name: "summarizer-1" });
try {
  // Pass the signal to fetch and LLM calls: they are aborted if the session is lost.
  const res = await fetch(`${drover.transport.url}/readyz`, { signal: session.signal });
  console.log("server ready:", res.status === 200);
} catch (err) {
  if (session.signal.reason instanceof SessionLostError) console.error("session lost, stopping");
  throw err;
} finally {
  await session.close(); // DELETE: everything held under it is released
}
