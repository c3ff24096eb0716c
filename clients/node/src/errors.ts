// Typed errors: every error the server or the loop can give a caller, each
// its own class, so that `catch (e) { if (e instanceof StaleError) ... }`
// reads as the contract in docs/commands.md does.

/** Base class of every error this library throws. */
export class IdemError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** An error reply of the server, as it sent it (`message` is its text). */
export class IdemReplyError extends IdemError {}

/** `STALE ...`: another claim took the key since this token's claim (DONE), or the token does not hold it (EXTEND). */
export class StaleError extends IdemReplyError {}

/** `WRONGTYPE ...`: the key holds another type (or the other edition's record). */
export class WrongTypeError extends IdemReplyError {}

/** `ERR RESULT is larger than idem.max-result ...`. */
export class ResultTooLargeError extends IdemReplyError {}

/** `CROSSSLOT ...`: keys of one call in several cluster slots. */
export class CrossSlotError extends IdemReplyError {}

/**
 * What the Functions edition cannot do (WAIT, BLOOM, the Bloom filter
 * commands, the batch commands): thrown before anything is sent, or when
 * the server answers `... needs the redis-idem module ...`.
 */
export class ModuleRequiredError extends IdemError {}

/** Neither the module nor the Functions library answers on this server. */
export class NoEditionError extends IdemError {}

/** `process()`: the claim answered MISMATCH: the key was used with another payload. */
export class MismatchError extends IdemError {
  constructor(
    readonly key: string,
    readonly attempt: number,
  ) {
    super(`${key}: the key was claimed with another payload (MISMATCH)`);
  }
}

/** `process()`: the claim answered EXHAUSTED: MAXTRIES attempts were used; dead-letter it. */
export class ExhaustedError extends IdemError {
  constructor(
    readonly key: string,
    readonly attempt: number,
  ) {
    super(`${key}: ${attempt} attempts used, MAXTRIES reached (EXHAUSTED): dead-letter it`);
  }
}

/** `process()`: still BUSY when the wait for the copy in flight ended; retry later, do not acknowledge. */
export class BusyError extends IdemError {
  constructor(
    readonly key: string,
    readonly attempt: number,
    /** ms left on the holder's lease when we gave up */
    readonly leaseMs: number,
  ) {
    super(`${key}: another worker holds it (BUSY, ${leaseMs} ms left on its lease)`);
  }
}

/**
 * `process()`: this worker's lease was lost: someone else claimed the key
 * (its lease had lapsed), so its EXTEND or its DONE was refused with STALE.
 * Its result was not stored; the other worker's will be.
 */
export class LeaseLostError extends StaleError {
  constructor(
    readonly key: string,
    readonly attempt: number,
    options?: { cause?: unknown },
  ) {
    super(`${key}: attempt ${attempt} lost its lease: another worker claimed the key (STALE)`, options);
  }
}

/** `wrap()`: a replay of a record completed without a stored result (too large, or dropped under maxmemory). */
export class ResultNotStoredError extends IdemError {
  constructor(readonly key: string) {
    super(`${key}: completed, but its result was not stored (over idem.max-result, or dropped under maxmemory)`);
  }
}

/** Turns an error reply of any client into the typed error for its text. */
export function replyError(err: unknown): Error {
  if (err instanceof IdemError) return err;
  const message = err instanceof Error ? err.message : String(err);
  if (!(err instanceof Error) || !/^[A-Z]+[A-Z_-]* /.test(message)) return err instanceof Error ? err : new Error(message);
  if (message.includes('needs the redis-idem module')) return new ModuleRequiredError(message, { cause: err });
  if (message.startsWith('STALE')) return new StaleError(message, { cause: err });
  if (message.startsWith('WRONGTYPE')) return new WrongTypeError(message, { cause: err });
  if (message.startsWith('CROSSSLOT')) return new CrossSlotError(message, { cause: err });
  if (message.startsWith('ERR RESULT is larger than')) return new ResultTooLargeError(message, { cause: err });
  return new IdemReplyError(message, { cause: err });
}
