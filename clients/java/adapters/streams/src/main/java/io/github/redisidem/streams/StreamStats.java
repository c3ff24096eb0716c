package io.github.redisidem.streams;

import io.github.redisidem.Stats;

/**
 * The consumer's counters (docs/clients.md, "Consumers of brokers").
 *
 * @param acknowledged entries acknowledged (done, or a replay)
 * @param heldBack entries left pending to come again (Busy, a failure, DONE unconfirmed, lease lost, NotDurable)
 * @param deadLettered entries moved to the dead-letter stream
 * @param idem the Idem's own counters
 */
public record StreamStats(long acknowledged, long heldBack, long deadLettered, Stats idem) {}
