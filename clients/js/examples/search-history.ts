// Search a queue's tasks, make scheduled ones due now, and read the
// queue's history a minute at a time.
import { Drover } from "@droverhq/client";

const drover = new Drover();
const queue = "reports";

await drover.submit(queue, Array.from({ length: 6 }, (_, i) => ({
  task_id: `report-${i}`, task_type: i % 2 ? "pdf" : "csv", parameters: { team: "ops" }, delay: "1h",
})));

// Every filter given must hold: status, type, idPrefix, params, since/until
// (a Date, RFC 3339, or a duration back from now such as "1h").
const page = await drover.tasks.search(queue, { status: "SCHEDULED", type: "pdf", params: { team: "ops" }, since: "1h", limit: 2 });
console.log(page.tasks.map((t) => t.task_id), page.nextCursor !== undefined); // [ 'report-1', 'report-3' ] true
for await (const t of drover.tasks.searchAll(queue, { type: "pdf" })) console.log(t.task_id); // every page: report-1, -3, -5

// Scheduled tasks due now (PENDING at once): some by id, or all of them.
console.log(await drover.tasks.runNow(queue, ["report-0", "report-1"])); // { queue: 'reports', moved: 2 }
console.log(await drover.tasks.runNow(queue)); // { queue: 'reports', moved: 4 }

// A bucket a minute, the last hour ("1h") or day ("24h"): processed, failed,
// retried, deferred, the depth at the minute's end, and the latency from
// submission to first claim. NotFoundError for an unknown queue.
const h = await drover.tasks.history(queue, { window: "1h" });
console.log(h.buckets.length, h.totals.processed, h.latency.p50_seconds); // 60 0 0
