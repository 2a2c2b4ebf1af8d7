// An agent task that runs step by step under a claim and resumes after a
// crash: only the steps after the last checkpointed one run.
import { Drover } from "@droverhq/client";

const drover = new Drover();

type State = { query: string; docs?: string[]; summary?: string; sent?: boolean };

const result = await drover.runSteps<State>(
  "weekly-report-42",
  [
    { name: "fetch", run: async (s) => ({ ...s, docs: ["a", "b"] }) },
    { name: "summarize", run: async (s, { signal }) => ({ ...s, summary: await summarize(s.docs!, signal) }) },
    { name: "send", run: async (s) => ({ ...s, sent: true }) },
  ],
  { input: { query: "last week" }, ttl: 15, wait: "60s" },
);
console.log(result.ran, result.state); // [1, 2, 3] on the first run; [] once complete

async function summarize(docs: string[], signal: AbortSignal): Promise<string> {
  signal.throwIfAborted(); // the claim's session is lost: another worker resumes here
  return docs.join(" + ");
}
