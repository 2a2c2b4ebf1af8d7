// Stream a large submission as NDJSON: bad lines are reported by number
// while the valid ones go in.
import { Drover } from "@droverhq/client";

const drover = new Drover();

async function* tasks() {
  for (let i = 0; i < 10_000; i++) yield { task_id: `doc-${i}`, task_type: "embed", parameters: { doc: i } };
  yield "this line is not JSON";
}

const r = await drover.submit("embeddings", tasks());
console.log(r.submitted, r.duplicates, r.rejected); // 10000 0 [ { line: 10001, error: '...' } ]
console.log(await drover.tasks.stats("embeddings"));
const page = await drover.tasks.list("embeddings", { status: "PENDING", limit: 10 });
console.log(page.tasks.length, page.next !== undefined);
await drover.tasks.cancel("embeddings", "doc-0");
