package io.github.redisidem;

import java.time.Duration;

/** One call's settings where they may differ from the instance's (the HTTP filter's). */
record Call(byte[] payload, Integer maxTries, Duration waitFor, Codec codec) {}
