/*
 * A minimal redis-idem consumer with the Java library (clients/java), over Jedis.
 *
 * Usage: java -cp <redis-idem, jedis, jackson> JavaConsumer redis://127.0.0.1:6379 [messages]
 *
 * Each message is delivered twice, the copies side by side, and processed
 * once: idem.process claims the key, runs the work while the library keeps
 * the lease alive, and completes the record with the result (or releases it
 * if the work threw, so that a retry can run at once). A copy that arrives
 * while the other is still at work waits for it (WAIT on the server) and
 * gets its result. It prints how many deliveries did work, how many were
 * duplicates, and how many of those waited for the first copy.
 */
import io.github.redisidem.BusyException;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.JedisTransport;
import io.github.redisidem.Outcome;
import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import redis.clients.jedis.RedisClient;

public final class JavaConsumer {
    private JavaConsumer() {}

    /** Charges an order: the attempt is a fencing number for downstream writes. */
    static Map<String, Object> charge(int order, long attempt) throws InterruptedException {
        Thread.sleep(20);
        return Map.of("order", order, "charged", 100 + order, "attempt", attempt);
    }

    public static void main(String[] args) throws Exception {
        int messages = args.length > 1 ? Integer.parseInt(args[1]) : 25;
        RedisClient jedis = RedisClient.create(URI.create(args[0]));
        IdemOptions options = IdemOptions.defaults().withPrefix("example:java:" + System.nanoTime() + ":").withWait(Duration.ofSeconds(5));
        ExecutorService pool = Executors.newFixedThreadPool(8);
        try (Idem idem = new Idem(JedisTransport.of(jedis), options)) {
            List<Future<String>> deliveries = new ArrayList<>();
            for (int order = 0; order < messages; order++) {
                int id = order;
                for (int copy = 0; copy < 2; copy++) {
                    deliveries.add(pool.submit(() -> {
                        try {
                            Outcome<Map<String, Object>> out = idem.process("order:" + id, job -> charge(id, job.attempt()));
                            return out.replayed() ? "duplicate" : "processed"; // acknowledge the message either way
                        } catch (BusyException e) {
                            return "busy"; // still at work after the wait: do not acknowledge, it comes back
                        }
                    }));
                }
            }
            int processed = 0;
            int duplicates = 0;
            for (Future<String> d : deliveries) {
                String what = d.get();
                if (what.equals("processed")) processed++;
                else if (what.equals("duplicate")) duplicates++;
            }
            System.out.println("java: processed=" + processed + " duplicates=" + duplicates + " waited=" + idem.stats().waits());
        } finally {
            pool.shutdown();
            jedis.close();
        }
    }
}
