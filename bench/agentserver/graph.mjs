// The benchmark's graph: three nodes in a line, no model call. Each node adds
// one to a counter, so a run's state is a few bytes and its cost is the
// server's and the runtime's own: admission, claim, checkpoints, events,
// outcome.
import { Annotation, StateGraph } from "@langchain/langgraph";

const State = Annotation.Root({
  count: Annotation({ reducer: (a, b) => a + b, default: () => 0 }),
});

const step = () => ({ count: 1 });

export const graph = new StateGraph(State)
  .addNode("a", step)
  .addNode("b", step)
  .addNode("c", step)
  .addEdge("__start__", "a")
  .addEdge("a", "b")
  .addEdge("b", "c")
  .addEdge("c", "__end__")
  .compile();
