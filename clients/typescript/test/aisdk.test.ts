// The acceptance tests of issue 42, with the real `ai` package and its mock model, exporting
// OTLP to a real `tripwire serve`: a looping agent stops through stopWhen within 3 tool bodies
// of the call that tripped the fleet's verdict; a healthy agent with 30 different calls is
// untouched; an operator's Kill stops a run; every run's receipt reaches the service.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { generateText, stepCountIs, streamText, ToolLoopAgent } from "ai";
import { TripwireClient, TripwireRun } from "../src/index.js";
import { distinctScript, loopScript, researchTools, scriptedModel } from "./agents.js";
import { api, startService, tracing, until, type Service } from "./fleet.js";

let service: Service;
let client: TripwireClient;
let provider: ReturnType<typeof tracing>;
const MODEL_MS = 200; // a model thinks: the flag has time to come back between steps
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

async function endedRow(traceId: string, source?: string) {
  return until(async () => {
    const { status, body } = await api(service, `/api/runs/${traceId}`);
    if (status !== 200 || body.status !== "ended" || !body.receipt) return undefined;
    if (source !== undefined && body.receipt.condition?.source !== source) return undefined;
    return body;
  });
}

test("a looping generateText agent stops through stopWhen within 3 bodies of the flagged call", async () => {
  const { model, calls } = scriptedModel(loopScript(12), MODEL_MS);
  const { tools, bodies } = researchTools();
  const run = new TripwireRun(client, { agent: "looper", maxSteps: 20 });
  const result = await generateText({
    model, prompt: "Find the refund policy.", tools: run.tools(tools),
    stopWhen: [stepCountIs(20), run.stopWhen], prepareStep: run.prepareStep,
    experimental_telemetry: telemetry("looper"),
  });
  // The fleet judges the 4th identical call stuck; what ran after it is bounded.
  assert.ok(bodies.length >= 4, `${bodies.length} bodies`);
  assert.ok(bodies.length - 4 <= 3, `${bodies.length - 4} bodies ran after the flagged 4th call`);
  assert.ok(run.stopped !== undefined && run.stopped.flag.kind === "loop", "the run saw its flag");
  // stopWhen ended the loop: no model call after the step that saw the flag, no final answer.
  assert.equal(calls(), result.steps.length);
  assert.ok(result.steps.length < 13);
  assert.equal(result.finishReason, "tool-calls");
  console.log(`loop (generateText): ${bodies.length} bodies, ${bodies.length - 4} after the flagged 4th call, ${calls()} model calls`);

  const { receipt, answer } = await run.finish(result);
  assert.equal(receipt.run_id, run.traceId);
  assert.equal(receipt.end, "stop_condition");
  assert.equal(receipt.reason, "loop_detected");
  assert.equal(receipt.verdict, "stuck");
  assert.equal(receipt.condition.source, "fleet");
  // The flagged call: the 4th identical one (the 5th when the service judged it late, under load).
  const flagged = receipt.condition.call_index as number;
  assert.ok(flagged >= 4 && bodies.length - flagged <= 3, `flagged at ${flagged}, ${bodies.length} bodies`);
  assert.equal(receipt.counters.tool_calls, result.steps.reduce((n, s) => n + s.toolCalls.length, 0));
  assert.deepEqual(answer && { ok: answer.ok, health: answer.health }, { ok: true, health: "stuck" });
  const row = await endedRow(run.traceId!, "fleet");
  assert.equal(row.health, "stuck");
  assert.equal(row.stop_reason, "loop_detected");
  assert.equal(row.receipt.reason, "loop_detected");
  assert.equal(row.agent, "looper");
});

test("a looping streamText agent stops the same way", async () => {
  const { model, calls } = scriptedModel(loopScript(12), MODEL_MS);
  const { tools, bodies } = researchTools();
  const run = new TripwireRun(client, { agent: "stream-looper", maxSteps: 20 });
  const result = streamText({
    model, prompt: "Find the refund policy.", tools: run.tools(tools),
    stopWhen: [stepCountIs(20), run.stopWhen], prepareStep: run.prepareStep,
    experimental_telemetry: telemetry("stream-looper"),
  });
  await result.consumeStream();
  const steps = await result.steps;
  assert.ok(bodies.length >= 4 && bodies.length - 4 <= 3, `${bodies.length} bodies`);
  assert.equal(calls(), steps.length);
  console.log(`loop (streamText): ${bodies.length} bodies, ${bodies.length - 4} after the flagged 4th call, ${calls()} model calls`);
  const { receipt, answer } = await run.finish({ steps });
  assert.equal(receipt.reason, "loop_detected");
  assert.equal(answer?.health, "stuck");
  const row = await endedRow(run.traceId!, "fleet");
  assert.equal(row.health, "stuck");
});

test("a healthy ToolLoopAgent with 30 different calls is untouched", async () => {
  const script = distinctScript(30);
  const { model, calls } = scriptedModel(script, 5);
  const { tools, bodies } = researchTools();
  const run = new TripwireRun(client, { agent: "researcher", maxSteps: 40 });
  const agent = new ToolLoopAgent({
    model, tools: run.tools(tools), stopWhen: [stepCountIs(40), run.stopWhen], prepareStep: run.prepareStep,
    experimental_telemetry: telemetry("researcher"),
  });
  const result = await agent.generate({ prompt: "Research everything." });
  assert.equal(bodies.length, 30);
  assert.equal(calls(), 31);
  assert.equal(result.finishReason, "stop");
  assert.equal(run.stopped, undefined, JSON.stringify(run.stopped));
  const { receipt, answer } = await run.finish(result);
  assert.equal(receipt.end, "natural_finish");
  assert.equal(receipt.reason, "completed");
  assert.deepEqual(receipt.condition, {});
  assert.equal(receipt.counters.steps, 31);
  assert.equal(receipt.counters.tool_calls, 30);
  assert.equal(receipt.counters.input_tokens, 310);
  assert.equal(answer?.health, "complete_unverified");
  const row = await endedRow(run.traceId!);
  const seen = JSON.stringify({ ...row, calls: undefined, receipt: undefined });
  assert.equal(row.verdict, "working", seen);
  assert.equal(row.health, "complete_unverified", seen);
  assert.equal(row.tool_calls, 30, seen);
  assert.equal(row.flag, null, seen);
});

test("an operator's Kill stops a run and its receipt says who", async () => {
  const { model, calls } = scriptedModel(distinctScript(30), MODEL_MS);
  const { tools, bodies } = researchTools();
  const run = new TripwireRun(client, { agent: "killed", maxSteps: 40 });
  let killedAt = -1;
  const killer = (async () => {
    await until(async () => (bodies.length >= 3 && run.traceId ? true : undefined));
    await until(async () => ((await api(service, `/api/runs/${run.traceId}`)).status === 200 ? true : undefined));
    killedAt = bodies.length;
    const got = await api(service, `/api/runs/${run.traceId}/kill`, { method: "POST" });
    assert.equal(got.status, 200);
  })();
  const result = await generateText({
    model, prompt: "Research everything.", tools: run.tools(tools),
    stopWhen: [stepCountIs(40), run.stopWhen], prepareStep: run.prepareStep,
    experimental_telemetry: telemetry("killed"),
  });
  await killer;
  assert.ok(bodies.length - killedAt <= 3, `${bodies.length - killedAt} bodies after the Kill`);
  assert.ok(bodies.length < 30);
  assert.equal(calls(), result.steps.length);
  console.log(`operator kill: ${bodies.length - killedAt} bodies after the Kill`);
  const { receipt, answer } = await run.finish(result);
  assert.equal(receipt.end, "user_abort");
  assert.equal(receipt.reason, "user_cancelled");
  assert.equal(receipt.condition.source, "operator");
  assert.equal(receipt.condition.via, "api");
  assert.equal(typeof receipt.condition.by, "string");
  assert.equal(answer?.health, "bounded_stop");
  const row = await endedRow(run.traceId!, "operator");
  assert.equal(row.health, "bounded_stop");
  assert.equal(row.receipt.condition.by, receipt.condition.by);
});
