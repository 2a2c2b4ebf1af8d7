import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Drover } from "../dist/index.js";
import { MAX_USAGE_TOKENS, resultUsage } from "../dist/budgets.js";
import { sharedServer, uniq } from "./helpers/server.mjs";

let srv;
let drover;
before(async () => {
  srv = await sharedServer();
  drover = new Drover({ url: srv.url, namespace: uniq("budgetusage") });
});
after(async () => srv.release());

// A day's window: it cannot turn while a test runs.
const DAY = 86400;

test("resultUsage reads each shape, prefers total_tokens, says nothing of results without one, and names the field of a usage that is not a number of tokens", () => {
  // The cases of the Go gate's rule (budget.ResultUsage, TestResultUsage):
  // [result as JSON, tokens, field of the usage at fault].
  const cases = [
    ['{"usage":{"total_tokens":30,"prompt_tokens":1,"completion_tokens":1}}', 30],
    [' {"usage":{"prompt_tokens":10,"completion_tokens":15}}', 25],
    ['{"usage":{"prompt_tokens":10}}', 10],
    ['{"usage":{"input_tokens":20,"output_tokens":5,"cache_read_input_tokens":9}}', 25],
    ['{"usage":{"input_tokens":20,"output_tokens":5,"cache_creation_input_tokens":100,"cache_read_input_tokens":9}}', 125],
    ['{"usage":{"cache_creation_input_tokens":-1,"input_tokens":1}}', undefined, "usage.cache_creation_input_tokens"],
    ['{"usage":{"total_tokens":7},"pad":"' + "x".repeat(256 << 10) + '"}', undefined],
    ['{"usage":{"total_tokens":0}}', 0],
    ['{"usage":{}}', undefined],
    ['{"usage":"much"}', undefined],
    ['{"text":"no usage here"}', undefined],
    ['"usage"', undefined],
    ['not json {"usage"', undefined],
    ['{"usage":{"total_tokens":-3}}', undefined, "usage.total_tokens"],
    ['{"usage":{"input_tokens":1,"output_tokens":2000000000}}', undefined, "usage.output_tokens"],
    ['{"usage":{"total_tokens":1.5}}', undefined, "usage"],
    ['{"usage":{"total_tokens":"12"}}', undefined, "usage"],
    // Beyond Go's table: null counts are absent, a total wins unchecked
    // counts, the sum is bounded, cache writes alone are not a usage.
    ['{"usage":{"total_tokens":null,"prompt_tokens":4}}', 4],
    ['{"usage":{"total_tokens":9,"prompt_tokens":-1}}', 9],
    ['{"usage":{"prompt_tokens":1000000000,"completion_tokens":1000000000}}', MAX_USAGE_TOKENS],
    ['{"usage":{"cache_creation_input_tokens":5}}', undefined],
    ['{"usage":null}', undefined],
    ['[{"usage":{"total_tokens":3}}]', undefined],
    ['{"usage":{"total_tokens":true}}', undefined, "usage"],
    ['{"usage":{"total_tokens":99999999999999999999}}', undefined, "usage"],
  ];
  for (const [json, tokens, field] of cases) {
    let value;
    try {
      value = JSON.parse(json);
    } catch {
      value = json; // a result that is not JSON text is a string of it
    }
    const got = resultUsage(value);
    if (field) {
      assert.equal(got?.field, field, `${json.slice(0, 80)}: ${JSON.stringify(got)}, want the field ${field}`);
      assert.match(got.reason, /./);
    } else if (tokens === undefined) {
      assert.equal(got, undefined, `${json.slice(0, 80)}: ${JSON.stringify(got)}, want nothing`);
    } else {
      assert.deepEqual(got, { tokens }, json);
    }
  }
  // What the task keeps is the result's JSON: a count JSON cannot carry is null there, so absent.
  assert.deepEqual(resultUsage({ usage: { total_tokens: NaN, prompt_tokens: 3 } }), { tokens: 3 });
  assert.equal(resultUsage({ usage: { total_tokens: 1n } }), undefined, "not JSON: the task fails, nothing read");
  assert.equal(resultUsage(null), undefined);
  assert.equal(resultUsage(undefined), undefined);
});

test("worker: a handler that reports nothing settles its result's usage; its own report wins; an unusable usage, a result without one and a failure settle the estimate", async () => {
  const key = `openai/gpt-4.1/${uniq("k")}`;
  await drover.budgets.set(key, { tokens: 100000, window_seconds: DAY });
  const q = uniq("llm");
  const meta = { tenant: "acme", budget: key, estimated_tokens: 50 };
  const results = {
    openai: { choices: [{ message: { content: "hi" } }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 30 } }, // 30
    split: { usage: { prompt_tokens: 10, completion_tokens: 15 } }, // 25
    anthropic: { content: [], usage: { input_tokens: 20, output_tokens: 5, cache_read_input_tokens: 9 } }, // 25
    reported: { usage: { total_tokens: 500 } }, // the handler reports 7
    unusable: { usage: { total_tokens: -3 } }, // 50, a warning
    plain: { text: "no usage" }, // 50
  };
  const ids = [...Object.keys(results), "boom"]; // boom throws: 50
  await drover.submit(q, ids.map((id) => ({ task_id: id, task_type: "llm", metadata: meta, max_retries: 0 })));
  const errors = [];
  const w = drover.worker(q, { concurrency: 2, wait: 1, signals: false, onError: (e) => errors.push(e) }, async (task, ctx) => {
    if (task.task_id === "boom") throw new Error("model down");
    if (task.task_id === "reported") ctx.usage(7);
    return results[task.task_id];
  });
  const want = 30 + 25 + 25 + 7 + 50 + 50 + 50;
  const deadline = Date.now() + 30_000;
  while ((await drover.budgets.get(key)).used < want) {
    assert.ok(Date.now() < deadline, "every task settled");
    await new Promise((r) => setTimeout(r, 100));
  }
  const stats = await w.drain();
  assert.equal(stats.succeeded, 6);
  const u = await drover.budgets.get(key);
  assert.deepEqual([u.used, u.reserved, u.live, u.requests_used], [want, 0, 0, 7]);
  const warnings = errors.map((e) => e.message).filter((m) => /usage is not usable/.test(m));
  assert.equal(warnings.length, 1, `one warning: ${errors.map((e) => e.message)}`);
  assert.match(warnings[0], /task unusable: .*usage\.total_tokens/);
  assert.equal((await drover.tasks.get(q, "openai")).result.usage.total_tokens, 30, "the result is kept as returned");
});
