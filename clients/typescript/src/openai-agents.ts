// OpenAI Agents JS (`@openai/agents`): its runs' receipts. Its tracing is its own (trace
// processors; by default sent to the OpenAI platform), not OpenTelemetry, so `tripwire serve`
// sees none of its spans and raises no flag for them; what is here is the receipt path:
// `agentsSteps(result)` turns a `RunResult` into the steps `TripwireRun.finish` reads, and a
// `MaxTurnsExceededError` thrown by `run(..., { maxTurns })` is read as the `max_steps` stop.
// Structural types only: this module imports nothing from the package.
import type { StepLike } from "./aisdk.js";

/** The parts of an OpenAI Agents `RunResult` a receipt reads. */
export interface AgentsResultLike {
  readonly rawResponses: ReadonlyArray<{
    readonly output: ReadonlyArray<{ type?: string; name?: string }>;
    readonly usage?: { inputTokens?: number; outputTokens?: number };
  }>;
  readonly interruptions?: ReadonlyArray<{ rawItem?: object; toolName?: string }>;
}

/** The steps of an OpenAI Agents run (one per model response), for `TripwireRun.finish`:
 * `run.finish({ steps: agentsSteps(result) })`. A run paused for approvals (`interruptions`)
 * ends on a step that requests them. */
export function agentsSteps(result: AgentsResultLike): StepLike[] {
  const steps: StepLike[] = result.rawResponses.map((response) => {
    const calls = response.output.filter((item) => item.type === "function_call").map((item) => ({ toolName: String(item.name ?? "tool") }));
    return {
      finishReason: calls.length > 0 ? "tool-calls" : "stop",
      toolCalls: calls,
      content: calls.map((c) => ({ type: "tool-call", toolName: c.toolName })),
      usage: { inputTokens: response.usage?.inputTokens, outputTokens: response.usage?.outputTokens },
    };
  });
  const pending = result.interruptions ?? [];
  if (pending.length > 0 && steps.length > 0) {
    const last = steps[steps.length - 1];
    steps[steps.length - 1] = {
      ...last,
      content: [...last.content, ...pending.map((p) => ({ type: "tool-approval-request", toolName: p.toolName ?? (p.rawItem as { name?: string } | undefined)?.name }))],
    };
  }
  return steps;
}
