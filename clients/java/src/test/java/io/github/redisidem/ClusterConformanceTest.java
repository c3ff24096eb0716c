package io.github.redisidem;

/** The conformance cases: Cluster (REDIS7_SERVER, the module edition). */
class ClusterConformanceTest extends ConformanceBase {
    @Override
    String binary() {
        return "REDIS7_SERVER";
    }

    @Override
    Edition edition() {
        return Edition.MODULE;
    }

    @Override
    boolean cluster() {
        return true;
    }
}
