package io.github.redisidem;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;

/**
 * {@code processMany}: one {@link ProcessFlow} per key (the single call's
 * decisions, with no wait for a busy key), driven in rounds: every flow's
 * command of a kind goes in one batch (claims, DONEs, RELEASEs, GETs), the
 * granted works run under one heartbeat, the pauses are slept once. This
 * class decides nothing itself: it only batches what the flows ask.
 *
 * @param <T> the works' result
 */
final class Many<T> {
    private final Core core;
    private final List<String> keys;
    private final List<ProcessFlow<T>> flows;
    private final Step[] steps;

    private Many(Core core, List<String> keys, List<byte[]> payloads, Codec<T> codec) {
        if (payloads != null && payloads.size() != keys.size()) {
            throw new IllegalArgumentException("one payload per key: " + payloads.size() + " payloads for " + keys.size() + " keys");
        }
        this.core = core;
        this.keys = List.copyOf(keys);
        this.flows = new ArrayList<>(keys.size());
        this.steps = new Step[keys.size()];
        for (int i = 0; i < keys.size(); i++) {
            ProcessFlow<T> flow = new ProcessFlow<>(core, keys.get(i), payloads == null ? null : payloads.get(i), codec, Duration.ZERO);
            flows.add(flow);
            steps[i] = flow.start();
        }
    }

    static <T> List<BatchItem<T>> blocking(Core core, List<String> keys, List<byte[]> payloads, Codec<T> codec, Work<? extends T> work)
            throws InterruptedException {
        Many<T> many = new Many<>(core, keys, payloads, codec);
        while (!many.finished()) {
            Core.join(many.sends());
            many.runAll(work);
            long pause = many.pause();
            if (pause > 0) Thread.sleep(pause);
            many.afterSleep();
        }
        return many.items();
    }

    static <T> CompletableFuture<List<BatchItem<T>>> async(Core core, List<String> keys, List<byte[]> payloads, Codec<T> codec,
                                                            AsyncWork<? extends T> work, Executor executor) {
        Many<T> many;
        try {
            many = new Many<>(core, keys, payloads, codec);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        return many.loop(work, executor);
    }

    private CompletableFuture<List<BatchItem<T>>> loop(AsyncWork<? extends T> work, Executor executor) {
        if (finished()) return CompletableFuture.completedFuture(items());
        return sends().thenComposeAsync(v -> runAllAsync(work, executor), executor).thenComposeAsync(v -> {
            long pause = pause();
            Executor later = pause > 0 ? CompletableFuture.delayedExecutor(pause, TimeUnit.MILLISECONDS, executor) : executor;
            return CompletableFuture.runAsync(this::afterSleep, later);
        }, executor).thenCompose(v -> loop(work, executor));
    }

    private boolean finished() {
        for (Step s : steps) if (!(s instanceof Step.Finish)) return false;
        return true;
    }

    /** Every flow's command, batched by kind; each answer back to its flow. */
    private CompletableFuture<Void> sends() {
        List<CompletableFuture<Void>> sent = new ArrayList<>(4);
        sent.add(batch(Step.Claim.class, ops -> core.batches.claims(ops)));
        sent.add(batch(Step.Done.class, ops -> core.batches.dones(ops)));
        sent.add(batch(Step.Release.class, ops -> core.batches.releases(ops)));
        sent.add(batch(Step.Get.class, ops -> core.batches.gets(ops)));
        return CompletableFuture.allOf(sent.toArray(new CompletableFuture<?>[0]));
    }

    private <O extends Step> CompletableFuture<Void> batch(Class<O> kind, java.util.function.Function<List<O>, CompletableFuture<List<Answer>>> send) {
        List<Integer> at = new ArrayList<>();
        List<O> ops = new ArrayList<>();
        for (int i = 0; i < steps.length; i++) {
            if (kind.isInstance(steps[i])) {
                at.add(i);
                ops.add(kind.cast(steps[i]));
            }
        }
        if (ops.isEmpty()) return CompletableFuture.completedFuture(null);
        return send.apply(ops).thenAccept(answers -> {
            for (int j = 0; j < at.size(); j++) steps[at.get(j)] = flows.get(at.get(j)).onAnswer(answers.get(j));
        });
    }

    private List<Integer> runs() {
        List<Integer> at = new ArrayList<>();
        for (int i = 0; i < steps.length; i++) if (steps[i] instanceof Step.Run) at.add(i);
        return at;
    }

    /** The granted works, one after another, under one heartbeat; a failure of any kind (an Error too) releases its key. */
    private void runAll(Work<? extends T> work) {
        List<Integer> at = runs();
        if (at.isEmpty()) return;
        for (int i : at) core.heartbeat.start(((Step.Run) steps[i]).job());
        List<Object> values = new ArrayList<>(at.size());
        List<Throwable> failures = new ArrayList<>(at.size());
        try {
            for (int i : at) {
                Object value = null;
                Throwable failure = null;
                try {
                    value = work.run(((Step.Run) steps[i]).job());
                } catch (Throwable e) {
                    failure = e;
                }
                values.add(value);
                failures.add(failure);
            }
        } finally {
            for (int i : at) core.heartbeat.stop(((Step.Run) steps[i]).job());
        }
        settle(at, values, failures);
    }

    @SuppressWarnings("unchecked")
    private void settle(List<Integer> at, List<Object> values, List<Throwable> failures) {
        for (int j = 0; j < at.size(); j++) {
            int i = at.get(j);
            steps[i] = failures.get(j) != null ? flows.get(i).onWorkFailed(failures.get(j)) : flows.get(i).onWorkReturned((T) values.get(j));
        }
    }

    private CompletableFuture<Void> runAllAsync(AsyncWork<? extends T> work, Executor executor) {
        List<Integer> at = runs();
        if (at.isEmpty()) return CompletableFuture.completedFuture(null);
        List<CompletableFuture<Object>> running = new ArrayList<>(at.size());
        for (int i : at) {
            Job job = ((Step.Run) steps[i]).job();
            core.heartbeat.start(job);
            CompletableFuture<Object> f;
            try {
                CompletionStage<? extends T> stage = work.run(job);
                f = stage.toCompletableFuture().thenApply(v -> (Object) v);
            } catch (Throwable e) {
                f = CompletableFuture.failedFuture(e);
            }
            running.add(f);
        }
        List<Object> values = new ArrayList<>(at.size());
        List<Throwable> failures = new ArrayList<>(at.size());
        CompletableFuture<?>[] handled = new CompletableFuture<?>[running.size()];
        for (int j = 0; j < running.size(); j++) handled[j] = running.get(j).handle((v, e) -> null);
        return CompletableFuture.allOf(handled).thenRunAsync(() -> {
            for (int j = 0; j < at.size(); j++) {
                core.heartbeat.stop(((Step.Run) steps[at.get(j)]).job());
                CompletableFuture<Object> f = running.get(j);
                Object value = null;
                Throwable failure = null;
                try {
                    value = f.join();
                } catch (RuntimeException e) {
                    failure = Core.unwrap(e);
                }
                values.add(value);
                failures.add(failure);
            }
            settle(at, values, failures);
        }, executor);
    }

    /** The longest pause the flows asked for (ms), 0 when none did. */
    private long pause() {
        long ms = 0;
        for (Step s : steps) if (s instanceof Step.Sleep sleep) ms = Math.max(ms, sleep.pause().toMillis());
        return ms;
    }

    private void afterSleep() {
        for (int i = 0; i < steps.length; i++) if (steps[i] instanceof Step.Sleep) steps[i] = flows.get(i).afterSleep();
    }

    private List<BatchItem<T>> items() {
        List<BatchItem<T>> out = new ArrayList<>(steps.length);
        for (int i = 0; i < steps.length; i++) out.add(((Step.Finish) steps[i]).result().item(keys.get(i)));
        return out;
    }
}
