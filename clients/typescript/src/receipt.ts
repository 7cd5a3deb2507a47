// Stop receipts in the schema of tripwire's Python receipts (`tripwire.core.receipt.StopReceipt
// .to_dict()`, schema "tripwire.stop_receipt/1"): every field, in the same order. The service
// validates each one strictly and classifies its health with the same table as Python's
// (`tripwire.core.health.classify`: failed, waiting, waiting_unrouted, stuck, bounded_stop,
// verified_complete, complete_unverified / false_complete, uncertain), so a TypeScript run and
// a Python run with the same ending get the same health.

export const SCHEMA = "tripwire.stop_receipt/1";

/** How the agent loop ended, from the control flow (Python's `EndKind`). */
export type EndKind =
  | "natural_finish"
  | "explicit_done"
  | "approval_requested"
  | "stop_condition"
  | "user_abort"
  | "timeout"
  | "tool_failure";

/** Which condition fired (Python's `StopReason`). */
export const STOP_REASONS = [
  "completed",
  "max_steps",
  "max_tool_calls",
  "max_tool_calls_for_tool",
  "max_duplicate_calls",
  "loop_detected",
  "max_input_tokens",
  "max_output_tokens",
  "max_total_tokens",
  "max_cost",
  "max_duration",
  "no_progress",
  "max_subagents",
  "retry_of_non_retryable",
  "tool_error",
  "user_cancelled",
  "approval_required",
] as const;
export type StopReason = (typeof STOP_REASONS)[number];

export type Verdict = "working" | "retrying" | "waiting" | "stuck" | "uncertain";
export type Scalar = string | number | boolean | null;

export interface Counters {
  steps: number;
  tool_calls: number;
  input_tokens: number;
  output_tokens: number;
  cost_usd: number | null;
  duration_s: number | null;
  unpriced_calls: number;
}

export interface Approval {
  owner: string | null;
  deadline_s: number | null;
  resume_token: string | null;
}

export interface ToolFailure {
  tool: string;
  error_type: string;
  call_index: number | null;
  side_effect_uncertain: boolean;
}

export interface AfterStop {
  model_calls: number;
  tool_calls: number;
}

/** A stop receipt, as JSON (the keys and order of Python's `StopReceipt.to_dict()`). */
export interface StopReceipt {
  schema: typeof SCHEMA;
  run_id: string;
  agent: string;
  end: EndKind | null;
  reason: StopReason | null;
  condition: Record<string, Scalar>;
  policy_version: string | null;
  normalizer_version: string | null;
  counters: Counters;
  verdict: Verdict | null;
  approval: Approval | null;
  outcomes: unknown[];
  requires_outcome: "none" | "any" | "independent";
  tool_failure: ToolFailure | null;
  started_at: number | null;
  ended_at: number | null;
  after_stop: AfterStop | null;
}

const MAX_KEYS = 64;
const MAX_TEXT = 500;

/** A `condition` mapping the service accepts: JSON scalars only, short strings, 64 keys, sorted
 * (as Python sorts them). Anything else is left out. */
export function scalars(values: Record<string, unknown>): Record<string, Scalar> {
  const out: Record<string, Scalar> = {};
  for (const key of Object.keys(values).sort()) {
    if (Object.keys(out).length >= MAX_KEYS) break;
    const value = values[key];
    if (value === undefined) continue;
    if (value === null || typeof value === "boolean") out[key] = value;
    else if (typeof value === "number" && Number.isFinite(value)) out[key] = value;
    else if (typeof value === "string") out[key] = value.slice(0, MAX_TEXT);
  }
  return out;
}

/** A stop reason tripwire knows, or `undefined`. */
export function stopReason(value: unknown): StopReason | undefined {
  return typeof value === "string" && (STOP_REASONS as readonly string[]).includes(value) ? (value as StopReason) : undefined;
}

/** A count the service accepts (an integer >= 0). */
export function count(value: unknown): number {
  return typeof value === "number" && Number.isFinite(value) && value >= 0 ? Math.floor(value) : 0;
}
