package io.github.redisidem;

/** The conformance cases: Redis7Functions (REDIS7_SERVER, the functions edition). */
class Redis7FunctionsConformanceTest extends ConformanceBase {
    @Override
    String binary() {
        return "REDIS7_SERVER";
    }

    @Override
    Edition edition() {
        return Edition.FUNCTIONS;
    }
}
