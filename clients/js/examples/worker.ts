// Submit tasks, then run a queue worker: outcomes are fenced by each
// claim's token, Permanent failures go to the dead-letter queue, SIGTERM
// drains.
import { Drover, Permanent } from "@droverhq/client";

const drover = new Drover();
const queue = "emails";

await drover.submit(queue, [
  { task_id: "welcome-1", task_type: "email", parameters: { to: "a@example.com" } },
  { task_id: "welcome-2", task_type: "email", parameters: { to: "" } },
]);

const worker = drover.worker(queue, { concurrency: 4 }, async (task, { signal, token }) => {
  const { to } = task.parameters as { to: string };
  if (!to) throw new Permanent("no recipient"); // to the DLQ, not retried
  // ... send it, passing `signal` (the claim's session) and `token` along ...
  void signal;
  return { sent: to, token }; // the task's result
});

// Here: stop once both are done. A long-running worker just waits for SIGTERM.
for (let i = 0; i < 100; i++) {
  const s = await drover.tasks.stats(queue);
  if (s.succeeded + s.dead >= 2) break;
  await new Promise((r) => setTimeout(r, 100));
}
const stats = await worker.drain(); // what SIGTERM does
console.log(stats); // { claimed: 2, succeeded: 1, permanent: 1, ... }
console.log((await drover.dlq.list(queue)).tasks.map((t) => t.task_id)); // [ 'welcome-2' ]
