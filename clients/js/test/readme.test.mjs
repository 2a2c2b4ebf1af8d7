// The README's install steps and its plain JavaScript: `npm pack` writes
// the tarball the README names, it installs into an empty app without the
// network, and every ```js block of the README runs from that app as an
// .mjs file under this Node (20 or later, as package.json's engines say).
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { jsRoot, sharedServer, uniq } from "./helpers/server.mjs";

const run = promisify(execFile);
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const readme = readFileSync(join(jsRoot, "README.md"), "utf8");
const pkg = JSON.parse(readFileSync(join(jsRoot, "package.json"), "utf8"));
const tarball = `droverhq-client-${pkg.version}.tgz`;

let srv;
let dir;
before(async () => {
  srv = await sharedServer();
  dir = mkdtempSync(join(tmpdir(), "drover-readme-"));
});
after(async () => {
  await srv.release();
  rmSync(dir, { recursive: true, force: true });
});

/** The README's ```js blocks, with the line each starts on. */
function jsBlocks() {
  const out = [];
  for (const m of readme.matchAll(/```js\n([\s\S]*?)```/g)) {
    out.push({ line: readme.slice(0, m.index).split("\n").length, code: m[1] });
  }
  return out;
}

test("the README installs the packed tarball and runs its plain JavaScript on this Node", async () => {
  assert.ok(Number(process.versions.node.split(".")[0]) >= Number(pkg.engines.node.replace(">=", "")));
  assert.match(readme, new RegExp(`npm pack .*writes ${tarball.replace(/\./g, "\\.")}`));
  assert.match(readme, new RegExp(`npm install /path/to/drover/clients/js/${tarball.replace(/\./g, "\\.")}`));

  const packDir = join(dir, "pack");
  mkdirSync(packDir);
  const { stdout: packOut } = await run(npm, ["pack", "--pack-destination", packDir, "--silent"], { cwd: jsRoot, timeout: 120_000 });
  assert.equal(packOut.trim().split("\n").pop(), tarball, "npm pack wrote another name than the README says");
  const tgz = join(packDir, tarball);
  assert.ok(existsSync(tgz));

  const app = join(dir, "app");
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true }));
  await run(npm, ["install", "--offline", "--no-audit", "--no-fund", "--silent", tgz], { cwd: app, timeout: 120_000 });

  const blocks = jsBlocks();
  assert.ok(blocks.length >= 1, "the README has no plain JavaScript example");
  for (const { line, code } of blocks) {
    const file = join(app, `readme-${line}.mjs`);
    writeFileSync(file, code);
    const env = { ...process.env, DROVER_URL: srv.url, DROVER_NAMESPACE: uniq("readme") };
    try {
      const { stdout } = await run(process.execPath, [file], { cwd: app, env, timeout: 60_000 });
      assert.ok(stdout.length > 0, `README.md line ${line} printed nothing`);
    } catch (err) {
      assert.fail(`README.md line ${line} failed under node ${process.version}:\n${err.stderr ?? err}`);
    }
  }
});
