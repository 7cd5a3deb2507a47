// Every ```ts block of docs/typescript.md runs as written: each is type-stripped with the
// TypeScript compiler, written next to this package (so `ai`, `@opentelemetry/*` and
// `tripwire-client` resolve), and run with node against the test's `tripwire serve`
// (TRIPWIRE_URL, TRIPWIRE_TOKEN). A block must exit 0.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import ts from "typescript";
import { startService, type Service } from "./fleet.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const PACKAGE = join(HERE, "..", "..");
const DOC = join(PACKAGE, "..", "..", "docs", "typescript.md");
const run = promisify(execFile);

const text = readFileSync(DOC, "utf8");
const blocks = [...text.matchAll(/^```ts\n([\s\S]*?)^```/gm)].map((m) => ({
  line: text.slice(0, m.index).split("\n").length + 1,
  code: m[1],
}));

let service: Service;
before(async () => {
  service = await startService();
});
after(async () => {
  await service.close();
});

test("docs/typescript.md has TypeScript blocks", () => {
  assert.ok(blocks.length >= 1, `${blocks.length} blocks`);
});

for (const { line, code } of blocks) {
  test(`docs/typescript.md:${line} runs as written`, async () => {
    const js = ts.transpileModule(code, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
    const dir = join(PACKAGE, "dist", "snippets");
    mkdirSync(dir, { recursive: true });
    const file = join(dir, `typescript-md-${line}.mjs`);
    writeFileSync(file, js);
    const env = { ...process.env, TRIPWIRE_URL: service.url, TRIPWIRE_TOKEN: service.token };
    try {
      await run(process.execPath, [file], { cwd: PACKAGE, env, timeout: 60_000 });
    } catch (error) {
      const e = error as { stdout?: string; stderr?: string; message: string };
      assert.fail(`docs/typescript.md:${line} failed: ${e.message}\n${e.stdout ?? ""}\n${e.stderr ?? ""}`);
    }
  });
}
