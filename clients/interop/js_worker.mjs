// A queue worker of the TypeScript client for the mixed-fleet test: it
// appends the id of every task it runs to LOG, and drains once no task came
// for 3 s after its first one, or for 15 s from its start (or after 120 s
// in all). Its prefetch is 8, so that the four workers share the tasks
// (at the default, a worker holds up to 100 short tasks ahead, and one
// process may take most of 1,000).
//   node js_worker.mjs URL QUEUE LOG
import { appendFileSync } from "node:fs";
import { Drover } from "../js/dist/index.js";

const [url, queue, log] = process.argv.slice(2);
const drover = new Drover({ url });
const t0 = Date.now();
let last = 0;
const worker = drover.worker(queue, { concurrency: 8, prefetch: 8, wait: "1s", name: `js-${process.pid}` }, (task) => {
  appendFileSync(log, task.task_id + "\n");
  last = Date.now();
  return { by: "js" };
});
const timer = setInterval(() => {
  const now = Date.now();
  if ((last && now - last > 3000) || (!last && now - t0 > 15000) || now - t0 > 120000) void worker.drain();
}, 200);
const st = await worker.done;
clearInterval(timer);
console.log(JSON.stringify({ lang: "js", pid: process.pid, succeeded: st.succeeded, lost: st.lost }));
