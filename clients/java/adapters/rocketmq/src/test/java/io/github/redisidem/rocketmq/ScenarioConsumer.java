package io.github.redisidem.rocketmq;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import redis.clients.jedis.RedisClient;

/**
 * The scenario's consumer program (brokers/README.md, "Writing a consumer
 * program") for java-rocketmq (IdemConcurrentlyListener) and
 * java-rocketmq-orderly (IdemOrderlyListener); `produce` and `inspect` are
 * in {@link ScenarioTools} (RocketMQ has no Python client here).
 */
public final class ScenarioConsumer {
    /** brokers/launch.py's messageDelayLevel. */
    static final String LAUNCHER_DELAY_LEVELS = "1s 1s 2s 2s 3s 3s 4s 4s 5s 5s 6s 6s 7s 7s 8s 8s 9s 9s";
    static final ObjectMapper JSON = new ObjectMapper();

    private ScenarioConsumer() {}

    public static void main(String[] args) throws Exception {
        System.setProperty("rocketmq.client.logRoot", "target/brokers/rocketmq-client-logs");
        // Orderly queues' locks at a tenth of RocketMQ's defaults, as brokers/launch.py's broker holds them (6 s):
        // a killed member's queues move in seconds, not a minute.
        System.setProperty("rocketmq.client.rebalance.lockInterval", "2000");
        System.setProperty("rocketmq.client.rebalance.lockMaxLiveTime", "3000");
        // RocketMQ's client threads are not daemons: the program ends by exit, 1 on any error. `produce` and `inspect`
        // exit without the clients' shutdown (seconds of joining their service threads; every send was answered).
        try {
            if (args.length > 0 && args[0].equals("produce")) {
                ScenarioTools.produce(new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)));
            } else if (args.length > 0 && args[0].equals("inspect")) {
                for (int attempt = 1; ; attempt++) {   // read-only: again after a transient failure
                    try {
                        ScenarioTools.inspect();
                        break;
                    } catch (Exception e) {
                        if (attempt == 3) {
                            throw e;
                        }
                        Thread.sleep(500);
                    }
                }
            } else {
                consume();
            }
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
        }
        System.exit(0);
    }

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null) {
            throw new IllegalStateException(name + " is not set");
        }
        return v;
    }

    static boolean orderly() {
        return env("IDEM_ADAPTER").endsWith("-orderly");
    }

    static String namesrv() throws Exception {
        return (String) JSON.readValue(env("BROKER"), Map.class).get("namesrv");
    }

    private static DefaultMQPushConsumer consumer(String member, int attempt) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(env("IDEM_GROUP"));
        consumer.setNamesrvAddr(namesrv());
        consumer.setInstanceName("member" + member + "-" + ProcessHandle.current().pid() + "-" + attempt);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(env("IDEM_SOURCE"), "*");
        consumer.setAwaitTerminationMillisWhenShutdown(30_000);   // SIGTERM: the message in hand finishes
        consumer.setPersistConsumerOffsetInterval(1_000);
        // One work at a time per member, as the scenario's side store records it (one `working` entry per member:
        // the member it kills or stops must be the one caught in slow work).
        consumer.setConsumeThreadMin(1);
        consumer.setConsumeThreadMax(1);
        return consumer;
    }

    private static void consume() throws Exception {
        String member = env("IDEM_MEMBER");
        long workMs = Long.parseLong(env("IDEM_WORK_MS"));
        long slowMs = Long.parseLong(env("IDEM_SLOW_WORK_MS"));
        String startSha = env("SIDE_START_SHA");
        String effectSha = env("SIDE_EFFECT_SHA");
        RedisClient side = RedisClient.create(env("SIDE_REDIS_URL"));
        RedisClient records = RedisClient.create(env("IDEM_REDIS_URL"));

        // What a user writes: the Idem (with maxTries), the consumer, the listener.
        Idem idem = new Idem(JedisTransport.of(records), IdemOptions.builder()
                .lease(Duration.ofSeconds(Long.parseLong(env("IDEM_LEASE_S"))))
                .maxTries(Integer.parseInt(env("IDEM_MAX_TRIES"))).build());
        RocketMQOptions options = RocketMQOptions.builder().delayLevels(LAUNCHER_DELAY_LEVELS).build();
        MessageWork<Map<String, Object>> work = (message, job) -> {
            Map<?, ?> body = JSON.readValue(message.getBody(), Map.class);
            String key = (String) body.get("key");
            String kind = (String) body.get("kind");
            Object started = side.evalsha(startSha, List.of(key), List.of(kind, member));
            if ("fail".equals(started)) {
                throw new IllegalStateException("the work failed for " + key + " (" + kind + ")");
            }
            Thread.sleep(kind.equals("slow") ? slowMs : workMs);
            side.evalsha(effectSha, List.of(key), List.of(String.valueOf(job.attempt()), String.valueOf(body.get("account")),
                    String.valueOf(body.get("seq")), member));
            return Map.of("n", body.get("seq"));
        };
        CountDownLatch term = new CountDownLatch(1);
        sun.misc.Signal.handle(new sun.misc.Signal("TERM"), s -> term.countDown());
        DefaultMQPushConsumer consumer = null;
        // A start that fails (the name server's answer lost on a loaded machine) leaves that consumer unusable:
        // another one, a few times.
        for (int attempt = 1; consumer == null; attempt++) {
            DefaultMQPushConsumer c = consumer(member, attempt);
            if (orderly()) {
                IdemOrderlyListener.register(c, idem, options, work);
            } else {
                IdemConcurrentlyListener.register(c, idem, options, work);
            }
            try {
                c.start();
                consumer = c;
            } catch (Exception e) {
                c.shutdown();
                if (attempt == 5) {
                    throw e;
                }
                e.printStackTrace();
                Thread.sleep(1_000);
            }
        }
        term.await();
        consumer.shutdown();   // waits for the work in hand, commits the offsets, leaves the group
        idem.close();
        records.close();
        side.close();
    }
}
