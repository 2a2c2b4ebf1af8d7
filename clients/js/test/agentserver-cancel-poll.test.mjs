// How often the Agent Server runtime reads a running run's task to see a
// cancel: every cancelPollMs while few runs are under way, less often when
// many are (at most 40 reads a second in all), but never less often than
// every 2 s, so that a cancel is seen within 2 s however many runs the
// runtime executes at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { cancelPollEvery } from "../dist/agentserver.js";

test("agentserver cancel poll: the runtime-wide cap stretches the interval, up to a bound", () => {
  assert.equal(cancelPollEvery(250, 1), 250);
  assert.equal(cancelPollEvery(250, 10), 250); // 10 runs: 40 reads a second at 250 ms
  assert.equal(cancelPollEvery(250, 64), 1600); // 64 runs: 40 reads a second
  assert.equal(cancelPollEvery(250, 80), 2000);
  // Past 80 runs the bound holds: a cancel waits at most 2 s for its read.
  for (const running of [81, 200, 1000, 100_000]) assert.equal(cancelPollEvery(250, running), 2000, `${running} runs`);
  // A cancelPollMs longer than the bound is the caller's choice, kept.
  assert.equal(cancelPollEvery(60_000, 1000), 60_000);
});
