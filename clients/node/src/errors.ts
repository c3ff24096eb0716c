// Typed errors, one class per name of docs/clients.md's table, so that
// `catch (e) { if (e instanceof BusyError) ... }` reads as the contract does.

/** Base class of every error this library throws. */
export class IdemError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** An error reply of the server without a class of its own (`message` is its text). */
export class IdemReplyError extends IdemError {}

/** `STALE ...` from EXTEND or DONE: this token does not hold the claim. */
export class StaleError extends IdemReplyError {}

/** `WRONGTYPE ...`: the key holds another type (or the other edition's record). */
export class WrongTypeError extends IdemReplyError {}

/** `ERR RESULT is larger than idem.max-result ...` (or would make the record larger than proto-max-bulk-len). */
export class ResultTooLargeError extends IdemReplyError {}

/** IDEM.REQUEUE refused: the record is processing with a live lease (its holder is still at work); nothing changed. */
export class LiveLeaseError extends IdemReplyError {}

/** What the Functions edition cannot do (WAIT, BLOOM, the filters, the raw batch commands): thrown before anything is sent. */
export class ModuleRequiredError extends IdemError {}

/** Neither the module nor the Functions library answers on this server. */
export class NotInstalledError extends IdemError {}

/** Still busy when the wait for the copy in flight ended: do not acknowledge, retry later. */
export class BusyError extends IdemError {
  constructor(
    readonly key: string,
    readonly attempt: number,
    /** ms left on the holder's lease */
    readonly leaseLeft: number,
    /** the holder's OWNER (read with one IDEM.GET); null when the record has none or the read failed */
    readonly owner: string | null = null,
  ) {
    super(`${key}: ${owner === null ? 'another worker' : owner} holds it (${leaseLeft} ms left on its lease)`);
  }
}

/**
 * `durable`: a WAIT (or WAITAOF) answered fewer acknowledgements than asked,
 * or the server refused it. `stage` 'claim': the claim was released, the
 * work never ran (the message is redelivered); 'done': the record is done on
 * the primary but may be lost with it: do not acknowledge the message.
 */
export class NotDurableError extends IdemError {
  constructor(
    readonly key: string,
    readonly stage: 'claim' | 'done',
    /** replicas (WAITAOF: fsyncs by replicas) that acknowledged; -1 when the server refused WAITAOF */
    readonly acknowledged: number,
    /** the work's value (stage 'done') */
    readonly result?: unknown,
    options?: { cause?: unknown },
  ) {
    super(
      `${key}: ${stage === 'claim' ? 'the claim' : 'the completion'} was not acknowledged as durable (${acknowledged < 0 ? 'refused' : `${acknowledged} acknowledged`})` +
        (stage === 'claim' ? ': released, the work did not run' : ': do not acknowledge the message'),
      options,
    );
  }
}

/** A broker's message without the key the adapter's key function looks for: dead-lettered, never passed through unclaimed. */
export class MissingKeyError extends IdemError {}

/** The key was claimed with another payload. */
export class MismatchError extends IdemError {
  constructor(
    readonly key: string,
    readonly attempt: number,
  ) {
    super(`${key}: the key was claimed with another payload`);
  }
}

/** `maxTries` tries were used: dead-letter it. */
export class ExhaustedError extends IdemError {
  constructor(
    readonly key: string,
    readonly attempt: number,
  ) {
    super(`${key}: ${attempt} tries used (maxTries): dead-letter it`);
  }
}

/** This worker's lease lapsed and another worker claimed the key: this worker's result is not the one kept. */
export class LeaseLostError extends IdemError {
  constructor(
    readonly key: string,
    readonly attempt: number,
    options?: { cause?: unknown },
  ) {
    super(`${key}: attempt ${attempt} lost its lease: another worker claimed the key`, options);
  }
}

/** The record was completed without the result (the codec failed, or `oversize: 'error'`): the work will not run again. */
export class ResultNotStoredError extends IdemError {
  constructor(
    readonly key: string,
    /** the work's value, which was not stored */
    readonly result: unknown,
    cause: unknown,
  ) {
    super(`${key}: completed, but its result was not stored (${cause instanceof Error ? cause.message : String(cause)})`, { cause });
  }
}

/** A hook threw: `onRun` (the claim was released, the work did not run) or `onDone` (the record is completed; `result` is the work's value). */
export class HookError extends IdemError {
  constructor(
    readonly hook: 'onRun' | 'onDone',
    cause: unknown,
    /** the work's value (onDone only) */
    readonly result?: unknown,
  ) {
    super(`${hook} hook failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}

/** DONE could not be confirmed after `doneRetries` tries: do not acknowledge the message (its redelivery replays or retries). */
export class DoneUnconfirmedError extends IdemError {
  constructor(
    readonly key: string,
    /** the work's value */
    readonly result: unknown,
    cause: unknown,
  ) {
    super(`${key}: DONE could not be confirmed (${cause instanceof Error ? cause.message : String(cause)})`, { cause });
  }
}

/** A command whose connection closed before its reply, which the client below would have resent by itself: the loop decides (DONE, RELEASE). */
export class ConnectionLostError extends Error {
  constructor(command: string) {
    super(`Connection closed before ${command}'s reply (not resent by the client; the loop decides)`);
    this.name = 'ConnectionLostError';
  }
}

/** A command that took longer than its deadline (done timeout): its reply counts as lost. */
export class DeadlineError extends Error {
  constructor(command: string, ms: number) {
    super(`Connection timed out: no reply to ${command} within ${ms} ms`);
    this.name = 'DeadlineError';
  }
}

// The error replies of ioredis (ReplyError), node-redis v5 (SimpleError,
// BlobError) and v4 (ErrorReply): their text starts with an upper-case code.
const REPLY = /^[A-Z][A-Z_-]* /;

/** True for an error reply of the server; false for a connection error (closed, reset, timed out). */
export function isReplyError(err: unknown): boolean {
  if (err instanceof IdemError) return true;
  return err instanceof Error && REPLY.test(err.message) && !/^(Connection|Socket|Stream)/.test(err.message);
}

/** An error reply of any client as the typed error for its text; other errors as they are. */
export function replyError(err: unknown): Error {
  if (err instanceof IdemError) return err;
  if (!(err instanceof Error)) return new Error(String(err));
  if (!isReplyError(err)) return err;
  const message = err.message;
  if (message.includes('needs the redis-idem module')) return new ModuleRequiredError(message, { cause: err });
  if (message.startsWith('STALE')) return new StaleError(message, { cause: err });
  if (message.startsWith('WRONGTYPE')) return new WrongTypeError(message, { cause: err });
  if (message.startsWith('ERR RESULT ')) return new ResultTooLargeError(message, { cause: err });
  if (message.includes('processing with a live lease')) return new LiveLeaseError(message, { cause: err });
  return new IdemReplyError(message, { cause: err });
}
