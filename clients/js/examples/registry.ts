// Register an endpoint under a session (it disappears within the TTL when
// the process dies) and watch a component's endpoints as they change.
import { Drover } from "@droverhq/client";

const drover = new Drover();
const session = await drover.session({ ttl: 10 });
const ac = new AbortController();

const watching = (async () => {
  for await (const ev of drover.registry.watch("llm-gateway", { signal: ac.signal })) {
    if (ev.type === "snapshot") console.log("now:", ev.endpoints.map((e) => e.id));
    else console.log(ev.type, ev.endpoint.id, ev.endpoint.address);
    if (ev.type === "delete") ac.abort(); // stop watching, for this example
  }
})();

await new Promise((r) => setTimeout(r, 200));
const reg = await drover.registry.register("llm-gateway", "gw-1", { session, address: "127.0.0.1:9000", data: { model: "m-large" } });
console.log(await drover.registry.list("llm-gateway"));
await reg.deregister();
await watching;
await session.close();
