// The Vercel AI SDK side: one `TripwireRun` per agent run gives
//   - `stopWhen`: a stop condition that ends the tool loop once the run's flag is up,
//   - `prepareStep`: notes the run's trace id before the first model call (so its flag is
//     watched from the start) and the step number,
//   - `tools(...)`: the same tools, each refusing its body while the flag is up,
//   - `receipt(...)` / `finish(...)`: the run's stop receipt from the SDK's result (or the error
//     the call threw), sent to the service.
// The run is known by its OpenTelemetry trace id, read from the active context: the AI SDK
// opens its `ai.generateText` / `ai.streamText` span around the whole loop, so enable
// `experimental_telemetry` and register a tracer provider with a context manager.
import { trace } from "@opentelemetry/api";
import type { Flag, ReceiptAnswer, TripwireClient } from "./client.js";
import {
  type AfterStop,
  type Approval,
  type EndKind,
  SCHEMA,
  type Scalar,
  type StopReason,
  type StopReceipt,
  type ToolFailure,
  type Verdict,
  count,
  scalars,
  stopReason,
} from "./receipt.js";

/** Thrown by a wrapped tool instead of running its body while the run's flag is up. The AI SDK
 * hands it to the model as the tool's error; `stopWhen` then ends the loop after the step. */
export class ToolRefused extends Error {
  readonly flag: Flag;
  constructor(tool: string, flag: Flag) {
    super(`tripwire: ${tool} refused: ${typeof flag.message === "string" && flag.message ? flag.message : "the run was stopped"}`);
    this.name = "ToolRefused";
    this.flag = flag;
  }
}

export interface RunOptions {
  /** The agent's name in the receipt (use the telemetry `functionId`). */
  agent: string;
  /** The `stepCountIs(n)` cap in your `stopWhen`, if any: a loop that ends there is `max_steps`. */
  maxSteps?: number;
  /** Tools whose call ends the run as done (your `hasToolCall(...)` conditions). */
  doneTools?: string[];
  /** What a finished run needs to count as verified (Python's `OutcomeRequirement`). Default `none`. */
  requiresOutcome?: "none" | "any" | "independent";
  /** Who answers an approval request, by when, and how the run resumes (`needsApproval` tools). */
  approval?: { owner?: string; deadline_s?: number; resume_token?: string };
  /** Seconds since the epoch (tests). Default `Date.now() / 1000`. */
  clock?: () => number;
}

/** What `finish()` / `receipt()` take: the AI SDK's result (generateText's, a ToolLoopAgent's,
 * or streamText's once its `steps` resolved), or the error the call threw. */
export type Outcome = { steps: ReadonlyArray<StepLike> | PromiseLike<ReadonlyArray<StepLike>> } | { error: unknown };

/** The parts of the AI SDK's `StepResult` a receipt reads. */
export interface StepLike {
  readonly finishReason: string;
  readonly toolCalls: ReadonlyArray<{ toolName: string }>;
  readonly content: ReadonlyArray<{ type: string; toolName?: string; error?: unknown }>;
  readonly usage?: { inputTokens?: number | undefined; outputTokens?: number | undefined };
}

interface Stopped {
  flag: Flag;
  /** Steps completed when the flag was first seen. */
  step: number;
}

const INVALID_TRACE = "00000000000000000000000000000000";

function activeTraceId(): string | undefined {
  const id = trace.getActiveSpan()?.spanContext().traceId;
  return id && id !== INVALID_TRACE ? id : undefined;
}

/**
 * One agent run. Pass its `stopWhen`, `prepareStep` and `tools(...)` to `generateText`,
 * `streamText` or a `ToolLoopAgent`, then `await run.finish(result)`.
 *
 * Never throws into the agent, except `ToolRefused` from a wrapped tool while the flag is up
 * (the AI SDK turns it into a tool error for the model). With no client (no TRIPWIRE_URL) the
 * run is never stopped and its receipt is built but not sent.
 */
export class TripwireRun {
  readonly agent: string;
  /** The run's trace id, once a step or a tool ran inside the SDK's span. */
  traceId: string | undefined;
  /** The flag that stopped the run (the first one seen), if one did. */
  stopped: Stopped | undefined;
  private readonly client: TripwireClient | undefined;
  private readonly options: RunOptions;
  private readonly clock: () => number;
  private startedAt: number | undefined;
  private step = 0;
  private refusedAfter = 0;
  private refusals = 0;
  private finished: Promise<{ receipt: StopReceipt; answer: ReceiptAnswer | undefined }> | undefined;

  constructor(client: TripwireClient | undefined, options: RunOptions) {
    if (!options || typeof options.agent !== "string" || options.agent === "") {
      throw new TypeError("TripwireRun: agent must be a non-empty string");
    }
    this.client = client;
    this.options = options;
    this.agent = options.agent;
    this.clock = options.clock ?? (() => Date.now() / 1000);
  }

  /** A `stopWhen` condition: true once the run's flag is up (a local read, no network). */
  readonly stopWhen = (options: { steps: ReadonlyArray<unknown> }): boolean => {
    this.note();
    this.step = Math.max(this.step, options.steps.length);
    return this.check() !== undefined;
  };

  /** A `prepareStep` function: notes the trace id and the step; changes nothing. */
  readonly prepareStep = (options: { stepNumber: number }): undefined => {
    this.note();
    if (typeof options?.stepNumber === "number") this.step = Math.max(this.step, options.stepNumber);
    return undefined;
  };

  /** The same tools, each refusing its body (throwing `ToolRefused`) while the flag is up. */
  tools<T extends Record<string, unknown>>(tools: T): T {
    const out: Record<string, unknown> = {};
    for (const [name, tool] of Object.entries(tools)) {
      const execute = (tool as { execute?: unknown } | null)?.execute;
      if (typeof execute !== "function") {
        out[name] = tool;
        continue;
      }
      const run = this;
      out[name] = {
        ...(tool as object),
        execute(this: unknown, ...args: unknown[]) {
          run.note();
          const flag = run.check();
          if (flag !== undefined) {
            // The first refusal is the stop itself; later attempts are activity after it.
            if (run.refusals++ > 0) run.refusedAfter++;
            throw new ToolRefused(name, flag);
          }
          return (execute as (...a: unknown[]) => unknown).apply(this, args);
        },
      };
    }
    return out as T;
  }

  /** The run's stop receipt from the SDK's result or the error it threw (nothing is sent). */
  async receipt(outcome: Outcome): Promise<StopReceipt> {
    const ended = this.clock();
    const started = this.startedAt ?? ended;
    let steps: ReadonlyArray<StepLike> = [];
    let error: unknown;
    if ("error" in outcome) error = outcome.error;
    else steps = (await outcome.steps) ?? [];

    let input = 0;
    let output = 0;
    let toolCalls = 0;
    let toolErrors = 0;
    let lastError: { tool: string; type: string; index: number } | undefined;
    for (const step of steps) {
      input += count(step.usage?.inputTokens);
      output += count(step.usage?.outputTokens);
      toolCalls += step.toolCalls?.length ?? 0;
      for (const part of step.content ?? []) {
        if (part.type === "tool-error" && !(part.error instanceof ToolRefused)) {
          toolErrors++;
          lastError = { tool: part.toolName ?? "tool", type: errorType(part.error), index: toolCalls };
        }
      }
    }
    const last = steps.length > 0 ? steps[steps.length - 1] : undefined;
    const finish = last?.finishReason;

    let end: EndKind | null = null;
    let reason: StopReason | null = null;
    let condition: Record<string, unknown> = {};
    let verdict: Verdict = "working";
    let approval: Approval | null = null;
    let toolFailure: ToolFailure | null = null;
    let afterStop: AfterStop | null = null;
    const stop = this.stopped;
    if (stop !== undefined) {
      // The fleet's flag stopped the run (first cause wins, whatever the loop did after).
      const flag = stop.flag;
      const origin = { by: text(flag.kind === "operator" ? (flag.actor ?? flag.by) : flag.by), at: num(flag.at) };
      if (flag.kind === "operator") {
        end = "user_abort";
        reason = "user_cancelled";
        condition = { source: "operator", ...origin, via: text(flag.via) };
      } else if (flag.kind === "loop") {
        end = "stop_condition";
        reason = stopReason(flag.reason) ?? "loop_detected";
        verdict = "stuck";
        condition = {
          rule: text(flag.rule), tool: text(flag.tool), hits: num(flag.hits), window: num(flag.window),
          period: num(flag.period), call_index: num(flag.call_index), source: "fleet", ...origin,
        };
      } else {
        reason = stopReason(flag.reason) ?? "user_cancelled";
        end = reason === "user_cancelled" ? "user_abort" : reason === "max_duration" ? "timeout" : "stop_condition";
        condition = { limit_name: text(flag.limit_name), limit: num(flag.limit), observed: num(flag.observed), source: "fleet", ...origin };
      }
      afterStop = { model_calls: Math.max(0, steps.length - stop.step - 1), tool_calls: this.refusedAfter };
      if (error !== undefined && steps.length === 0) afterStop = { model_calls: 0, tool_calls: this.refusedAfter };
    } else if (error !== undefined) {
      const name = errorType(error);
      if (name === "MaxTurnsExceededError") {
        // OpenAI Agents JS: run(..., { maxTurns }) ran out of turns (say `maxSteps: maxTurns`).
        end = "stop_condition";
        reason = "max_steps";
        condition = { max_steps: this.options.maxSteps };
      } else if (name === "TimeoutError") {
        end = "timeout";
        reason = "max_duration";
        condition = { source: "abort_signal", duration_s: round(ended - started) };
      } else if (name === "AbortError") {
        end = "user_abort";
        reason = "user_cancelled";
        condition = { source: "abort_signal" };
      } else {
        end = "tool_failure";
        reason = "tool_error";
        const model = /APICall|NoContent|NoSuchModel|InvalidResponse|RetryError|LoadAPIKey/.test(name);
        toolFailure = { tool: model ? "model" : "run", error_type: name.slice(0, 100), call_index: null, side_effect_uncertain: true };
      }
    } else if (last === undefined) {
      end = null; // nothing ran: no cause to report
    } else if (last.content.some((p) => p.type === "tool-approval-request")) {
      end = "approval_requested";
      reason = "approval_required";
      const a = this.options.approval ?? {};
      approval = { owner: a.owner ?? null, deadline_s: a.deadline_s ?? null, resume_token: a.resume_token ?? null };
    } else if (finish === "stop") {
      end = "natural_finish";
      reason = "completed";
    } else if (finish === "tool-calls") {
      // The loop ended while the model still asked for tools: a stopWhen condition fired.
      const done = this.options.doneTools ?? [];
      const max = this.options.maxSteps;
      if (last.toolCalls.some((c) => done.includes(c.toolName))) {
        end = "explicit_done";
        reason = "completed";
        condition = { tool: last.toolCalls.find((c) => done.includes(c.toolName))?.toolName };
      } else if (max !== undefined && steps.length >= max) {
        end = "stop_condition";
        reason = "max_steps";
        condition = { steps: steps.length, max_steps: max };
      } else {
        end = "stop_condition"; // a condition of the caller's own: which one is not known
        condition = { steps: steps.length, tool_calls: toolCalls, finish_reason: finish };
      }
    } else if (finish === "length") {
      end = "stop_condition";
      reason = "max_output_tokens";
      condition = { finish_reason: finish, output_tokens: output };
    } else if (finish === "error") {
      end = "tool_failure";
      reason = "tool_error";
      toolFailure = { tool: "model", error_type: "finish_reason:error", call_index: null, side_effect_uncertain: true };
    } else {
      condition = { finish_reason: finish ?? null }; // content-filter, other: no cause tripwire can name
    }
    if (toolErrors > 0) {
      condition.tool_errors = toolErrors;
      if (lastError !== undefined && end === "tool_failure" && toolFailure === null) {
        toolFailure = { tool: lastError.tool, error_type: lastError.type, call_index: lastError.index, side_effect_uncertain: true };
      }
    }
    return {
      schema: SCHEMA,
      run_id: this.traceId ?? INVALID_TRACE,
      agent: this.agent,
      end,
      reason,
      condition: scalars(condition) as Record<string, Scalar>,
      policy_version: null,
      normalizer_version: null,
      counters: {
        steps: steps.length,
        tool_calls: toolCalls,
        input_tokens: input,
        output_tokens: output,
        cost_usd: null,
        duration_s: Math.max(0, round(ended - started)),
        unpriced_calls: 0,
      },
      verdict,
      approval,
      outcomes: [],
      requires_outcome: this.options.requiresOutcome ?? "none",
      tool_failure: toolFailure,
      started_at: round(started),
      ended_at: round(Math.max(ended, started)),
      after_stop: afterStop,
    };
  }

  /**
   * Build the receipt, send it to the service (when there is a client and a trace id) and stop
   * watching the run's flag. Once per run: later calls return the first answer. Never throws.
   */
  finish(outcome: Outcome): Promise<{ receipt: StopReceipt; answer: ReceiptAnswer | undefined }> {
    this.finished ??= (async () => {
      const receipt = await this.receipt(outcome);
      let answer: ReceiptAnswer | undefined;
      if (this.client !== undefined && this.traceId !== undefined) {
        answer = await this.client.sendReceipt(receipt);
        this.client.unwatch(this.traceId);
      }
      return { receipt, answer };
    })();
    return this.finished;
  }

  private note(): void {
    this.startedAt ??= this.clock();
    if (this.traceId !== undefined) return;
    const id = activeTraceId();
    if (id === undefined) return;
    this.traceId = id;
    this.client?.watch(id);
  }

  private check(): Flag | undefined {
    if (this.stopped !== undefined) return this.stopped.flag;
    if (this.traceId === undefined || this.client === undefined) return undefined;
    const flag = this.client.flag(this.traceId);
    if (flag !== undefined) this.stopped = { flag, step: this.step };
    return flag;
  }
}

function errorType(error: unknown): string {
  if (error instanceof Error || (typeof error === "object" && error !== null && "name" in error)) {
    const name = (error as { name?: unknown }).name;
    if (typeof name === "string" && name) return name;
  }
  return "Error";
}

function text(value: unknown): string | null {
  return typeof value === "string" && value ? value.slice(0, 200) : null;
}

function num(value: unknown): number | null {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function round(seconds: number): number {
  return Math.round(seconds * 1e6) / 1e6;
}
