// How process() stores a result in the record (RESULT) and reads it back.

export interface Serializer<T = unknown> {
  serialize(value: T): string | Buffer;
  deserialize(stored: Buffer): T;
}

/** The default: JSON (`undefined` is stored as `null`). */
export const json: Serializer<any> = {
  serialize: (value) => JSON.stringify(value === undefined ? null : value),
  deserialize: (stored) => JSON.parse(stored.toString('utf8')),
};

/** Results that are bytes already: stored and replayed as they are. */
export const raw: Serializer<Buffer> = {
  serialize: (value) => value,
  deserialize: (stored) => stored,
};
