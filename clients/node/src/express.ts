// Express (or any connect-style framework) middleware for the IETF
// Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header), as
// the README's recipe "Waiting for the copy in flight" does it:
// - the first request with a key runs the handler; its response (status,
//   headers, body) is stored in the record when it finishes;
// - a repeat gets the stored response back (with `Idempotent-Replayed: true`);
// - a repeat that arrives while the first is at work waits up to `waitMs`
//   for it (WAIT on the module, polling on the Functions edition), then
//   answers 409 with Retry-After;
// - a key reused with another method, path or body answers 422;
// - a handler answering 5xx (or throwing into Express's error handler, or a
//   connection closed before the response ended) releases the claim, so a
//   retry runs it again; after `maxTries` attempts the key answers 500.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { BusyError, ExhaustedError, IdemError, MismatchError } from './errors.js';
import type { Idem } from './idem.js';
import type { Serializer } from './serializer.js';
import type { Bytes } from './types.js';

export type IdempotencyRequest = IncomingMessage & { originalUrl?: string; body?: unknown };
export type IdempotencyResponse = ServerResponse & { locals?: Record<string, unknown> };

export interface IdempotencyOptions {
  /** seconds: the lease of a request's claim, extended while the handler runs (30) */
  lease?: number;
  /** ms a repeat waits for the copy in flight before answering 409 (5000) */
  waitMs?: number;
  /** attempts before the key answers 500 for good (3) */
  maxTries?: number;
  /** seconds a response is kept (the instance's default: idem.retain) */
  retain?: number;
  /** the header (Idempotency-Key) */
  header?: string;
  /** answer 400 to a request without the header (false: run it without idempotency) */
  required?: boolean;
  /** the methods it applies to (POST, PATCH) */
  methods?: string[];
  /** the key's namespace per caller (an account id), so two clients' keys never meet */
  scope?: (req: IdempotencyRequest) => string;
  /** what must match for a repeat (method, path and body by default) */
  fingerprint?: (req: IdempotencyRequest) => Bytes;
  /** Retry-After of the 409, seconds (1: the retry waits again, so it soon gets the result) */
  retryAfter?: number;
}

export interface StoredResponse {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
}

/** What the handler sees in `res.locals.idempotency`: `attempt` is the fencing number for its writes. */
export interface IdempotencyInfo {
  key: string;
  attempt: number;
  status: 'NEW' | 'SEEN' | 'RETRY';
}

/** `[status, headers]` as JSON, a newline, then the body's bytes. */
export const responseSerializer: Serializer<StoredResponse> = {
  serialize: ({ status, headers, body }) => Buffer.concat([Buffer.from(JSON.stringify([status, headers]) + '\n'), body]),
  deserialize(stored) {
    const newline = stored.indexOf(10);
    const [status, headers] = JSON.parse(stored.subarray(0, newline).toString('utf8'));
    return { status, headers, body: stored.subarray(newline + 1) };
  },
};

// Hop-by-hop and per-response headers are not replayed.
const NOT_STORED = new Set(['connection', 'keep-alive', 'transfer-encoding', 'date']);

class NotStored extends IdemError {}

function defaultFingerprint(req: IdempotencyRequest): Bytes {
  const head = `${req.method} ${req.originalUrl ?? req.url}\n`;
  const body = req.body;
  if (body === undefined) return head;
  if (Buffer.isBuffer(body)) return Buffer.concat([Buffer.from(head), body]);
  return head + (typeof body === 'string' ? body : JSON.stringify(body));
}

function send(res: IdempotencyResponse, status: number, headers: Record<string, string | string[]>, body: Bytes): void {
  res.statusCode = status;
  for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
  res.end(body);
}

/**
 * The middleware: `app.post('/orders', express.json(), idempotency(idem), handler)`.
 * Put it after the body parser, so that the fingerprint covers the body.
 */
export function idempotency(idem: Idem, options: IdempotencyOptions = {}) {
  const header = (options.header ?? 'Idempotency-Key').toLowerCase();
  const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
  const maxTries = options.maxTries ?? 3;
  const retryAfter = String(options.retryAfter ?? 1);
  const fingerprint = options.fingerprint ?? defaultFingerprint;

  return (req: IdempotencyRequest, res: IdempotencyResponse, next: (err?: unknown) => void): void => {
    if (!methods.has((req.method ?? '').toUpperCase())) return next();
    const raw = req.headers[header];
    const value = Array.isArray(raw) ? raw[0] : raw;
    if (!value) {
      if (options.required) return send(res, 400, { 'content-type': 'text/plain' }, `${options.header ?? 'Idempotency-Key'} header required`);
      return next();
    }
    const key = `http:${options.scope ? options.scope(req) + ':' : ''}${value}`;

    const runHandler = (ctx: { attempt: number; status: 'NEW' | 'SEEN' | 'RETRY' }) =>
      new Promise<StoredResponse>((resolve, reject) => {
        const chunks: Buffer[] = [];
        const capture = (chunk: unknown, encoding: unknown) => {
          if (chunk === undefined || chunk === null || typeof chunk === 'function') return;
          chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8'));
        };
        const write = res.write;
        const end = res.end;
        res.write = function (this: ServerResponse, chunk: unknown, ...rest: unknown[]) {
          capture(chunk, rest[0]);
          return (write as (...a: unknown[]) => boolean).call(this, chunk, ...rest);
        } as typeof res.write;
        res.end = function (this: ServerResponse, chunk?: unknown, ...rest: unknown[]) {
          capture(chunk, rest[0]);
          return (end as (...a: unknown[]) => ServerResponse).call(this, chunk, ...rest);
        } as typeof res.end;
        res.on('finish', () => {
          if (res.statusCode >= 500) return reject(new NotStored(`the handler answered ${res.statusCode}`));
          const headers: Record<string, string | string[]> = {};
          for (const [name, v] of Object.entries(res.getHeaders())) {
            if (v !== undefined && !NOT_STORED.has(name)) headers[name] = typeof v === 'number' ? String(v) : v;
          }
          resolve({ status: res.statusCode, headers, body: Buffer.concat(chunks) });
        });
        res.on('close', () => {
          if (!res.writableFinished) reject(new NotStored('the connection closed before the response ended'));
        });
        if (res.locals) res.locals.idempotency = { key: value, attempt: ctx.attempt, status: ctx.status } satisfies IdempotencyInfo;
        next();
      });

    idem
      .process(key, runHandler, {
        lease: options.lease,
        waitMs: options.waitMs,
        maxTries,
        retain: options.retain,
        payload: fingerprint(req),
        serializer: responseSerializer,
      })
      .then((outcome) => {
        if (!outcome.replayed) return; // the handler's own response went out
        if (outcome.value === undefined) {
          return send(res, 500, { 'content-type': 'text/plain' }, 'completed, but its response was not kept');
        }
        const { status, headers, body } = outcome.value;
        send(res, status, { ...headers, 'idempotent-replayed': 'true' }, body);
      })
      .catch((err) => {
        if (res.headersSent) return; // the handler answered; a lost lease or a released claim changes nothing for it
        if (err instanceof BusyError) {
          return send(res, 409, { 'retry-after': retryAfter, 'content-type': 'text/plain' }, 'a request with this key is in progress');
        }
        if (err instanceof MismatchError) {
          return send(res, 422, { 'content-type': 'text/plain' }, 'Idempotency-Key reused with another request');
        }
        if (err instanceof ExhaustedError) {
          return send(
            res,
            500,
            { 'content-type': 'text/plain' },
            `this request failed ${maxTries} times: send it again with a new Idempotency-Key`,
          );
        }
        next(err);
      });
  };
}
