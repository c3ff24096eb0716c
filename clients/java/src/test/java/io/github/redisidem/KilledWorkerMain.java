package io.github.redisidem;

import io.github.redisidem.transport.JedisTransport;
import redis.clients.jedis.RedisClient;

/** A worker JVM that claims a key, says so, and works until it is killed. */
public final class KilledWorkerMain {
    private KilledWorkerMain() {}

    public static void main(String[] args) throws Exception {
        try (Idem idem = new Idem(JedisTransport.of(RedisClient.create("127.0.0.1", Integer.parseInt(args[0]))),
                IdemOptions.builder().lease(java.time.Duration.ofSeconds(1)).build())) {
            idem.process(args[1], job -> {
                System.out.println("RUNNING " + job.attempt());
                System.out.flush();
                Thread.sleep(600_000);
                return "never";
            });
        }
    }
}
