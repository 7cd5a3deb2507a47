// A `tripwire serve` for the tests, and the agent's OpenTelemetry setup (spans exported over
// OTLP/HTTP to that service). The service is the one named by TRIPWIRE_URL and TRIPWIRE_TOKEN
// (tests/clients/test_typescript.py starts one); without them, one is started here with
// `$TRIPWIRE_PYTHON -c 'from tripwire.cli import main; main()' serve` (default python3).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";

export interface Service {
  url: string;
  token: string;
  close(): Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port;
      server.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export async function startService(): Promise<Service> {
  const url = process.env.TRIPWIRE_URL;
  const token = process.env.TRIPWIRE_TOKEN;
  if (url && token) return { url, token, close: async () => {} };
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "tripwire-ts-"));
  const ownToken = "ts-test-token-0123456789abcdef";
  const python = process.env.TRIPWIRE_PYTHON ?? "python3";
  const child: ChildProcess = spawn(
    python,
    ["-c", "from tripwire.cli import main; main()", "serve", "--port", String(port), "--store", `sqlite:///${join(dir, "runs.db")}`,
      "--spool", "off", "--log-format", "text"], // the default 200 ms reorder window: spans exported one
      // request each arrive out of order, the run's root span often before its last tool spans
    { env: { ...process.env, TRIPWIRE_TOKEN: ownToken }, stdio: ["ignore", "ignore", "pipe"] },
  );
  let said = "";
  child.stderr?.on("data", (chunk) => (said = (said + chunk).slice(-4000)));
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`tripwire serve exited (${child.exitCode}): ${said}`);
    try {
      const got = await fetch(`${base}/healthz`);
      if (got.ok && (await got.json()).started) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`tripwire serve never listened: ${said}`);
    await sleep(50);
  }
  return {
    url: base,
    token: ownToken,
    close: async () => {
      child.kill("SIGTERM");
      await new Promise((resolve) => (child.exitCode !== null ? resolve(null) : child.once("exit", resolve)));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Register a tracer provider (with its context manager) exporting every 50 ms: one batch at a
 * time, so spans arrive in the order they ended (a span per request, as SimpleSpanProcessor
 * sends them, can overtake another by more than the service's reorder window under load). */
export function tracing(service: Service): NodeTracerProvider {
  const exporter = new OTLPTraceExporter({ url: `${service.url}/v1/traces`, headers: { Authorization: `Bearer ${service.token}` } });
  const provider = new NodeTracerProvider({ spanProcessors: [new BatchSpanProcessor(exporter, { scheduledDelayMillis: 50 })] });
  provider.register();
  return provider;
}

/** GET a path of the service's API, as JSON. */
export async function api(service: Service, path: string, init?: RequestInit): Promise<any> {
  const got = await fetch(service.url + path, { ...init, headers: { Authorization: `Bearer ${service.token}`, ...(init?.headers ?? {}) } });
  return { status: got.status, body: await got.json().catch(() => undefined) };
}

/** Until `check` returns something truthy (or throw after `ms`). */
export async function until<T>(check: () => Promise<T | undefined | false>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const got = await check();
    if (got) return got;
    if (Date.now() > deadline) throw new Error("timed out");
    await sleep(50);
  }
}
