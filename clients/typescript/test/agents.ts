// The scripted agents the tests and the golden-span recorder run: the AI SDK's own mock model
// (`MockLanguageModelV3` from `ai/test`) asking for tool calls from a fixed script, offline.
import { simulateReadableStream, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";

export const TOPICS = ["billing", "shipping", "returns", "warranty", "invoices", "accounts"];
export const PAGES = ["faq", "pricing", "contact", "terms", "privacy", "status"];
export const LOOP_ARGS = { query: "refund policy" };
export const INPUT_TOKENS = 10;
export const OUTPUT_TOKENS = 3;

export type Call = { tool: string; input: Record<string, unknown> };

/** The working script: search_docs / fetch_page alternating, each with different arguments. */
export function distinctScript(n = 12): Call[] {
  const calls: Call[] = [];
  for (let i = 0; calls.length < n; i++) {
    const topic = TOPICS[i % TOPICS.length] + (i >= TOPICS.length ? ` part ${"abcdefghij"[Math.floor(i / TOPICS.length)]}` : "");
    const page = PAGES[i % PAGES.length] + (i >= PAGES.length ? `-${"abcdefghij"[Math.floor(i / PAGES.length)]}` : "");
    calls.push({ tool: "search_docs", input: { query: topic } });
    if (calls.length < n) calls.push({ tool: "fetch_page", input: { url: `https://docs.example/${page}` } });
  }
  return calls;
}

/** The looping script: the same search, `n` times. */
export function loopScript(n = 8): Call[] {
  return Array.from({ length: n }, () => ({ tool: "search_docs", input: { ...LOOP_ARGS } }));
}

const usage = {
  inputTokens: { total: INPUT_TOKENS, noCache: INPUT_TOKENS, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: OUTPUT_TOKENS, text: OUTPUT_TOKENS, reasoning: undefined },
};

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** What the scripted model answers at its `i`-th call: the i-th tool call, then a final text. */
function answer(script: Call[], i: number) {
  if (i < script.length) {
    const call = script[i];
    return {
      content: [
        { type: "tool-call" as const, toolCallId: `call_${i}`, toolName: call.tool, input: JSON.stringify(call.input) },
      ],
      finishReason: { unified: "tool-calls" as const, raw: "tool_calls" },
    };
  }
  return {
    content: [{ type: "text" as const, text: "Here is what I found." }],
    finishReason: { unified: "stop" as const, raw: "stop" },
  };
}

export type Scripted = { model: MockLanguageModelV3; calls: () => number };

/**
 * A mock model that plays `script` (generate and stream alike). `delayMs` per call: a mock that
 * answers in 0 ms ends spans faster than an OTLP exporter sends them.
 */
export function scriptedModel(script: Call[], delayMs = 2): Scripted {
  let n = 0;
  const model = new MockLanguageModelV3({
    provider: "mock-provider",
    modelId: "mock-model-id",
    doGenerate: async () => {
      const i = n++;
      await sleep(delayMs);
      const { content, finishReason } = answer(script, i);
      return { content, finishReason, usage, warnings: [], response: { id: `resp_${i}`, modelId: "mock-model-id", timestamp: new Date(0) } };
    },
    doStream: async () => {
      const i = n++;
      await sleep(delayMs);
      const { content, finishReason } = answer(script, i);
      const chunks: any[] = [{ type: "stream-start", warnings: [] }, { type: "response-metadata", id: `resp_${i}`, modelId: "mock-model-id", timestamp: new Date(0) }];
      for (const part of content) {
        if (part.type === "text") {
          chunks.push({ type: "text-start", id: "t0" }, { type: "text-delta", id: "t0", delta: part.text }, { type: "text-end", id: "t0" });
        } else {
          chunks.push(part);
        }
      }
      chunks.push({ type: "finish", finishReason, usage });
      return { stream: simulateReadableStream({ chunks }) };
    },
  });
  return { model, calls: () => n };
}

/** The two tools, counting the bodies that ran (`delayMs` per body). */
export function researchTools(delayMs = 0) {
  const log: string[] = [];
  const tools = {
    search_docs: tool({
      description: "Search the documentation.",
      inputSchema: z.object({ query: z.string() }),
      execute: async ({ query }) => {
        log.push("search_docs");
        if (delayMs) await sleep(delayMs);
        return query === LOOP_ARGS.query ? "no results" : `results about ${query}`;
      },
    }),
    fetch_page: tool({
      description: "Fetch a documentation page.",
      inputSchema: z.object({ url: z.string() }),
      execute: async ({ url }) => {
        log.push("fetch_page");
        if (delayMs) await sleep(delayMs);
        return `<html>${url}</html>`;
      },
    }),
  };
  return { tools, bodies: log };
}
