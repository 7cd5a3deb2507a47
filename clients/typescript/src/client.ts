// The connection to `tripwire serve`: flags kept fresh by the long poll (POST /api/flags/wait),
// polling (POST /api/flags) when the service has no long poll, and stop receipts posted to
// POST /api/runs/{trace_id}/receipt. Nothing here blocks an agent: reads are local, the
// network runs in the background, failures are logged once and degrade as documented.

/** A kill flag as the service stores it (the JSON object of GET /api/flags/{trace_id}). */
export interface Flag {
  trace_id: string;
  /** `loop`, `budget` or `operator`. */
  kind?: string;
  /** A tripwire stop reason (`loop_detected`, `user_cancelled`, `max_cost`…). */
  reason?: string;
  message?: string;
  /** When the flag went up (Unix seconds). */
  at?: number;
  /** The service that raised it. */
  by?: string;
  /** An operator's kill: the token's name, and through what (`api`, `dashboard`). */
  actor?: string;
  via?: string;
  rule?: string;
  tool?: string;
  hits?: number;
  window?: number;
  period?: number;
  call_index?: number;
  limit_name?: string;
  limit?: number | null;
  observed?: number | null;
  [key: string]: unknown;
}

export interface ClientOptions {
  /** The service's base URL, e.g. `http://127.0.0.1:4318` (TRIPWIRE_URL). */
  url: string;
  /** The bearer token (TRIPWIRE_TOKEN). */
  token: string;
  /** How long one long poll may wait, in seconds (the service allows 0 to 60). Default 20. */
  waitSeconds?: number;
  /** Polling interval when the service has no long poll, and the retry delay after an outage,
   * in milliseconds. Default 1000. */
  pollMs?: number;
  /** Where the client says what went wrong, once per kind. Default `console.warn`. */
  warn?: (message: string) => void;
}

/** The service's answer to a stop receipt. */
export interface ReceiptAnswer {
  /** True when the service stored the receipt on the run's row. */
  ok: boolean;
  /** The health state the service classified the receipt as (`stuck`, `bounded_stop`…). */
  health?: string;
  /** The receipt's stop reason, as stored. */
  stop_reason?: string | null;
  /** HTTP status, or 0 when the service could not be reached. */
  status: number;
  /** Why the receipt was not stored, when it was not. */
  error?: string;
}

const MAX_WATCHED = 1000; // what one POST /api/flags/wait accepts
const HEX32 = /^[0-9a-f]{32}$/;

/**
 * One process's connection to `tripwire serve`. Build one per process
 * (`new TripwireClient({url, token})` or `TripwireClient.fromEnv()`), hand it to each run
 * (`client.run(...)`, see `aisdk.ts`), and `close()` it when the process is done.
 */
export class TripwireClient {
  readonly url: string;
  private readonly token: string;
  private readonly waitSeconds: number;
  private readonly pollMs: number;
  private readonly warn: (message: string) => void;
  private readonly flags = new Map<string, Flag>();
  private readonly watched = new Set<string>();
  private readonly warned = new Set<string>();
  private loop: Promise<void> | undefined;
  private current: AbortController | undefined;
  private closed = false;
  private longPoll = true;
  /** True once the service refused the token (401/403): the client then stops asking. */
  refused = false;

  constructor(options: ClientOptions) {
    if (!options || typeof options.url !== "string" || !/^https?:\/\//.test(options.url)) {
      throw new TypeError("TripwireClient: url must be an http(s) URL (TRIPWIRE_URL)");
    }
    if (typeof options.token !== "string" || options.token === "") {
      throw new TypeError("TripwireClient: token must be a non-empty string (TRIPWIRE_TOKEN)");
    }
    this.url = options.url.replace(/\/+$/, "");
    this.token = options.token;
    this.waitSeconds = Math.min(Math.max(options.waitSeconds ?? 20, 0), 60);
    this.pollMs = Math.max(options.pollMs ?? 1000, 50);
    this.warn = options.warn ?? ((message) => console.warn(`tripwire: ${message}`));
  }

  /** A client from TRIPWIRE_URL and TRIPWIRE_TOKEN, or `undefined` when either is unset. */
  static fromEnv(env: Record<string, string | undefined> = process.env): TripwireClient | undefined {
    const url = env.TRIPWIRE_URL;
    const token = env.TRIPWIRE_TOKEN;
    return url && token ? new TripwireClient({ url, token }) : undefined;
  }

  /** The flag up for `traceId`, as last heard from the service (no network). */
  flag(traceId: string): Flag | undefined {
    return this.flags.get(traceId);
  }

  /** Keep `traceId`'s flag fresh from now on (a new id is asked about at once). */
  watch(traceId: string): void {
    if (this.closed || this.refused || !HEX32.test(traceId) || this.watched.has(traceId)) return;
    if (this.watched.size >= MAX_WATCHED) {
      const oldest = this.watched.values().next().value as string;
      this.unwatch(oldest);
      this.once("watched", `more than ${MAX_WATCHED} runs watched at once: the oldest are no longer watched`);
    }
    this.watched.add(traceId);
    if (this.loop === undefined) {
      this.loop = this.run().finally(() => {
        this.loop = undefined;
      });
    } else {
      this.current?.abort(); // ask again now, with the new id
    }
  }

  /** Stop watching `traceId` (its run ended) and forget its flag. */
  unwatch(traceId: string): void {
    this.watched.delete(traceId);
    this.flags.delete(traceId);
    if (this.watched.size === 0) this.current?.abort();
  }

  /** Ask the service once for the flags of every watched run (POST /api/flags). */
  async refresh(): Promise<void> {
    const ids = [...this.watched];
    if (ids.length === 0 || this.closed || this.refused) return;
    const answer = await this.post("/api/flags", { trace_ids: ids }, AbortSignal.timeout(10_000));
    if (answer.status === 200) this.take(ids, answer.body);
  }

  /** Post a run's stop receipt (see `receipt.ts`). Never throws: a failure is in the answer. */
  async sendReceipt(receipt: { run_id: string }, timeoutMs = 10_000): Promise<ReceiptAnswer> {
    if (this.refused) return { ok: false, status: 401, error: "the service refused the token" };
    const path = `/api/runs/${encodeURIComponent(receipt.run_id)}/receipt`;
    const answer = await this.post(path, receipt, AbortSignal.timeout(timeoutMs));
    const body = (answer.body ?? {}) as Record<string, unknown>;
    if (answer.status === 200) {
      return {
        ok: true,
        status: 200,
        health: typeof body.health === "string" ? body.health : undefined,
        stop_reason: typeof body.stop_reason === "string" ? body.stop_reason : null,
      };
    }
    const error = typeof body.detail === "string" ? body.detail : typeof body.error === "string" ? body.error : answer.error;
    this.once(`receipt:${answer.status}`, `a stop receipt was not stored (HTTP ${answer.status}): ${error ?? "no answer"}`);
    return { ok: false, status: answer.status, error: error ?? "no answer" };
  }

  /** Stop asking the service; pending requests are cancelled. Idempotent. */
  async close(): Promise<void> {
    this.closed = true;
    this.current?.abort();
    await this.loop;
  }

  // -- background -------------------------------------------------------------------------

  private async run(): Promise<void> {
    while (!this.closed && !this.refused && this.watched.size > 0) {
      const ids = [...this.watched];
      const controller = new AbortController();
      this.current = controller;
      let ok = false;
      if (this.longPoll) {
        const held = ids.filter((id) => this.flags.has(id));
        const answer = await this.post(
          "/api/flags/wait",
          { trace_ids: ids, flagged: held, timeout_s: this.waitSeconds },
          AbortSignal.any([controller.signal, AbortSignal.timeout((this.waitSeconds + 10) * 1000)]),
        );
        if (answer.status === 200) {
          this.take(ids, answer.body);
          ok = true;
        } else if (answer.status === 404 || answer.status === 405) {
          this.longPoll = false; // an older service: poll instead
          this.once("nowait", "the service has no POST /api/flags/wait: polling POST /api/flags");
          continue;
        } else if (controller.signal.aborted) {
          continue; // a new run to watch, or closing
        }
      } else {
        const answer = await this.post("/api/flags", { trace_ids: ids }, AbortSignal.any([controller.signal, AbortSignal.timeout(10_000)]));
        if (answer.status === 200) this.take(ids, answer.body);
        if (controller.signal.aborted) continue;
      }
      if (!ok || !this.longPoll) await sleep(this.pollMs, controller.signal);
    }
  }

  private take(ids: string[], body: unknown): void {
    const found = (body as { flags?: unknown } | undefined)?.flags;
    if (found === null || typeof found !== "object") return;
    const flags = found as Record<string, unknown>;
    for (const id of ids) {
      if (!this.watched.has(id)) continue;
      const flag = flags[id];
      if (flag !== null && typeof flag === "object" && !Array.isArray(flag)) {
        this.flags.set(id, flag as Flag);
      } else {
        this.flags.delete(id); // lowered (an operator resolved it, or it expired)
      }
    }
  }

  private async post(path: string, payload: unknown, signal: AbortSignal): Promise<{ status: number; body?: unknown; error?: string }> {
    let response: Response;
    try {
      response = await fetch(this.url + path, {
        method: "POST",
        headers: { authorization: `Bearer ${this.token}`, "content-type": "application/json" },
        body: JSON.stringify(payload),
        signal,
      });
    } catch (error) {
      if (!signal.aborted || (signal.reason as Error | undefined)?.name === "TimeoutError") {
        this.once(`net:${path}`, `${this.url}${path} did not answer (${describe(error)}); flags may be stale, retrying`);
      }
      return { status: 0, error: describe(error) };
    }
    let body: unknown;
    try {
      body = await response.json();
    } catch {
      body = undefined;
    }
    if (response.status === 401 || response.status === 403) {
      this.refused = true;
      this.once("auth", `the service refused the token (HTTP ${response.status}): check TRIPWIRE_TOKEN; flags are no longer checked`);
    } else if (response.status >= 500) {
      this.once(`http:${response.status}`, `${this.url}${path} answered HTTP ${response.status}; retrying`);
    }
    return { status: response.status, body };
  }

  private once(key: string, message: string): void {
    if (this.warned.has(key) || this.warned.size > 64) return;
    this.warned.add(key);
    this.warn(message);
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    timer.unref?.();
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
