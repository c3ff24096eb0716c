// The package's public surface: what README.md documents, and no more.
export { Idem } from './idem.js';
export type { IdemOptions, IdempotentOptions } from './idem.js';
export { Job } from './core.js';
export type { Hooks, Stats, DropReason } from './core.js';
export type { ProcessOptions } from './settings.js';
export type { Outcome, Work } from './loop.js';
export type { BatchItem, BatchStatus, ProcessManyOptions } from './many.js';
export type { ClaimManyOptions, DoneItem, ReleaseItem, DoneManyOptions } from './batch.js';
export { json, raw } from './codec.js';
export type { Codec } from './codec.js';
export {
  IdemError,
  IdemReplyError,
  BusyError,
  MismatchError,
  ExhaustedError,
  LeaseLostError,
  ResultNotStoredError,
  HookError,
  DoneUnconfirmedError,
  StaleError,
  WrongTypeError,
  ResultTooLargeError,
  ModuleRequiredError,
  LiveLeaseError,
  NotInstalledError,
  NotDurableError,
  MissingKeyError,
  replyError,
} from './errors.js';
export { ClaimStatus } from './types.js';
export type {
  Bytes,
  GrantedStatus,
  ClaimReply,
  DoneReply,
  RecordInfo,
  RecordState,
  ScanOptions,
  FilterInfo,
  ClaimOptions,
  DoneOptions,
  ReserveOptions,
  Edition,
  BatchReply,
  Durable,
} from './types.js';
export { idemModule } from './node-redis.js';
export { idempotency, fingerprint, keepRawBody } from './express.js';
export type { IdempotencyOptions, IdempotencyInfo } from './express.js';
export type { Transport, Arg } from './transport.js';
