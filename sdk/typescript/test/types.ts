// Compile-time checks of the types (tsc --noEmit, run by tests/sdk-typescript.test): what a
// caller writes type-checks, and what the API refuses does not.
import { Client, InvalidRequestError, isKind, type Event, type EventKind, type Request, type Run } from "../src/index.js";

export async function usage(client: Client): Promise<number> {
  const request: Request = { prompt: "hi", shell: true, timeout_seconds: 60, max_cost_micros: 40000 };
  const run = await client.runs.create(request, { wait: 60 });
  const status: 200 | 201 = run.httpStatus;
  const billed: number = run.usage.billed_micros + run.usage.released_micros;
  let total = status + billed;
  for await (const e of client.runs.events(run.id)) {
    if (isKind(e, "settled")) total += e.data?.billed_micros ?? 0;
    if (isKind(e, "tool_call")) total += Object.keys(e.data?.arguments ?? {}).length;
    if (isKind(e, "model_call")) total += e.data?.cost_micros ?? 0;
    if (isKind(e, "web_request")) total += e.data?.price_micros ?? 0;
  }
  for await (const r of client.runs.list({ pageSize: 10 })) {
    const s: Run["status"] = r.status;
    total += s.length;
  }
  try {
    await client.runs.cancel(run.id);
  } catch (e) {
    if (e instanceof InvalidRequestError) total += (e.field ?? "").length + e.status;
  }
  return total;
}

// @ts-expect-error: prompt is required
export const noPrompt: Request = { timeout_seconds: 5, max_cost_micros: 1 };
// @ts-expect-error: an unknown field is refused
export const colour: Request = { prompt: "x", timeout_seconds: 5, max_cost_micros: 1, colour: "red" };
// @ts-expect-error: shell is a boolean
export const shellText: Request = { prompt: "x", timeout_seconds: 5, max_cost_micros: 1, shell: "yes" };
export function settledData(e: Event): number {
  // @ts-expect-error: a reserved event has no billed_micros
  return isKind(e, "reserved") ? e.data?.billed_micros ?? 0 : 0;
}
// @ts-expect-error: not a kind the document types
export const notAKind: EventKind = "no_such_kind";
export const kinds: EventKind[] = ["reserved", "settled", "file_read", "header_dropped"];
