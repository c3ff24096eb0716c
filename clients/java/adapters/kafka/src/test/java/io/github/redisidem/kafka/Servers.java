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

    static synchronized RedisClient redis() throws IOException, InterruptedException {
        if (redisPort == 0) {
            String module = System.getenv().getOrDefault("REDIS_IDEM_MODULE", REPO.resolve("target/release/libredis_idem.so").toString());
            String server = System.getenv().getOrDefault("REDIS7_SERVER", "redis-server");
            try (ServerSocket s = new ServerSocket(0)) {
                redisPort = s.getLocalPort();
            }
            Path dir = Files.createTempDirectory("java-kafka-redis");
            Process p = new ProcessBuilder(server, "--port", String.valueOf(redisPort), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", dir.toString(), "--loadmodule", module)
                    .redirectErrorStream(true).redirectOutput(dir.resolve("redis.log").toFile()).start();
            PROCESSES.add(p);
            Runtime.getRuntime().addShutdownHook(new Thread(p::destroy));
            long deadline = System.nanoTime() + Duration.ofSeconds(20).toNanos();
            while (true) {
                try (RedisClient c = RedisClient.create("127.0.0.1", redisPort)) {
                    c.ping();
                    break;
                } catch (RuntimeException e) {
                    if (System.nanoTime() > deadline || !p.isAlive()) {
                        throw new IllegalStateException("redis-server did not start: " + Files.readString(dir.resolve("redis.log")), e);
                    }
                    Thread.sleep(50);
                }
            }
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
