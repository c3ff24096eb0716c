package io.github.redisidem;

/** The conformance cases: Redis8Module (REDIS8_SERVER, the module edition). */
class Redis8ModuleConformanceTest extends ConformanceBase {
    @Override
    String binary() {
        return "REDIS8_SERVER";
    }

    @Override
    Edition edition() {
        return Edition.MODULE;
    }
}
