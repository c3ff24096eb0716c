package io.github.redisidem;

/** The conformance cases: ValkeyFunctions (VALKEY_SERVER, the functions edition). */
class ValkeyFunctionsConformanceTest extends ConformanceBase {
    @Override
    String binary() {
        return "VALKEY_SERVER";
    }

    @Override
    Edition edition() {
        return Edition.FUNCTIONS;
    }
}
