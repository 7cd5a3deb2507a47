// Records tests/spans/golden/ai_sdk_*.json from the real `ai` package (run by hand:
// `npm run record-golden`). The working agent (12 different calls, `functionId: "researcher"`)
// runs offline on the SDK's mock model; the selection and cuts follow tests/spans/record_golden.py:
// the first 4 tool spans, the first 2 model spans, every run span, text of non-tool spans cut
// to 300 characters. Expected values in test_golden.py are written by hand, not from this output.
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { generateText, streamText, stepCountIs } from "ai";
import { InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { distinctScript, researchTools, scriptedModel } from "./agents.js";

const GOLDEN = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..", "tests", "spans", "golden");
const MAX_TEXT = 300;

function role(span: ReadableSpan): "tool" | "model" | "run" | "other" {
  const op = span.attributes["ai.operationId"];
  if (op === "ai.toolCall") return "tool";
  if (op === "ai.generateText.doGenerate" || op === "ai.streamText.doStream") return "model";
  if (op === "ai.generateText" || op === "ai.streamText") return "run";
  return "other";
}

const seconds = (t: [number, number]) => t[0] + t[1] / 1e9;

async function record(name: string, run: () => Promise<void>, exporter: InMemorySpanExporter) {
  exporter.reset();
  await run();
  const spans = exporter.getFinishedSpans();
  const base = Math.min(...spans.map((s) => seconds(s.startTime)));
  const limits: Record<string, number> = { tool: 4, model: 2, other: 3 };
  const counts: Record<string, number> = { tool: 0, model: 0, other: 0 };
  const out = [];
  for (const span of spans) {
    const r = role(span);
    if (r !== "run") {
      if (counts[r] >= limits[r]) continue;
      counts[r]++;
    }
    const keep = r === "tool";
    const attributes: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(span.attributes)) {
      attributes[k] = typeof v === "string" && !keep && v.length > MAX_TEXT ? v.slice(0, MAX_TEXT) + "…" : v;
    }
    const exc = span.events.find((e) => e.name === "exception");
    out.push({
      name: span.name,
      trace_id: span.spanContext().traceId,
      span_id: span.spanContext().spanId,
      parent_span_id: span.parentSpanContext?.spanId ?? null,
      start_s: Math.round((seconds(span.startTime) - base) * 1e6) / 1e6,
      end_s: Math.round((seconds(span.endTime) - base) * 1e6) / 1e6,
      status_error: span.status.code === 2,
      status_message: span.status.message ?? null,
      exception_type: span.status.code === 2 ? (exc?.attributes?.["exception.type"] ?? null) : null,
      scope_name: span.instrumentationScope.name,
      attributes,
    });
  }
  const path = join(GOLDEN, `${name}.json`);
  writeFileSync(path, JSON.stringify({ framework: name, spans: out }, null, 1) + "\n");
  console.log(`${path}: ${out.length} spans`);
}

async function main() {
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register();
  const telemetry = { isEnabled: true, functionId: "researcher" };
  await record("ai_sdk_generate_text", async () => {
    const { model } = scriptedModel(distinctScript(12), 1);
    const { tools } = researchTools();
    await generateText({ model, tools, prompt: "Research billing.", stopWhen: stepCountIs(20), experimental_telemetry: telemetry });
  }, exporter);
  await record("ai_sdk_stream_text", async () => {
    const { model } = scriptedModel(distinctScript(12), 1);
    const { tools } = researchTools();
    const result = streamText({ model, tools, prompt: "Research billing.", stopWhen: stepCountIs(20), experimental_telemetry: telemetry });
    await result.consumeStream();
    await result.steps;
  }, exporter);
  // A tool that throws on its first call (the SDK feeds the error to the model and goes on).
  await record("ai_sdk_tool_error", async () => {
    const { model } = scriptedModel(distinctScript(4), 1);
    const { tools } = researchTools();
    let first = true;
    const failing = {
      ...tools,
      search_docs: { ...tools.search_docs, execute: async (input: { query: string }, options: any) => {
        if (first) { first = false; throw new TypeError("search index unavailable"); }
        return tools.search_docs.execute!(input, options);
      } },
    };
    await generateText({ model, tools: failing, prompt: "Research billing.", stopWhen: stepCountIs(20), experimental_telemetry: telemetry });
  }, exporter);
  // Inputs and outputs not recorded: what is left of each call.
  await record("ai_sdk_unrecorded", async () => {
    const { model } = scriptedModel(distinctScript(4), 1);
    const { tools } = researchTools();
    await generateText({ model, tools, prompt: "Research billing.", stopWhen: stepCountIs(20), experimental_telemetry: { ...telemetry, recordInputs: false, recordOutputs: false } });
  }, exporter);
  await provider.shutdown();
}

await main();
