package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.exceptions.NotDurableException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import org.junit.jupiter.api.Test;

/** The I/O-free core's decisions, answer by answer, with no server. */
class ProcessFlowTest {
    private static final byte[] STORED = "7".getBytes(StandardCharsets.UTF_8);

    private static Core core() {
        return new Core(null, IdemOptions.builder().edition(Edition.MODULE).durable(Durable.replicas(1)).build());
    }

    private static Object doneReply(byte[] result) {
        return Arrays.asList((Object) "DONE".getBytes(StandardCharsets.UTF_8), result, 1L);
    }

    /** A replay under durable waits for its replicas too (docs/clients.md, Durability): fewer is NotDurable at the done stage, the stored result carried. */
    @Test
    void aReplayNotAcknowledgedIsNotDurableWithItsStoredResult() {
        try (Core core = core()) {
            ProcessFlow<Integer> flow = new ProcessFlow<>(core, "k", null, core.codec(Integer.class), Duration.ZERO);
            assertInstanceOf(Step.Claim.class, flow.start());
            Step end = flow.onAnswer(new Answer(doneReply(STORED), null, false, 0));
            Result r = assertInstanceOf(Step.Finish.class, end, "nothing to release: a replay holds no claim").result();
            assertEquals(BatchStatus.NOT_DURABLE, r.status());
            assertEquals(7, r.value());
            assertTrue(r.stored());
            assertEquals(1, r.attempt());
            assertNull(r.granted());
            NotDurableException e = assertInstanceOf(NotDurableException.class, r.error());
            assertEquals(NotDurableException.Stage.DONE, e.stage());
            assertEquals(7, e.result());
            assertEquals(0, e.acknowledged());
            assertEquals(1, core.counters.notDurable.sum());
            assertEquals(0, core.counters.replays.sum(), "counted as not durable, not as a replay");
        }
    }

    /** The same replay acknowledged is a replay. */
    @Test
    void aReplayAcknowledgedIsAReplay() {
        try (Core core = core()) {
            ProcessFlow<Integer> flow = new ProcessFlow<>(core, "k", null, core.codec(Integer.class), Duration.ZERO);
            flow.start();
            Result r = assertInstanceOf(Step.Finish.class, flow.onAnswer(new Answer(doneReply(STORED), null, true, 1))).result();
            assertEquals(BatchStatus.REPLAYED, r.status());
            assertEquals(7, r.value());
            assertNull(r.error());
            assertEquals(1, core.counters.replays.sum());
            assertEquals(0, core.counters.notDurable.sum());
        }
    }

    /** The rule process and claimMany share: a granted claim or a replay not acknowledged is NotDurable (counted); busy and refused claims are not. */
    @Test
    void whichClaimsAreNotDurable() {
        try (Core core = core()) {
            Answer shortfall = new Answer(null, null, false, 0);
            assertEquals(NotDurableException.Stage.CLAIM,
                    ProcessFlow.notDurableStage(core, new Claim(ClaimStatus.SEEN, "t", null, null, 2), shortfall));
            assertEquals(NotDurableException.Stage.DONE,
                    ProcessFlow.notDurableStage(core, new Claim(ClaimStatus.DONE, null, STORED, null, 1), shortfall));
            assertNull(ProcessFlow.notDurableStage(core, new Claim(ClaimStatus.BUSY, null, null, Duration.ofSeconds(1), 1), shortfall));
            assertNull(ProcessFlow.notDurableStage(core, new Claim(ClaimStatus.MISMATCH, null, null, null, 1), shortfall));
            assertNull(ProcessFlow.notDurableStage(core, new Claim(ClaimStatus.DONE, null, STORED, null, 1), new Answer(null, null, true, 1)));
            assertEquals(2, core.counters.notDurable.sum());
        }
    }

    /** A replay without a stored result, not acknowledged: NotDurable at the done stage, its result null. */
    @Test
    void aReplayWithoutResultNotAcknowledged() {
        try (Core core = core()) {
            ProcessFlow<Integer> flow = new ProcessFlow<>(core, "k", null, core.codec(Integer.class), Duration.ZERO);
            flow.start();
            Result r = assertInstanceOf(Step.Finish.class, flow.onAnswer(new Answer(doneReply(null), null, false, 0))).result();
            assertEquals(BatchStatus.NOT_DURABLE, r.status());
            assertNull(r.value());
            assertEquals(false, r.stored());
            assertEquals(NotDurableException.Stage.DONE, assertInstanceOf(NotDurableException.class, r.error()).stage());
        }
    }
}
