package io.github.redisidem;

/** The conformance cases: ValkeyModule (VALKEY_SERVER, the module edition). */
class ValkeyModuleConformanceTest extends ConformanceBase {
    @Override
    String binary() {
        return "VALKEY_SERVER";
    }

    @Override
    Edition edition() {
        return Edition.MODULE;
    }
}
