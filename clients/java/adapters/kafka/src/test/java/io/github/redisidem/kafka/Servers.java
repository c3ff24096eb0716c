package io.github.redisidem.kafka;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.RedisClient;

/**
 * The real servers of this module's tests, started once per JVM and stopped at its exit: Kafka
 * (brokers/launch.py) and a Redis 7 with the module (REDIS_IDEM_MODULE, or the checkout's build).
 */
final class Servers {
    static final Path REPO = Path.of(System.getProperty("redis.idem.repo", "../../../..")).toAbsolutePath().normalize();
    private static String bootstrap;
    private static int redisPort;
    private static final List<Process> PROCESSES = new ArrayList<>();

    private Servers() {}

    static synchronized String kafka() throws IOException, InterruptedException {
        if (bootstrap == null) {
            Path dir = REPO.resolve("target/t/java-kafka-" + ProcessHandle.current().pid());
            String out = run("python3", "brokers/launch.py", "start", "kafka", "--dir", dir.toString());
            Matcher m = Pattern.compile("\"bootstrap\": \"([^\"]+)\"").matcher(out);
            if (!m.find()) {
                throw new IllegalStateException("brokers/launch.py: " + out);
            }
            bootstrap = m.group(1);
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                try {
                    run("python3", "brokers/launch.py", "stop", "--dir", dir.toString());
                } catch (Exception e) {
                    System.err.println("stopping kafka: " + e);
                }
            }));
        }
        return bootstrap;
    }

    /**
     * A redis-server run with {@code args} on a port that was free a moment
     * ago, once it answers with its own pid: another suite's server can take
     * the port first, and ours exits while theirs answers a PING.
     */
    static Started startRedis(List<String> args, Path log) throws IOException, InterruptedException {
        for (int tries = 1; ; tries++) {
            int port;
            try (ServerSocket s = new ServerSocket(0)) {
                port = s.getLocalPort();
            }
            List<String> command = new ArrayList<>(args);
            command.addAll(List.of("--port", "" + port, "--bind", "127.0.0.1"));
            Process p = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log.toFile()).start();
            long deadline = System.nanoTime() + Duration.ofSeconds(20).toNanos();
            String info = null;
            while (info == null && p.isAlive() && System.nanoTime() < deadline) {
                try (Jedis j = new Jedis("127.0.0.1", port)) {
                    info = j.info("server");
                } catch (RuntimeException e) {
                    Thread.sleep(20);
                }
            }
            if (info != null && info.contains("process_id:" + p.pid() + "\r\n")) return new Started(p, port);
            p.destroyForcibly().waitFor();
            if (tries == 5) throw new IllegalStateException("redis-server did not start: " + Files.readString(log));
        }
    }

    record Started(Process process, int port) {}

    static synchronized RedisClient redis() throws IOException, InterruptedException {
        if (redisPort == 0) {
            String module = System.getenv().getOrDefault("REDIS_IDEM_MODULE", REPO.resolve("target/release/libredis_idem.so").toString());
            String server = System.getenv().getOrDefault("REDIS7_SERVER", "redis-server");
            Path dir = Files.createTempDirectory("java-kafka-redis");
            Started started = startRedis(List.of(server, "--save", "", "--appendonly", "no", "--dir", dir.toString(),
                    "--loadmodule", module), dir.resolve("redis.log"));
            PROCESSES.add(started.process());
            Runtime.getRuntime().addShutdownHook(new Thread(started.process()::destroy));
            redisPort = started.port();
        }
        return RedisClient.create("127.0.0.1", redisPort);
    }

    private static String run(String... command) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(command).directory(REPO.toFile()).redirectError(ProcessBuilder.Redirect.INHERIT).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (p.waitFor() != 0) {
            throw new IllegalStateException(String.join(" ", command) + " failed: " + out);
        }
        return out;
    }
}
