package io.github.redisidem;

import java.util.List;
import java.util.Map;
import redis.clients.jedis.Jedis;

/** The replicated and Sentinel topologies' operations: who is primary, replicas detached and attached, a failover. */
final class Topologies {
    private Topologies() {}

    private static final long PATIENCE_MS = 60_000;

    /** The primary the Sentinel names now. */
    static int primary(Servers.Server s) {
        try (Jedis sentinel = new Jedis("127.0.0.1", s.sentinelPort)) {
            List<String> addr = sentinel.sentinelGetMasterAddrByName("mymaster");
            return Integer.parseInt(addr.get(1));
        }
    }

    private static Map<String, String> info(int port) {
        try (Jedis j = new Jedis("127.0.0.1", port)) {
            Map<String, String> out = new java.util.HashMap<>();
            for (String line : j.info("replication").split("\r?\n")) {
                int colon = line.indexOf(':');
                if (colon > 0) out.put(line.substring(0, colon), line.substring(colon + 1).trim());
            }
            return out;
        }
    }

    private interface Check {
        boolean ok() throws Exception;
    }

    private static void await(Check check, String what) throws InterruptedException {
        long deadline = System.currentTimeMillis() + PATIENCE_MS;
        while (true) {
            try {
                if (check.ok()) return;
            } catch (Exception e) {
                // not yet
            }
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException("timed out waiting: " + what);
            Thread.sleep(50);
        }
    }

    /** Until the primary lists the replica online at its own offset. */
    static void awaitReplica(int primary, int replica) throws InterruptedException {
        await(() -> {
            Map<String, String> p = info(primary);
            if (!"master".equals(p.get("role"))) return false;
            for (Map.Entry<String, String> e : p.entrySet()) {
                if (e.getKey().matches("slave\\d+") && e.getValue().contains("port=" + replica + ",") && e.getValue().contains("state=online")
                        && e.getValue().contains("offset=" + p.get("master_repl_offset") + ",")) {
                    // And acknowledging a write of this connection's own: a replica listed
                    // online may still be loading its full sync, and a WAIT after no write
                    // answers at once (clients/conformance/README.md).
                    if (!"up".equals(info(replica).get("master_link_status"))) return false;
                    try (Jedis j = new Jedis("127.0.0.1", primary)) {
                        j.set("topology:acknowledged", String.valueOf(System.nanoTime()));
                        return j.waitReplicas(1, 1000) >= 1;
                    }
                }
            }
            return false;
        }, "replica " + replica + " of " + primary);
    }

    /** Until the Sentinel lists {@code replica} as a replica it could promote. */
    static void awaitSentinelKnows(Servers.Server s, int replica) throws InterruptedException {
        await(() -> {
            try (Jedis sentinel = new Jedis("127.0.0.1", s.sentinelPort)) {
                for (Map<String, String> r : sentinel.sentinelReplicas("mymaster")) {
                    if (r.get("port").equals("" + replica) && r.get("flags").equals("slave") && "ok".equals(r.get("master-link-status"))) return true;
                }
                return false;
            }
        }, "the Sentinel knows replica " + replica);
    }

    /** REPLICAOF NO ONE on the replica: it stops acknowledging (the primary sees its link close). */
    static void detach(Servers.Server s) throws InterruptedException {
        int replica = s.replicaPort();
        int primary = s.port();
        try (Jedis j = new Jedis("127.0.0.1", replica)) {
            j.replicaofNoOne();
        }
        await(() -> !info(primary).containsKey("slave0"), "the primary sees its replica gone");
    }

    /** The replica a replica of the primary again, online at the primary's offset. */
    static void attach(Servers.Server s) throws InterruptedException {
        int replica = s.replicaPort();
        int primary = s.port();
        try (Jedis j = new Jedis("127.0.0.1", replica)) {
            j.replicaof("127.0.0.1", primary);
        }
        awaitReplica(primary, replica);
    }

    /** Whether the replica is detached (a case that ended with it so). */
    static boolean detached(Servers.Server s) {
        return "master".equals(info(s.replicaPort()).get("role"));
    }

    /**
     * SENTINEL FAILOVER mymaster, then until the Sentinel names the other
     * server, it answers ROLE as master, and the old primary is its replica
     * with the link up. (The Sentinel learns the old primary is a replica up
     * to 10 s later: {@link #ready} waits for that before the next case.)
     */
    static void failover(Servers.Server s) throws InterruptedException {
        int old = s.port();
        int next = s.replicaPort();
        // The replica has what the case wrote (a Sentinel failover loses what it had not: asynchronous
        // replication, which the case is not about).
        awaitReplica(old, next);
        try (Jedis sentinel = new Jedis("127.0.0.1", s.sentinelPort)) {
            sentinel.sentinelFailover("mymaster");
        }
        await(() -> primary(s) == next, "the Sentinel names " + next);
        await(() -> "master".equals(info(next).get("role")), next + " is master");
        awaitReplica(next, old);
    }

    /** Before a case: the Sentinel knows the replica it would promote. */
    static void ready(Servers.Server s) throws InterruptedException {
        awaitSentinelKnows(s, s.replicaPort());
    }
}
