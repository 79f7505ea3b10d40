// Types of the ephemeral client. The API's shapes come from schema.d.ts, generated from
// core/openapi.json by openapi-typescript (`npm run generate`); do not edit that file.
import type { components } from "./schema.js";

type Schemas = components["schemas"];
/** The request v1 (the body of POST /v1/runs). */
export type Request = Schemas["Request"];
/** One timeline event, a union discriminated by `kind`. */
export type Event = Schemas["Event"];
/** The kinds the document types (the core's and the bundled plugins'); others may come. */
export type EventKind = Exclude<{
  [N in keyof Schemas]: Schemas[N] extends { kind: infer K } ? (string extends K ? never : K) : never;
}[keyof Schemas], undefined>;
/** The event of one kind, with its typed data. */
export type EventOf<K extends EventKind> = Extract<Event, { kind: K }>;
/** Narrows an event to its kind (`e.kind === "settled"` alone cannot: a plugin's kind is any string). */
export declare function isKind<K extends EventKind>(e: Event, kind: K): e is EventOf<K>;
export type Usage = Schemas["Usage"];
export type RunStatus = Schemas["RunStatus"];
export type Health = Schemas["Health"];
export type ErrorType = Schemas["ErrorType"];
/** A run object. */
export type Run = Schemas["Run"];
/** A run as create() answers it: httpStatus 201 (new) or 200 (an earlier request's). */
export type CreatedRun = Run & { httpStatus: 200 | 201; idempotencyKey: string };
export type { components, paths, operations } from "./schema.js";

export interface ClientOptions {
  /** Per HTTP exchange, milliseconds (default 60000; a wait adds its own). */
  timeoutMs?: number;
  /** Further attempts after a lost answer or a 429/503 (default 3). */
  maxRetries?: number;
  /** First back-off, milliseconds, doubled per attempt (default 250). */
  backoffMs?: number;
  /** A Fetch API implementation (default globalThis.fetch). */
  fetch?: typeof globalThis.fetch;
}

export declare class Client {
  constructor(url?: string, apiKey?: string, options?: ClientOptions);
  readonly url: string;
  apiKey: string | undefined;
  readonly runs: Runs;
  request<T = unknown>(method: string, path: string, options?: {
    query?: Record<string, string | number | undefined | null>;
    body?: string;
    headers?: Record<string, string>;
    timeoutMs?: number;
    retry?: boolean;
  }): Promise<{ status: number; body: T }>;
  health(): Promise<Health>;
}

export declare class Runs {
  create(request: Request | string, options?: { idempotencyKey?: string; wait?: number }): Promise<CreatedRun>;
  get(id: string): Promise<Run>;
  list(options?: { pageSize?: number }): AsyncGenerator<Run, void, undefined>;
  cancel(id: string): Promise<Run>;
  events(id: string, options?: { lastEventId?: number; reconnectDelayMs?: number; signal?: AbortSignal }): AsyncGenerator<Event, void, undefined>;
}

export declare class EphemeralError extends Error {}
/** No HTTP answer at all (after the retries). */
export declare class ConnectionError extends EphemeralError {}
/** An HTTP error answer of the API. */
export declare class ApiError extends EphemeralError {
  readonly status: number;
  /** The API's error type; a newer daemon may send types this version does not list. */
  readonly type: ErrorType | `http_${number}` | (string & {});
  /** The request field or header at fault, or null. */
  readonly field: string | null;
  /** The API's message. */
  readonly apiMessage: string;
  /** Seconds, from Retry-After, or null. */
  readonly retryAfter: number | null;
  readonly body: unknown;
}
export declare class InvalidRequestError extends ApiError {}
export declare class AuthenticationError extends ApiError {}
export declare class InsufficientBalanceError extends ApiError {}
export declare class NotFoundError extends ApiError {}
export declare class MethodNotAllowedError extends ApiError {}
export declare class ConflictError extends ApiError {}
export declare class PayloadTooLargeError extends ApiError {}
export declare class UnsupportedMediaTypeError extends ApiError {}
export declare class IdempotencyError extends ApiError {}
export declare class RateLimitError extends ApiError {}
export declare class InternalError extends ApiError {}
export declare class UnavailableError extends ApiError {}
export declare function errorFromResponse(status: number, body: unknown, retryAfter?: number | null): ApiError;

/** The delivery is not signed by the endpoint's secret, or is too old. */
export declare class WebhookSignatureError extends EphemeralError {}
/** Resolves when `header` (Ephemeral-Signature) signs `body` (raw, as received) with
 * `secret` at a time within `toleranceS` seconds of `now` (unix seconds); rejects with
 * WebhookSignatureError otherwise. */
export declare function verifyWebhook(secret: string, header: string | null | undefined,
  body: string | Uint8Array | ArrayBuffer, toleranceS?: number, now?: number): Promise<void>;
export declare const verify_webhook: typeof verifyWebhook;
