import { Drover } from "@droverhq/client";

const drover = new Drover(); // $DROVER_URL, else http://127.0.0.1:8080
const queue = "chat";
const id = `chat-${process.pid}`;

// A fake model: the same tokens every time, one every 5 ms.
async function* fakeModel(prompt: string): AsyncGenerator<string> {
  for (const tok of `You asked: ${prompt}. Here is a short answer.`.split(/(?<= )/)) {
    await new Promise((r) => setTimeout(r, 5));
    yield tok;
  }
}

await drover.submit(queue, [{ task_id: id, task_type: "answer", parameters: { prompt: "what is drover" } }]);

// Follow before the task runs: a follower sees the same events whenever it starts.
const following = (async () => {
  let text = "";
  for await (const ev of drover.streams.follow(id)) {
    if (ev.type === "token") text += (ev.data as { text: string }).text;
    else console.log(`#${ev.seq} ${ev.type}`, JSON.stringify(ev.data)); // attempt_started, progress, done...
  }
  return text; // the iteration ends after `done`
})();

const worker = drover.worker(queue, { signals: false }, async (task, { stream }) => {
  const { prompt } = task.parameters as { prompt: string };
  let reply = "";
  for await (const tok of fakeModel(prompt)) {
    // {"type":"token","data":{"text":tok}}: queued, and sent many per request.
    // Throws FencedError once this attempt lost its claim: it stops, another runs the task.
    await stream.token(tok);
    reply += tok;
  }
  await stream.emit("progress", { done: 1, of: 1 });
  return { message: reply }; // the final message is the task's result
});

const streamed = await following;
await worker.drain();
const t = await drover.tasks.get(queue, id);
console.log("streamed:", streamed);
console.log("result:  ", (t.result as { message: string }).message);
console.log("same:", streamed === (t.result as { message: string }).message);
