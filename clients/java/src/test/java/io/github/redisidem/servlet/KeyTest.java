package io.github.redisidem.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import org.junit.jupiter.api.Test;

/** The Idempotency-Key's one rule in every language: spaces and tabs around it dropped, nothing else changed. */
class KeyTest {
    @Test
    void spacesAndTabsAroundTheKeyAreDropped() {
        assertEquals("k7", IdempotencyFilter.key(" \tk7 \t"));
        assertEquals("a b", IdempotencyFilter.key("  a b "));
        assertEquals("x\u000b", IdempotencyFilter.key("x\u000b"), "only spaces and tabs: another control character stays");
        assertNull(IdempotencyFilter.key(" \t "));
        assertNull(IdempotencyFilter.key(null));
    }
}
