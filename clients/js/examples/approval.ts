// Human approval: a step waits for a signal, holding nothing; a reviewer
// (here, this same program) sends it; the next step gets its data.
import { Drover, TaskFinishedError, waitSignal, type StepContext } from "@droverhq/client";

const drover = new Drover();
const id = `cleanup-${process.pid}`;

type State = { plan?: string; outcome?: string };
const steps = [
  { name: "plan", run: async (s: State) => waitSignal("approval", { timeout: "24h" }, { ...s, plan: "delete 3 stale branches" }) },
  {
    name: "act",
    run: async (s: State, { received }: StepContext) => {
      const answer = received?.data as { approved?: boolean; by?: string } | undefined;
      if (received?.timedOut) return { ...s, outcome: "no answer in 24 h: nothing done" };
      if (!answer?.approved) return { ...s, outcome: "rejected: nothing done" };
      return { ...s, outcome: `done, approved by ${answer.by}` };
    },
  },
];

const first = await drover.runSteps<State>(id, steps, { input: {} });
console.log(first.ran, first.waitingFor?.signals); // [ 1 ] [ 'approval' ]: parked, nothing held

// The reviewer, from anywhere: the key makes a retried click count once.
const sent = await drover.signal(id, "approval", { data: { approved: true, by: "ana" }, idempotencyKey: "review-42" });
const again = await drover.signal(id, "approval", { data: { approved: true, by: "ana" }, idempotencyKey: "review-42" });
console.log(sent.stored, again.stored); // true false

const done = await drover.runSteps<State>(id, steps, { input: {} });
console.log(done.ran, done.state.outcome); // [ 2 ] done, approved by ana

try {
  await drover.signal(id, "approval", { data: { approved: false } });
} catch (err) {
  if (!(err instanceof TaskFinishedError)) throw err;
  console.log("finished: it takes no signal");
}
