package io.github.redisidem;

/** The conformance cases: Redis7Module (REDIS7_SERVER, the module edition). */
class Redis7ModuleConformanceTest extends ConformanceBase {
    @Override
    String binary() {
        return "REDIS7_SERVER";
    }

    @Override
    Edition edition() {
        return Edition.MODULE;
    }
}
