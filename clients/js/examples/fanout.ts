// Fan-out and fan-in: step 1 spawns 20 searches into the queue "search"
// and the task waits for them, holding nothing; a worker (here, in this
// same program) runs them; step 2 merges their results.
import { Drover, spawnChildren, type StepContext } from "@droverhq/client";

const drover = new Drover();
const id = `research-${process.pid}`;

// A queue exists once a task was submitted to it (or `drover queues set` configured it).
await drover.submit("search", [{ task_id: `warm-up-${process.pid}`, task_type: "web-search", parameters: { topic: "drover" } }]);
const worker = drover.worker("search", async (task) => {
  const { topic } = task.parameters as { topic: string };
  return { topic, hits: topic.length };
});

type State = { question: string; hits?: number };
const result = await drover.runSteps<State>(id, [
  {
    name: "plan",
    run: (s: State) => {
      const topics = Array.from({ length: 20 }, (_, i) => `${s.question} ${i}`);
      const children = topics.map((topic) => ({ queue: "search", taskType: "web-search", parameters: { topic } }));
      return spawnChildren(children, {}, s); // wait for all; { wait: 5 } for the first 5, { collect: true } to keep dead ones
    },
  },
  {
    name: "merge",
    run: async (s: State, ctx: StepContext) => {
      const kids = (await ctx.children())!;
      kids.throwIfFailed(); // without collect, the first dead child ends the wait
      const hits = kids.results().reduce((n: number, r) => n + (r as { hits: number }).hits, 0);
      return { ...s, hits };
    },
  },
], { input: { question: "etcd leases" }, resumeWithin: "5m" });

console.log(result.ran, result.state.hits); // [ 1, 2 ] 270
await worker.drain();
