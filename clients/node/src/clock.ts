// One timer per Idem instance for everything the loop times: the
// heartbeat's beats and the deadlines of DONE and RELEASE (docs/clients.md,
// "What the loop costs": no timer per message). Entries are kept in a set;
// the timer is armed for the earliest one only when an entry comes due
// before the time it is armed for, so short work, which finishes long
// before anything comes due, never arms one: the timer armed by an earlier
// message is still pending, and when it fires with nothing due it re-arms
// for the earliest entry left, or stops.
import { DeadlineError } from './errors.js';

/** Something the clock fires once at `due` (ms since the epoch). */
export interface Timed {
  due: number;
  fire(now: number): void;
}

export class Clock {
  readonly #entries = new Set<Timed>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #at = Infinity;

  add(entry: Timed): void {
    this.#entries.add(entry);
    if (entry.due < this.#at) this.#arm(entry.due);
  }

  delete(entry: Timed): void {
    this.#entries.delete(entry);
  }

  #arm(at: number): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#at = at;
    this.#timer = setTimeout(this.#fire, Math.max(0, at - Date.now()));
    this.#timer.unref?.();
  }

  #fire = (): void => {
    this.#timer = undefined;
    this.#at = Infinity;
    const now = Date.now();
    const due: Timed[] = [];
    let next = Infinity;
    for (const entry of this.#entries) {
      if (entry.due <= now) due.push(entry);
      else if (entry.due < next) next = entry.due;
    }
    for (const entry of due) {
      this.#entries.delete(entry);
      entry.fire(now);
    }
    if (next < this.#at) this.#arm(next);
  };

  /**
   * `promise`, or a DeadlineError once `ms` have passed without its answer
   * (the command's reply then counts as lost).
   */
  deadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const entry: Timed = { due: Date.now() + ms, fire: () => reject(new DeadlineError(what, ms)) };
      this.add(entry);
      promise.then(
        (value) => {
          this.#entries.delete(entry);
          resolve(value);
        },
        (err: unknown) => {
          this.#entries.delete(entry);
          reject(err);
        },
      );
    });
  }

  /** Stops the timer (Idem.close()). */
  stop(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#at = Infinity;
  }
}
