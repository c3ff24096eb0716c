/*
 * The Java library's side of make bench-clients (bench/clients/README.md):
 * process() of redis-idem against the hand-made SET NX PX + SET XX pair,
 * written with the same client (Jedis by default; --client lettuce, or
 * REDIS_IDEM_JAVA_CLIENT=lettuce for make bench-clients), at N
 * messages in flight (N platform threads sharing one instance and client).
 * Prints {"seconds": <timed part>, "messages": N} as its last line.
 */
import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.redisidem.Edition;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import io.github.redisidem.transport.LettuceTransport;
import io.github.redisidem.transport.Transport;
import io.lettuce.core.RedisURI;
import io.lettuce.core.SetArgs;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import java.net.URI;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.commons.pool2.impl.GenericObjectPoolConfig;
import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.params.SetParams;

public final class Bench {
    private Bench() {}

    /** One message of a scenario, given its key and index. */
    interface Message {
        void handle(String key, int i) throws Exception;
    }

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final SecureRandom RANDOM = new SecureRandom();

    static Map<String, String> args(String[] argv) {
        Map<String, String> a = new HashMap<>(Map.of("--impl", "idem", "--scenario", "first", "--inflight", "1", "--messages", "2000",
                "--prefix", "bench:java:", "--edition", "module", "--batch", "default",
                "--client", System.getenv().getOrDefault("REDIS_IDEM_JAVA_CLIENT", "jedis")));
        for (int i = 0; i + 1 < argv.length; i += 2) a.put(argv[i], argv[i + 1]);
        if (!a.containsKey("--url")) throw new IllegalArgumentException("--url redis://127.0.0.1:PORT is required");
        return a;
    }

    static String token() {
        byte[] b = new byte[16];
        RANDOM.nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = args(argv);
        URI url = URI.create(a.get("--url"));
        int inflight = Integer.parseInt(a.get("--inflight"));
        int messages = Integer.parseInt(a.get("--messages"));
        String prefix = a.get("--prefix");
        boolean jedis = a.get("--client").equals("jedis");
        List<AutoCloseable> open = new ArrayList<>();
        Message first;
        Message replay;
        if (a.get("--impl").equals("idem")) {
            Transport transport;
            if (jedis) {
                RedisClient client = jedisClient(url, inflight);
                open.add(client);
                transport = JedisTransport.of(client);
            } else {
                io.lettuce.core.RedisClient client = io.lettuce.core.RedisClient.create();
                open.add(client::shutdown);
                transport = LettuceTransport.of(client, RedisURI.create(url));
                open.add(transport);
            }
            IdemOptions.Builder options = IdemOptions.builder().edition(a.get("--edition").equals("functions") ? Edition.FUNCTIONS : Edition.MODULE);
            if (!a.get("--batch").equals("default")) options.batch(a.get("--batch").equals("on"));
            Idem idem = new Idem(transport, options.build());
            open.add(0, idem);
            Message run = (key, i) -> idem.process(key, job -> Map.of("n", i));
            first = run;
            replay = run;
        } else if (a.get("--impl").equals("pair")) {
            if (jedis) {
                RedisClient client = jedisClient(url, inflight);
                open.add(client);
                first = (key, i) -> {
                    if ("OK".equals(client.set(key, token(), SetParams.setParams().nx().px(30_000)))) {
                        Map<String, Integer> result = Map.of("n", i);
                        client.set(key, JSON.writeValueAsString(result), SetParams.setParams().xx().ex(86_400));
                    } else {
                        decode(client.get(key));
                    }
                };
                replay = (key, i) -> decode(client.get(key));
            } else {
                io.lettuce.core.RedisClient client = io.lettuce.core.RedisClient.create();
                open.add(client::shutdown);
                StatefulRedisConnection<String, String> connection = client.connect(RedisURI.create(url));
                open.add(connection);
                RedisCommands<String, String> sync = connection.sync();
                first = (key, i) -> {
                    if ("OK".equals(sync.set(key, token(), SetArgs.Builder.nx().px(30_000)))) {
                        Map<String, Integer> result = Map.of("n", i);
                        sync.set(key, JSON.writeValueAsString(result), SetArgs.Builder.xx().ex(86_400));
                    } else {
                        decode(sync.get(key));
                    }
                };
                replay = (key, i) -> decode(sync.get(key));
            }
        } else {
            throw new IllegalArgumentException("--impl idem|pair (powertools: Python and Node only)");
        }
        try {
            // Connections, JIT and class loading outside the figure: 200 messages under warm:, both paths.
            int warm = Integer.parseInt(System.getProperty("bench.warm", "200"));
            drive(first, prefix + "warm:", warm, inflight);
            drive(replay, prefix + "warm:", warm, inflight);
            Message timed = a.get("--scenario").equals("replay") ? replay : first;
            long start = System.nanoTime();
            drive(timed, prefix, messages, inflight);
            double seconds = (System.nanoTime() - start) / 1e9;
            System.out.println("{\"seconds\": " + seconds + ", \"messages\": " + messages + "}");
        } finally {
            for (AutoCloseable c : open) c.close();
        }
    }

    static Object decode(String stored) throws Exception {
        return stored == null ? null : JSON.readValue(stored, Object.class);
    }

    /** Jedis's pool sized for the threads, the same for both sides. */
    static RedisClient jedisClient(URI url, int inflight) {
        GenericObjectPoolConfig<Connection> pool = new GenericObjectPoolConfig<>();
        pool.setMaxTotal(Math.max(8, inflight + 8));
        pool.setMaxIdle(Math.max(8, inflight + 8));
        return RedisClient.builder().hostAndPort(new HostAndPort(url.getHost(), url.getPort()))
                .clientConfig(DefaultJedisClientConfig.builder().build()).poolConfig(pool).build();
    }

    /** N workers, each taking the next message index until all are done. */
    static void drive(Message message, String prefix, int messages, int inflight) throws Exception {
        AtomicInteger next = new AtomicInteger();
        AtomicReference<Exception> failed = new AtomicReference<>();
        Thread[] workers = new Thread[inflight];
        for (int w = 0; w < inflight; w++) {
            workers[w] = new Thread(() -> {
                int i;
                while (failed.get() == null && (i = next.getAndIncrement()) < messages) {
                    try {
                        message.handle(prefix + i, i);
                    } catch (Exception e) {
                        failed.compareAndSet(null, e);
                    }
                }
            });
            workers[w].start();
        }
        for (Thread t : workers) t.join();
        if (failed.get() != null) throw failed.get();
    }
}
