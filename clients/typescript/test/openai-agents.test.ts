// OpenAI Agents JS (the real @openai/agents-core, a scripted Model of its interface): its
// maxTurns stop and a finished run, as receipts posted to a real `tripwire serve`. Its tracing
// does not reach OTLP (see docs/typescript.md): no flag can stop it here.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Agent, run, setTraceProcessors, tool, Usage } from "@openai/agents-core";
import { z } from "zod";
import { agentsSteps, TripwireClient, TripwireRun } from "../src/index.js";
import { startService, type Service } from "./fleet.js";

let service: Service;
let client: TripwireClient;
before(async () => {
  setTraceProcessors([]); // nothing is sent to the OpenAI platform
  service = await startService();
  client = new TripwireClient({ url: service.url, token: service.token });
});
after(async () => {
  await client.close();
  await service.close();
});

function scripted(calls: number) {
  let n = 0;
  return {
    calls: () => n,
    model: {
      async getResponse() {
        const i = n++;
        return {
          usage: new Usage({ requests: 1, inputTokens: 10, outputTokens: 3, totalTokens: 13 }),
          output: i < calls
            ? [{ type: "function_call" as const, callId: `call_${i}`, name: "search_docs", arguments: '{"query":"refund policy"}', status: "completed" as const }]
            : [{ type: "message" as const, role: "assistant" as const, status: "completed" as const, content: [{ type: "output_text" as const, text: "done" }] }],
          responseId: `resp_${i}`,
        };
      },
      async *getStreamedResponse() {},
    },
  };
}

function agentWith(model: ReturnType<typeof scripted>["model"], bodies: { n: number }) {
  const search = tool({ name: "search_docs", description: "Search.", parameters: z.object({ query: z.string() }),
    execute: async ({ query }) => { bodies.n++; return `no results for ${query}`; } });
  return new Agent({ name: "researcher", model, tools: [search] });
}

// The receipt is posted under a trace id of our own: the SDK's trace ids are not OpenTelemetry's.
const traceId = () => [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, "0")).join("");

test("maxTurns ends a looping run: a bounded stop (max_steps)", async () => {
  const { model, calls } = scripted(50);
  const bodies = { n: 0 };
  const tw = new TripwireRun(client, { agent: "researcher", maxSteps: 5 });
  tw.traceId = traceId();
  let error: unknown;
  try {
    await run(agentWith(model, bodies), "What is the refund policy?", { maxTurns: 5 });
  } catch (e) {
    error = e;
  }
  assert.equal((error as Error)?.name, "MaxTurnsExceededError");
  assert.equal(calls(), 5);
  const { receipt, answer } = await tw.finish({ error });
  assert.deepEqual([receipt.end, receipt.reason, receipt.condition], ["stop_condition", "max_steps", { max_steps: 5 }]);
  assert.equal(answer?.health, "bounded_stop");
});

test("a finished run completes; its counters come from the model responses", async () => {
  const { model } = scripted(3);
  const bodies = { n: 0 };
  const tw = new TripwireRun(client, { agent: "researcher", maxSteps: 10 });
  tw.traceId = traceId();
  const result = await run(agentWith(model, bodies), "What is the refund policy?", { maxTurns: 10 });
  assert.equal(bodies.n, 3);
  const { receipt, answer } = await tw.finish({ steps: agentsSteps(result) });
  assert.deepEqual([receipt.end, receipt.reason], ["natural_finish", "completed"]);
  assert.deepEqual([receipt.counters.steps, receipt.counters.tool_calls, receipt.counters.input_tokens], [4, 3, 40]);
  assert.equal(answer?.health, "complete_unverified");
});
