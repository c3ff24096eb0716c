package io.github.redisidem;

import java.util.ArrayList;
import java.util.List;

/**
 * The consumer loop over a {@link Transport} (Jedis or Lettuce, a server or
 * a cluster), for any number of threads.
 *
 * <pre>{@code
 * Idem idem = new Idem(JedisTransport.of(new JedisPooled("127.0.0.1", 6379)), IdemOptions.defaults().withPrefix("shop:"));
 * Outcome<Map<String, Object>> receipt = idem.process("order:1001", job -> charge(order, job.attempt()));
 * }</pre>
 */
public final class Idem implements AutoCloseable {
    private final Core core;
    private final IdemCommands commands;

    /**
     * With the defaults; asks the server which edition it has.
     *
     * @param transport the client
     */
    public Idem(Transport transport) {
        this(transport, IdemOptions.defaults());
    }

    /**
     * @param transport the client
     * @param options the settings
     */
    public Idem(Transport transport, IdemOptions options) {
        this.core = new Core(transport, options);
        this.commands = new IdemCommands(core);
    }

    /** @return the edition in use */
    public Edition edition() {
        return core.wire.edition;
    }

    /** @return the settings */
    public IdemOptions options() {
        return core.options;
    }

    /** @return the counters so far */
    public Stats stats() {
        return core.counters.snapshot();
    }

    /** @return the typed commands and batch helpers */
    public IdemCommands commands() {
        return commands;
    }

    /**
     * Runs {@code work} at most once for {@code key} while its record lives
     * (docs/clients.md, "What process does").
     *
     * @param key the business key (the prefix goes before it)
     * @param work the work
     * @param <T> its result
     * @return the work's result, or the stored one on a replay
     * @throws Exception the work's own failure (the claim was released), or one of the library's errors
     */
    public <T> Outcome<T> process(String key, Work<T> work) throws Exception {
        return process(key, null, work);
    }

    /**
     * As {@link #process(String, Work)}, with a payload: the same key with another payload is {@link MismatchException}.
     *
     * @param key the key
     * @param payload PAYLOAD (its fingerprint is stored), or null
     * @param work the work
     * @param <T> its result
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    @SuppressWarnings("unchecked")
    public <T> Outcome<T> process(String key, byte[] payload, Work<T> work) throws Exception {
        ProcessFlow flow = new ProcessFlow(core, key, payload);
        Step step = flow.start();
        while (true) {
            if (step instanceof Step.Send send) {
                Object reply = null;
                Throwable error = null;
                try {
                    reply = Core.join(core.transport.send(send.command()));
                } catch (RuntimeException e) {
                    error = e instanceof ServerException ? ServerException.of(e.getMessage()) : e;
                }
                step = flow.onReply(reply, error);
            } else if (step instanceof Step.Sleep sleep) {
                Thread.sleep(sleep.pause().toMillis());
                step = flow.afterSleep();
            } else if (step instanceof Step.RunWork run) {
                T value;
                try (Heartbeat beat = Heartbeat.start(core, List.of(run.job()))) {
                    value = work.run(run.job());
                } catch (Exception | Error e) {
                    step = flow.onWorkFailed(e);
                    continue;
                }
                step = flow.onWorkReturned(value);
            } else {
                Step.Finish finish = (Step.Finish) step;
                if (finish.error() == null) return (Outcome<T>) finish.outcome();
                if (finish.error() instanceof Exception e) throw e;
                throw (Error) finish.error();
            }
        }
    }

    /**
     * Claims every key in one batch, runs the work for each granted key (one
     * heartbeat for the batch), completes the successes in one DONE batch and
     * releases the failures in one RELEASE batch. A busy key is not waited for.
     *
     * @param keys the keys
     * @param work the work, called once per granted key
     * @param <T> its result
     * @return one item per key, in order
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, Work<T> work) {
        return processMany(keys, null, work);
    }

    /**
     * As {@link #processMany(List, Work)}, with one payload per key.
     *
     * @param keys the keys
     * @param payloads one per key, or null
     * @param work the work
     * @param <T> its result
     * @return one item per key, in order
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, List<byte[]> payloads, Work<T> work) {
        BatchFlow<T> flow = new BatchFlow<>(core, keys);
        List<Job> jobs = flow.onClaims(commands.claimMany(keys, core.options.lease(), payloads));
        List<Object> values = new ArrayList<>();
        List<Throwable> failures = new ArrayList<>();
        try (Heartbeat beat = Heartbeat.start(core, jobs)) {
            for (Job job : jobs) {
                Object value = null;
                Throwable failure = null;
                try {
                    value = work.run(job);
                } catch (Exception e) {
                    failure = e;
                }
                values.add(value);
                failures.add(failure);
            }
        }
        List<DoneItem> done = flow.onWorks(values, failures);
        flow.onDones(commands.doneMany(done, core.options.retain()));
        List<DoneItem> again = flow.withoutResults();
        if (!again.isEmpty()) flow.onDonesAgain(commands.doneMany(again, core.options.retain()));
        List<ReleaseItem> releases = flow.releases();
        if (!releases.isEmpty()) flow.onReleases(commands.releaseMany(releases));
        return flow.items();
    }

    /**
     * The batch helper of {@link IdemCommands#claimMany}.
     *
     * @param keys the keys
     * @param lease whole seconds
     * @return one answer per key
     */
    public List<Reply<Claim>> claimMany(List<String> keys, java.time.Duration lease) {
        return commands.claimMany(keys, lease, null);
    }

    /**
     * The batch helper of {@link IdemCommands#doneMany}, with the instance's retention.
     *
     * @param items the items
     * @return one answer per item
     */
    public List<Reply<Done>> doneMany(List<DoneItem> items) {
        return commands.doneMany(items, core.options.retain());
    }

    /**
     * The batch helper of {@link IdemCommands#releaseMany}.
     *
     * @param items the items
     * @return one answer per item
     */
    public List<Reply<Boolean>> releaseMany(List<ReleaseItem> items) {
        return commands.releaseMany(items);
    }

    /** Stops the heartbeat executor; the transport is the caller's to close. */
    @Override
    public void close() {
        core.scheduler.shutdownNow();
    }
}
