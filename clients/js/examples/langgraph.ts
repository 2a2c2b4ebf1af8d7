// A LangGraph graph checkpointed on drover, safe to run on several machines
// at once: with compare-and-swap protection a concurrent update is a
// ConflictError (invoke again); with a lock the whole invocation is fenced.
import { StateGraph, Annotation, START, END } from "@langchain/langgraph";
import { Drover, ConflictError } from "@droverhq/client";
import { DroverSaver } from "@droverhq/client/langgraph";

const drover = new Drover();
const State = Annotation.Root({ count: Annotation<number>({ reducer: (_, n) => n, default: () => 0 }) });
const builder = new StateGraph(State)
  .addNode("increment", async (s) => ({ count: s.count + 1 }))
  .addEdge(START, "increment")
  .addEdge("increment", END);

const saver = new DroverSaver({ drover }); // protection: compare-and-swap
const graph = builder.compile({ checkpointer: saver });
const config = { configurable: { thread_id: "conversation-123" } };

for (let attempt = 0; ; attempt++) {
  try {
    console.log(await graph.invoke({}, config));
    break;
  } catch (err) {
    if (!(err instanceof ConflictError) || attempt >= 10) throw err;
    // Another machine moved the thread on: invoking again reloads it.
  }
}

// Or hold the thread's lock across the invocation: every write carries its token.
{
  await using lock = await drover.lock("thread:conversation-123", { wait: "60s" });
  console.log(await builder.compile({ checkpointer: saver.withLock(lock) }).invoke({}, config));
}
