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
 * gets its result, decoded as the same Receipt record. It prints how many
 * deliveries did work, how many were duplicates, and how many of those
 * waited for the first copy.
 */
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.Outcome;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.transport.JedisTransport;
import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import redis.clients.jedis.RedisClient;

public final class JavaConsumer {
    private JavaConsumer() {}

    /** What charging an order returns: stored as JSON, replayed as a Receipt. */
    public record Receipt(int order, long charged, long attempt) {}

    /** Charges an order: the attempt is a fencing number for downstream writes. */
    static Receipt charge(int order, long attempt) throws InterruptedException {
        Thread.sleep(20);
        return new Receipt(order, 100 + order, attempt);
    }

    public static void main(String[] args) throws Exception {
        int messages = args.length > 1 ? Integer.parseInt(args[1]) : 25;
        RedisClient jedis = RedisClient.create(URI.create(args[0]));
        IdemOptions options = IdemOptions.builder()
                .prefix("example:java:" + System.nanoTime() + ":")
                .waitFor(Duration.ofSeconds(5))
                .build();
        ExecutorService pool = Executors.newFixedThreadPool(8);
        try (Idem idem = new Idem(JedisTransport.of(jedis), options)) {
            List<Future<String>> deliveries = new ArrayList<>();
            for (int order = 0; order < messages; order++) {
                int id = order;
                for (int copy = 0; copy < 2; copy++) {
                    deliveries.add(pool.submit(() -> {
                        try {
                            Outcome<Receipt> out = idem.process("order:" + id, Receipt.class, job -> charge(id, job.attempt()));
                            if (out.value().order() != id) throw new IllegalStateException("another order's receipt: " + out.value());
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
