package io.github.redisidem.rocketmq;

import io.github.redisidem.Stats;

/**
 * A listener's counters (docs/clients.md, "Counters").
 *
 * @param library the Idem instance's own counters
 * @param acknowledged messages answered {@code CONSUME_SUCCESS} / {@code SUCCESS} once their record was done or replayed
 * @param heldBack messages given back ({@code RECONSUME_LATER} / {@code SUSPEND_CURRENT_QUEUE_A_MOMENT}): Busy,
 *                 failures, a missing key, DoneUnconfirmed, LeaseLost, NotDurable
 * @param deadLettered Exhausted messages moved to {@code %DLQ%<group>} (then acknowledged)
 */
public record ListenerStats(Stats library, long acknowledged, long heldBack, long deadLettered) {}
