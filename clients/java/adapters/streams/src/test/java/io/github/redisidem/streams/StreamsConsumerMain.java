package io.github.redisidem.streams;

import io.github.redisidem.scenario.Scenario;
import io.github.redisidem.transport.JedisTransport;
import java.util.concurrent.CountDownLatch;

/** The java-streams consumer of brokers/scenario.py: a StreamConsumer on the records' own server. */
public final class StreamsConsumerMain {
    private StreamsConsumerMain() {}

    public static void main(String[] args) throws Exception {
        Scenario env = new Scenario();
        StreamConsumer consumer = StreamConsumer.builder(JedisTransport.of(env.records()), env.source, env.group)
                .idemOptions(env.idemOptions())
                .consumer("member-" + env.member)
                .concurrency(1) // one entry at a time: the scenario watches what each member is at work on
                .onError(e -> System.err.println("member " + env.member + ": " + e))
                .build();
        CountDownLatch finished = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> { // SIGTERM: finish the entry in hand
            consumer.stop();
            try {
                finished.await();
            } catch (InterruptedException ignored) {
                Thread.currentThread().interrupt();
            }
        }));
        try {
            consumer.run((entry, job) -> env.work(entry.field("body"), job));
        } finally {
            System.err.println("member " + env.member + ": " + consumer.stats());
            consumer.close();
            finished.countDown();
        }
    }
}
