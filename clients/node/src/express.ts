// Express (or any connect-style framework) middleware for the Idempotency-Key
// header (draft-ietf-httpapi-idempotency-key-header), docs/clients.md's
// "HTTP middleware":
// - the first request with a key runs the handler; its response is stored
//   when the handler ends it, whether or not the client is still there;
// - a repeat gets the stored response, with `Idempotent-Replayed: true`;
// - a repeat while the first is at work waits (`wait`), then 409;
// - the key with another method, target or body: 422;
// - a handler that answers 5xx or fails stores nothing: the claim is released.
import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Codec } from './codec.js';
import type { Job } from './core.js';
import { BusyError, ExhaustedError, IdemError, MismatchError, NotDurableError } from './errors.js';
import { type Idem, idemSettings } from './idem.js';

type Request = IncomingMessage & { originalUrl?: string; body?: unknown; rawBody?: Buffer };
type Response = ServerResponse & { locals?: Record<string, unknown> };

/** The middleware's options; `lease`, `wait`, `maxTries` and `retain` default to the Idem's (durable and owner are always the Idem's). */
export interface IdempotencyOptions {
  /** ms, whole seconds: the claim's lease, extended while the handler runs (the Idem's: 30000 by default) */
  lease?: number;
  /** ms a repeat waits for the copy in flight before answering 409 (the Idem's: 10000 by default) */
  wait?: number;
  /** tries before the key answers 500 for good (the Idem's maxTries, else 3) */
  maxTries?: number;
  /** ms a response is kept, whole seconds (the Idem's, else the server's idem.retain) */
  retain?: number;
  /** the header (Idempotency-Key) */
  header?: string;
  /** answer 400 to a request without the header (false: run it without idempotency) */
  required?: boolean;
  /** the methods it applies to (POST, PATCH) */
  methods?: string[];
  /** the key's namespace per caller (an account id), so two clients' keys never meet */
  scope?: (req: Request) => string;
  /** Retry-After of the 409, seconds (1) */
  retryAfter?: number;
}

/** What the handler sees in `res.locals.idempotency`: `attempt` is the fencing number for its writes. */
export interface IdempotencyInfo {
  key: string;
  attempt: number;
  status: Job['status'];
}

interface StoredResponse {
  status: number;
  headers: [string, string][];
  body: Buffer;
}

/** The lowercase hex SHA-256 of `METHOD SP target LF body`: what must match for a repeat (sent as PAYLOAD). */
export function fingerprint(method: string, target: string, body: Buffer | string): string {
  return createHash('sha256').update(`${method.toUpperCase()} ${target}\n`).update(body).digest('hex');
}

// docs/clients.md's stored response, readable by every library's middleware.
const responseCodec: Codec<StoredResponse> = {
  encode: ({ status, headers, body }) => JSON.stringify({ v: 1, status, headers, body: body.toString('base64') }),
  decode(stored) {
    const r = JSON.parse(stored.toString('utf8')) as { v: number; status: number; headers: [string, string][]; body: string };
    if (r.v !== 1) throw new TypeError(`a stored response of version ${r.v}`);
    return { status: r.status, headers: r.headers, body: Buffer.from(r.body, 'base64') };
  },
};

// Hop-by-hop and per-response headers are not stored.
const NOT_STORED = new Set(['connection', 'keep-alive', 'transfer-encoding', 'date', 'content-length']);

class NotStored extends IdemError {}

/**
 * The raw body bytes: `req.rawBody` (a body parser's `verify: keepRawBody`),
 * a Buffer `req.body` (`express.raw()`), or read here from a request nobody
 * has read yet (then kept as `req.rawBody`).
 */
async function rawBody(req: Request): Promise<Buffer> {
  if (Buffer.isBuffer(req.rawBody)) return req.rawBody;
  if (Buffer.isBuffer(req.body)) return req.body;
  if (req.readableEnded) {
    const declared = req.headers['content-length'];
    if (req.headers['transfer-encoding'] === undefined && (declared === undefined || declared === '0')) return Buffer.alloc(0);
    throw new TypeError(
      'idempotency(): the request body was parsed before the middleware without keeping its raw bytes: ' +
        'use express.json({ verify: keepRawBody }) (or express.raw()), or put idempotency() before the body parser',
    );
  }
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string));
  req.rawBody = Buffer.concat(chunks);
  return req.rawBody;
}

/** For a body parser's `verify` option: keeps the raw body as `req.rawBody`, for the fingerprint. */
export function keepRawBody(req: IncomingMessage, _res: ServerResponse, buf: Buffer): void {
  (req as Request).rawBody = buf;
}

function send(res: Response, status: number, headers: [string, string][], body: Buffer | string): void {
  res.statusCode = status;
  const byName = new Map<string, string[]>();
  for (const [name, value] of headers) byName.set(name, [...(byName.get(name) ?? []), value]);
  for (const [name, values] of byName) res.setHeader(name, values.length === 1 ? values[0]! : values);
  res.end(body);
}

const TEXT: [string, string][] = [['content-type', 'text/plain; charset=utf-8']];

/** Runs the rest of the chain and resolves with the response when the handler ends it. */
function capture(res: Response, next: (err?: unknown) => void, lease: number): Promise<StoredResponse> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const keep = (chunk: unknown, encoding: unknown) => {
      if (chunk === undefined || chunk === null || typeof chunk === 'function') return;
      chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8'));
    };
    const { write, end } = res;
    let ended = false;
    res.write = function (this: ServerResponse, chunk: unknown, ...rest: unknown[]) {
      keep(chunk, rest[0]);
      return (write as (...a: unknown[]) => boolean).call(this, chunk, ...rest);
    } as typeof res.write;
    res.end = function (this: ServerResponse, chunk?: unknown, ...rest: unknown[]) {
      if (!ended) {
        ended = true;
        keep(chunk, rest[0]);
        // The handler has finished: its response is stored now, whether or
        // not the client is still connected to receive it.
        if (res.statusCode >= 500) reject(new NotStored(`the handler answered ${res.statusCode}`));
        else {
          const headers: [string, string][] = [];
          for (const [name, v] of Object.entries(res.getHeaders())) {
            if (v === undefined || NOT_STORED.has(name)) continue;
            for (const one of Array.isArray(v) ? v : [v]) headers.push([name, String(one)]);
          }
          resolve({ status: res.statusCode, headers, body: Buffer.concat(chunks) });
        }
      }
      return (end as (...a: unknown[]) => ServerResponse).call(this, chunk, ...rest);
    } as typeof res.end;
    // The client went away: the handler goes on, and its response is stored
    // when it ends it; one that never does within a lease is taken as failed.
    res.once('close', () => {
      if (ended) return;
      const timer = setTimeout(() => !ended && reject(new NotStored('the client went away and the handler did not end its response')), lease);
      timer.unref?.();
    });
    next();
  });
}

/**
 * The middleware: `app.post('/orders', express.json({ verify: keepRawBody }), idempotency(idem), handler)`,
 * or before any body parser (it then reads the body itself, as `req.rawBody`).
 */
export function idempotency(idem: Idem, options: IdempotencyOptions = {}) {
  const header = (options.header ?? 'Idempotency-Key').toLowerCase();
  const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
  const settings = idemSettings(idem);
  const maxTries = options.maxTries ?? settings.maxTries ?? 3;
  const lease = options.lease ?? settings.lease;
  const retryAfter = String(options.retryAfter ?? 1);
  // Only what the middleware sets itself overrides the Idem's settings.
  const own = {
    ...(options.lease === undefined ? {} : { lease }),
    ...(options.wait === undefined ? {} : { wait: options.wait }),
    ...(options.retain === undefined ? {} : { retain: options.retain }),
    maxTries,
    codec: responseCodec,
  };

  return (req: Request, res: Response, next: (err?: unknown) => void): void => {
    const method = (req.method ?? '').toUpperCase();
    if (!methods.has(method)) return next();
    const given = req.headers[header];
    // RFC 9110's optional whitespace around the value is not part of the key.
    const value = (Array.isArray(given) ? given[0] : given)?.replace(/^[ \t]+|[ \t]+$/g, '');
    if (!value) {
      if (options.required) return send(res, 400, TEXT, `${options.header ?? 'Idempotency-Key'} header required`);
      return next();
    }
    const key = `http:${options.scope ? options.scope(req) + ':' : ''}${value}`;
    let ran = false; // whether this request's handler ran: a NotDurable DONE without it is a replay
    const run = async () => {
      const payload = fingerprint(method, req.originalUrl ?? req.url ?? '/', await rawBody(req));
      const handler = (job: Job) => {
        ran = true;
        if (res.locals) res.locals.idempotency = { key: value, attempt: job.attempt, status: job.status } satisfies IdempotencyInfo;
        return capture(res, next, lease);
      };
      return idem.process(key, handler, { ...own, payload });
    };
    run().then(
      (outcome) => {
        if (!outcome.replayed) return; // the handler's own response went out
        if (outcome.value === undefined) return send(res, 500, TEXT, 'completed, but its response was not kept');
        const { status, headers, body } = outcome.value;
        send(res, status, [...headers, ['idempotent-replayed', 'true']], body);
      },
      (err) => {
        if (res.headersSent || res.writableEnded) return; // the handler answered (a 5xx, or a lost lease changes nothing for it)
        if (err instanceof BusyError) return send(res, 409, [['retry-after', retryAfter], ...TEXT], 'a request with this key is in progress');
        if (err instanceof MismatchError) return send(res, 422, TEXT, 'Idempotency-Key reused with another request');
        if (err instanceof ExhaustedError) return send(res, 500, TEXT, `this request failed ${maxTries} times: send it again with a new Idempotency-Key`);
        if (err instanceof NotDurableError && err.stage === 'done' && !ran) {
          // A repeat whose read the replicas did not acknowledge: the stored
          // response, as any replay (none kept: 503, send again), as Go and Java.
          const kept = err.result as { status: number; headers: [string, string][]; body: Buffer } | undefined;
          if (kept === undefined) return send(res, 503, TEXT, 'idempotency store unavailable');
          return send(res, kept.status, [...kept.headers, ['idempotent-replayed', 'true']], kept.body);
        }
        // the claim not acknowledged (released, the handler not run): send it again, as Go and Java answer
        if (err instanceof NotDurableError && err.stage === 'claim') return send(res, 503, [['retry-after', retryAfter], ...TEXT], 'this request could not be claimed durably: send it again');
        next(err);
      },
    );
  };
}
