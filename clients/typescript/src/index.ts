// tripwire for TypeScript agents: obey `tripwire serve`'s flags from the Vercel AI SDK and send
// each run's stop receipt. See docs/typescript.md.
export { TripwireClient, type ClientOptions, type Flag, type ReceiptAnswer } from "./client.js";
export { TripwireRun, ToolRefused, type Outcome, type RunOptions, type StepLike } from "./aisdk.js";
export { agentsSteps, type AgentsResultLike } from "./openai-agents.js";
export { SCHEMA, STOP_REASONS, type EndKind, type StopReason, type StopReceipt, type Verdict } from "./receipt.js";
