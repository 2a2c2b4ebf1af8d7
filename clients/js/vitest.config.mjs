import { defineConfig } from "vitest/config";

// Only LangGraph's conformance suite runs under vitest (it needs its
// globals); the rest of the tests run with node --test.
export default defineConfig({
  test: {
    include: ["test/validation/**/*.test.mjs"],
    globals: true,
    testTimeout: 30_000,
    hookTimeout: 600_000,
    fileParallelism: false,
  },
});
