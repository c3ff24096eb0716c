// One timer per Idem instance for everything the loop times: the
// heartbeat's beats and the deadlines of DONE and RELEASE (docs/clients.md,
// "What the loop costs": no timer per message). Entries of one duration
// come due in the order they were added, so each duration keeps a queue,
// an entry is added at its tail and cancelled by a mark (nothing is
// searched, nothing is moved). The timer is armed for the earliest head
// only when an entry comes due before the time it is armed for: short
// work, which is done long before anything comes due, never arms one (the
// timer armed by an earlier message is still pending); when it fires it
// handles what is due, drops what was cancelled, and re-arms for the
// earliest entry left, or stops.
import { DeadlineError } from './errors.js';

/** Something the clock fires once at `due` (ms since the epoch), unless cancelled first. */
export interface Timed {
  due: number;
  cancelled: boolean;
  fire(now: number): void;
}

/** One duration's entries, in the order they come due. */
class Queue {
  items: (Timed | undefined)[] = [];
  head = 0;

  /** Drops cancelled entries at the head (and the slots they left, once they are many). */
  trim(): Timed | undefined {
    let first = this.items[this.head];
    while (first !== undefined && first.cancelled) {
      this.items[this.head++] = undefined;
      first = this.items[this.head];
    }
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return first;
  }
}

export class Clock {
  readonly #queues = new Map<number, Queue>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #at = Infinity;

  /** Fires `entry` `after` ms from now (entry.due is set here). */
  add(entry: Timed, after: number): void {
    let queue = this.#queues.get(after);
    if (queue === undefined) this.#queues.set(after, (queue = new Queue()));
    queue.trim();
    entry.due = Date.now() + after;
    entry.cancelled = false;
    queue.items.push(entry);
    if (entry.due < this.#at) this.#arm(entry.due);
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
    for (const queue of this.#queues.values()) {
      for (let first = queue.trim(); first !== undefined && first.due <= now; first = queue.trim()) {
        queue.items[queue.head++] = undefined;
        due.push(first);
      }
    }
    for (const entry of due) entry.fire(now);
    let next = Infinity;
    for (const [after, queue] of this.#queues) {
      const first = queue.trim();
      if (first === undefined) {
        if (queue.items.length - queue.head === 0) this.#queues.delete(after);
      } else if (first.due < next) next = first.due;
    }
    if (next < this.#at) this.#arm(next);
  };

  /**
   * `promise`, or a DeadlineError once `ms` have passed without its answer
   * (the command's reply then counts as lost).
   */
  deadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const entry: Timed = { due: 0, cancelled: false, fire: () => reject(new DeadlineError(what, ms)) };
      this.add(entry, ms);
      promise.then(
        (value) => {
          entry.cancelled = true;
          resolve(value);
        },
        (err: unknown) => {
          entry.cancelled = true;
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
