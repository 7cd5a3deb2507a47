// Receipts from each way an AI SDK loop ends, posted to a real `tripwire serve`, whose answer is
// the health Python's table gives them (the order of DESIGN.md: failed, waiting,
// waiting_unrouted, stuck, bounded_stop, verified/complete, false complete, uncertain).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { generateText, hasToolCall, stepCountIs, tool } from "ai";
import { z } from "zod";
import { TripwireClient, TripwireRun } from "../src/index.js";
import { distinctScript, researchTools, scriptedModel } from "./agents.js";
import { api, startService, tracing, until, type Service } from "./fleet.js";

let service: Service;
let client: TripwireClient;
let provider: ReturnType<typeof tracing>;
const telemetry = (functionId: string) => ({ isEnabled: true, functionId });

before(async () => {
  service = await startService();
  provider = tracing(service);
  client = new TripwireClient({ url: service.url, token: service.token });
});

after(async () => {
  await client.close();
  await provider.shutdown();
  await service.close();
});

async function ends(run: TripwireRun, outcome: Parameters<TripwireRun["finish"]>[0]) {
  const { receipt, answer } = await run.finish(outcome);
  assert.ok(answer?.ok, `the service refused the receipt: ${answer?.error}`);
  return { receipt, health: answer!.health };
}

test("a step cap is a bounded stop (max_steps, with its inputs)", async () => {
  const { model } = scriptedModel(distinctScript(12), 1);
  const { tools, bodies } = researchTools();
  const run = new TripwireRun(client, { agent: "capped", maxSteps: 3 });
  const result = await generateText({ model, prompt: "go", tools: run.tools(tools), stopWhen: [stepCountIs(3), run.stopWhen],
    prepareStep: run.prepareStep, experimental_telemetry: telemetry("capped") });
  assert.equal(bodies.length, 3);
  const { receipt, health } = await ends(run, result);
  assert.deepEqual([receipt.end, receipt.reason, receipt.condition], ["stop_condition", "max_steps", { max_steps: 3, steps: 3 }]);
  assert.equal(health, "bounded_stop");
});

test("an unknown stop condition of the caller's is no completion", async () => {
  const { model } = scriptedModel(distinctScript(12), 1);
  const { tools } = researchTools();
  const run = new TripwireRun(client, { agent: "custom-stop" });
  const result = await generateText({ model, prompt: "go", tools: run.tools(tools), stopWhen: ({ steps }) => steps.length === 2,
    prepareStep: run.prepareStep, experimental_telemetry: telemetry("custom-stop") });
  const { receipt, health } = await ends(run, result);
  assert.equal(receipt.end, "stop_condition");
  assert.equal(receipt.reason, null);
  assert.equal(receipt.condition.finish_reason, "tool-calls");
  assert.notEqual(health, "complete_unverified");
});

test("a done tool (hasToolCall) is an explicit done", async () => {
  const { model } = scriptedModel([...distinctScript(2), { tool: "final_answer", input: { text: "done" } }], 1);
  const { tools } = researchTools();
  const all = { ...tools, final_answer: tool({ inputSchema: z.object({ text: z.string() }), execute: async ({ text }) => text }) };
  const run = new TripwireRun(client, { agent: "done-tool", doneTools: ["final_answer"] });
  const result = await generateText({ model, prompt: "go", tools: run.tools(all), stopWhen: [hasToolCall("final_answer"), run.stopWhen],
    prepareStep: run.prepareStep, experimental_telemetry: telemetry("done-tool") });
  const { receipt, health } = await ends(run, result);
  assert.deepEqual([receipt.end, receipt.reason], ["explicit_done", "completed"]);
  assert.equal(health, "complete_unverified");
});

test("tool errors are counted; the loop that went on to answer completed", async () => {
  const { model } = scriptedModel(distinctScript(3), 1);
  const { tools } = researchTools();
  const failing = { ...tools, fetch_page: tool({ inputSchema: z.object({ url: z.string() }), execute: async (): Promise<string> => { throw new RangeError("boom"); } }) };
  const run = new TripwireRun(client, { agent: "tool-errors" });
  const result = await generateText({ model, prompt: "go", tools: run.tools(failing), stopWhen: [stepCountIs(10), run.stopWhen],
    prepareStep: run.prepareStep, experimental_telemetry: telemetry("tool-errors") });
  const { receipt, health } = await ends(run, result);
  assert.equal(receipt.end, "natural_finish");
  assert.equal(receipt.condition.tool_errors, 1);
  assert.equal(health, "complete_unverified");
  // The failing call reached the service as a failed tool call.
  const failed = (calls: Array<{ tool: string; error_type: string | null }>) => calls.some((c) => c.tool === "fetch_page" && c.error_type === "RangeError");
  const calls = await until(async () => {
    const { body } = await api(service, `/api/runs/${run.traceId}`);
    return body?.calls?.length >= 3 ? body.calls : undefined;
  });
  assert.ok(failed(calls), JSON.stringify(calls));
});

test("an abort is a user abort; a timeout is a timeout", async () => {
  for (const [kind, end, reason, health] of [["abort", "user_abort", "user_cancelled", "bounded_stop"], ["timeout", "timeout", "max_duration", "bounded_stop"]] as const) {
    const { model } = scriptedModel(distinctScript(12), 60);
    const { tools } = researchTools();
    const controller = new AbortController();
    const signal = kind === "timeout" ? AbortSignal.timeout(150) : controller.signal;
    if (kind === "abort") setTimeout(() => controller.abort(), 150);
    const run = new TripwireRun(client, { agent: `ended-by-${kind}` });
    let error: unknown;
    try {
      await generateText({ model, prompt: "go", tools: run.tools(tools), stopWhen: [stepCountIs(20), run.stopWhen], abortSignal: signal,
        prepareStep: run.prepareStep, experimental_telemetry: telemetry(`ended-by-${kind}`) });
    } catch (e) {
      error = e;
    }
    assert.ok(error !== undefined, `${kind}: the call did not throw`);
    const { receipt, health: got } = await ends(run, { error });
    assert.deepEqual([receipt.end, receipt.reason], [end, reason], `${kind}: ${(error as Error).name}`);
    assert.equal(got, health);
  }
});

test("an approval request waits, routed or not", async () => {
  for (const [approval, health] of [[undefined, "waiting_unrouted"], [{ owner: "ops", deadline_s: 4_000_000_000, resume_token: "thread-7" }, "waiting"]] as const) {
    const { model } = scriptedModel([{ tool: "refund", input: { order: "A-1" } }], 1);
    const refund = tool({ inputSchema: z.object({ order: z.string() }), needsApproval: true, execute: async () => "refunded" });
    const run = new TripwireRun(client, { agent: "approver", approval });
    const result = await generateText({ model, prompt: "refund A-1", tools: run.tools({ refund }), stopWhen: [stepCountIs(5), run.stopWhen],
      prepareStep: run.prepareStep, experimental_telemetry: telemetry("approver") });
    const { receipt, health: got } = await ends(run, result);
    assert.deepEqual([receipt.end, receipt.reason], ["approval_requested", "approval_required"]);
    assert.equal(got, health);
  }
});

test("a model that fails ends the run as failed", async () => {
  const { model } = scriptedModel(distinctScript(2), 1);
  const run = new TripwireRun(client, { agent: "broken-model" });
  const { tools } = researchTools();
  const broken = Object.assign(Object.create(Object.getPrototypeOf(model)), model, {
    doGenerate: async () => { throw Object.assign(new Error("upstream 500"), { name: "AI_APICallError" }); },
  });
  let error: unknown;
  try {
    await generateText({ model: broken, prompt: "go", tools: run.tools(tools), maxRetries: 0, prepareStep: run.prepareStep,
      experimental_telemetry: telemetry("broken-model") });
  } catch (e) {
    error = e;
  }
  const { receipt, health } = await ends(run, { error });
  assert.equal(receipt.end, "tool_failure");
  assert.deepEqual(receipt.tool_failure && [receipt.tool_failure.tool, receipt.tool_failure.error_type], ["model", "AI_APICallError"]);
  assert.equal(health, "failed");
});
