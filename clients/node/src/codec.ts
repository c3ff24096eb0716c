// How process() stores a result in the record (RESULT) and reads it back.

export interface Codec<T = unknown> {
  /** May throw (a value it cannot encode): the record is completed without a result. */
  encode(value: T): string | Buffer;
  decode(stored: Buffer): T;
}

/** The default: JSON (`undefined` is stored as `null`; a BigInt cannot be encoded). */
export const json: Codec<any> = {
  encode: (value) => JSON.stringify(value === undefined ? null : value),
  decode: (stored) => JSON.parse(stored.toString('utf8')),
};

/** Results that are bytes already: stored and replayed as they are. */
export const raw: Codec<Buffer | string> = {
  encode: (value) => value,
  decode: (stored) => stored,
};
