// Spend the fleet's LLM token budget before each call; settle with what
// was used. Quotas and circuit breakers are as thin.
import { Drover, RateLimitedError } from "@droverhq/client";

const drover = new Drover();
await drover.limits.set("openai-tokens", "90000/m", 20000); // admin role; usually set once by ops

try {
  await drover.limits.take("openai-tokens", 1200, { maxWait: "30s" });
  const used = 830; // ... call the model, count the tokens it used ...
  await drover.limits.settle("openai-tokens", 1200, used);
} catch (err) {
  if (err instanceof RateLimitedError) console.log(`no budget within 30 s; retry in ${err.retryAfter} s`);
  else throw err;
}

// The same in one call:
const answer = await drover.limits.withTokens("openai-tokens", 1200, async () => ({ used: 640, text: "..." }));
console.log(answer.text);

// A concurrency quota: at most 2 slots at once across the fleet.
await drover.quotas.set("gpu", 2);
const session = await drover.session();
await drover.quotas.acquire("gpu", { session, wait: "10s" });
await drover.quotas.release("gpu", { session });

// A circuit breaker shared by the fleet.
await drover.breakers.set("search-api", { failures: 5, cooldown: "30s" });
console.log(await drover.breakers.call("search-api", async () => "result"));
await session.close();
