package io.github.redisidem;

import io.github.redisidem.exceptions.ServerException;
import io.github.redisidem.transport.RedisCommand;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.function.Function;
import java.util.function.Predicate;

/**
 * The flows' commands as they go to the server: one at a time, or many
 * flows' at once — on the module one IDEM.MCLAIM / MDONE / MRELEASE per
 * slot and 10,000 keys, on the Functions edition single commands
 * pipelined per slot — with durable's WAIT after each (one per batch
 * command). Every flow gets exactly the answer its single command would
 * have had.
 */
final class Batches {
    private final Core core;
    private final Wire wire;
    private final IdemOptions options;
    private final Durable durable;
    private final String owner;

    Batches(Core core) {
        this.core = core;
        this.wire = core.wire;
        this.options = core.options;
        this.durable = options.durable();
        this.owner = options.owner();
    }

    private RedisCommand single(Step op) {
        if (op instanceof Step.Claim c) {
            return wire.claim(c.recordKey(), c.lease(), c.payload(), options.maxTries(), options.bloom(), owner, c.waitFor());
        }
        if (op instanceof Step.Done d) return wire.done(d.recordKey(), d.token(), d.result(), d.retain(), options.bloom(), options.doneTimeout());
        if (op instanceof Step.Release r) return wire.release(r.recordKey(), r.token(), options.doneTimeout());
        return wire.get(((Step.Get) op).recordKey());
    }

    private boolean waits(Step op) {
        return durable != null && (op instanceof Step.Claim || op instanceof Step.Done);
    }

    /**
     * A write and its WAIT must reach one server once each: a client that
     * sent the WAIT again by itself after a reconnect would count the
     * replicas of another primary (Lettuce resends what was in flight). So
     * both carry a deadline, which also bounds them: {@code done_timeout}
     * for a DONE, the WAIT's own timeout and that much again for a claim.
     */
    private Duration pairDeadline(Step op) {
        Duration waitAndMargin = durable.timeout().plus(options.doneTimeout());
        if (op instanceof Step.Done) return options.doneTimeout().compareTo(durable.timeout()) > 0 ? options.doneTimeout() : waitAndMargin;
        return waitAndMargin;
    }

    private static RedisCommand guarded(RedisCommand c, Duration deadline) {
        return new RedisCommand(c.name(), c.key(), c.args(), c.block(), c.deadline() != null && c.deadline().compareTo(deadline) > 0 ? c.deadline() : deadline);
    }

    private RedisCommand waitAfter(Step op) {
        return Wire.durable(durable, pairDeadline(op));
    }

    /** One step's command (and its WAIT), answered. */
    CompletableFuture<Answer> one(Step op) {
        RedisCommand command;
        try {
            command = single(op);
        } catch (RuntimeException e) {
            return CompletableFuture.completedFuture(Answer.failed(e));
        }
        try {
            if (!waits(op)) {
                return core.transport.send(command).handle((r, e) -> e == null ? Answer.of(r) : Answer.failed(Core.unwrap(e)));
            }
            return core.transport.sendTogether(List.of(guarded(command, pairDeadline(op)), waitAfter(op)))
                    .handle((rs, e) -> e == null ? waited(rs.get(0), rs.get(1)) : Answer.failed(Core.unwrap(e)));
        } catch (RuntimeException e) {
            return CompletableFuture.completedFuture(Answer.failed(e));
        }
    }

    /** A write's reply and its WAIT's: met when at least {@code replicas} acknowledged (and the local fsync, with WAITAOF). */
    private Answer waited(Object reply, Object wait) {
        long acked = 0;
        boolean ok = false;
        if (wait instanceof Long n) {
            acked = n;
            ok = n >= durable.replicas();
        } else if (wait instanceof List<?> l && l.size() == 2 && l.get(0) instanceof Long local && l.get(1) instanceof Long replicas) {
            acked = replicas;
            ok = local >= 1 && replicas >= durable.replicas();
        }
        if (reply instanceof ServerException e) return new Answer(null, e, ok, acked);
        return new Answer(reply, null, ok, acked);
    }

    /** Claims, one batch command per group (processMany, the helpers). */
    CompletableFuture<List<Answer>> claims(List<Step.Claim> ops) {
        return claims(ops, false);
    }

    /**
     * @param singles a group of one key sends the single command (concurrent calls: a call alone costs what it would
     *     without batch); else every group is a batch command, as the contract counts them for processMany
     */
    CompletableFuture<List<Answer>> claims(List<Step.Claim> ops, boolean singles) {
        return run(ops, singles, Step.Claim::recordKey, c -> c.payload() != null,
                group -> wire.mclaim(pick(group, Step.Claim::recordKey), group.get(0).lease(),
                        group.get(0).payload() == null ? null : pick(group, Step.Claim::payload), options.maxTries(), options.bloom(), owner),
                true);
    }

    CompletableFuture<List<Answer>> dones(List<Step.Done> ops) {
        return dones(ops, false);
    }

    CompletableFuture<List<Answer>> dones(List<Step.Done> ops, boolean singles) {
        return run(ops, singles, Step.Done::recordKey, d -> d.result() != null,
                group -> wire.mdone(pick(group, Step.Done::recordKey), pick(group, Step.Done::token),
                        group.get(0).result() == null ? null : pick(group, Step.Done::result), group.get(0).retain(), options.bloom(), options.doneTimeout()),
                true);
    }

    CompletableFuture<List<Answer>> releases(List<Step.Release> ops) {
        return run(ops, false, Step.Release::recordKey, r -> false,
                group -> wire.mrelease(pick(group, Step.Release::recordKey), pick(group, Step.Release::token), options.doneTimeout()), false);
    }

    CompletableFuture<List<Answer>> gets(List<Step.Get> ops) {
        return run(ops, true, Step.Get::recordKey, g -> false, null, false);
    }

    private static <O, V> List<V> pick(List<O> ops, Function<O, V> f) {
        List<V> out = new ArrayList<>(ops.size());
        for (O op : ops) out.add(f.apply(op));
        return out;
    }

    /**
     * The ops' commands: grouped by slot (in a cluster) and by {@code split}
     * (MCLAIM's PAYLOADS and MDONE's RESULTS are for every key or none), in
     * chunks of 10,000; each group one batch command on the module (when
     * {@code batch} is given), else its single commands pipelined; a WAIT
     * after each group when {@code durable} applies.
     */
    private <O extends Step> CompletableFuture<List<Answer>> run(List<O> ops, boolean singles, Function<O, String> key, Predicate<O> split,
                                                                  Function<List<O>, RedisCommand> batch, boolean maybeDurable) {
        if (singles && ops.size() == 1) return one(ops.get(0)).thenApply(List::of);
        Answer[] answers = new Answer[ops.size()];
        boolean cluster = core.transport.cluster();
        Map<Integer, List<Integer>> groups = new LinkedHashMap<>();
        for (int i = 0; i < ops.size(); i++) {
            O op = ops.get(i);
            int slot = cluster ? Slots.slot(key.apply(op)) : 0;
            groups.computeIfAbsent(slot * 2 + (split.test(op) ? 1 : 0), g -> new ArrayList<>()).add(i);
        }
        List<CompletableFuture<Void>> sent = new ArrayList<>();
        for (List<Integer> group : groups.values()) {
            for (int from = 0; from < group.size(); from += Wire.MAX_BATCH) {
                List<Integer> part = group.subList(from, Math.min(group.size(), from + Wire.MAX_BATCH));
                sent.add(send(ops, part, singles && part.size() == 1 ? null : batch, maybeDurable && durable != null, answers));
            }
        }
        return CompletableFuture.allOf(sent.toArray(new CompletableFuture<?>[0])).thenApply(v -> Arrays.asList(answers));
    }

    private <O extends Step> CompletableFuture<Void> send(List<O> ops, List<Integer> part, Function<List<O>, RedisCommand> batch, boolean durably,
                                                          Answer[] answers) {
        List<O> sub = new ArrayList<>(part.size());
        for (int i : part) sub.add(ops.get(i));
        boolean one = batch != null && wire.module();
        List<RedisCommand> commands = new ArrayList<>(one ? 2 : sub.size() + 1);
        try {
            if (one) commands.add(batch.apply(sub));
            else for (O op : sub) commands.add(single(op));
        } catch (RuntimeException e) {
            for (int i : part) answers[i] = Answer.failed(e);
            return CompletableFuture.completedFuture(null);
        }
        if (durably) {
            Duration deadline = pairDeadline(sub.get(0));
            commands.replaceAll(c -> guarded(c, deadline));
            commands.add(waitAfter(sub.get(0)));
        }
        CompletableFuture<List<Object>> replies;
        try {
            replies = commands.size() == 1 ? core.transport.send(commands.get(0)).thenApply(List::of) : core.transport.sendTogether(commands);
        } catch (RuntimeException e) {
            replies = CompletableFuture.failedFuture(e);
        }
        return replies.handle((rs, e) -> {
            if (e != null) {
                Throwable cause = Core.unwrap(e);
                for (int i : part) answers[i] = Answer.failed(cause);
                return null;
            }
            Object wait = durably ? rs.get(rs.size() - 1) : null;
            for (int j = 0; j < part.size(); j++) {
                Object reply = one ? element(rs.get(0), j) : rs.get(j);
                answers[part.get(j)] = durably ? waited(reply, wait) : reply instanceof ServerException s ? Answer.failed(s) : Answer.of(reply);
            }
            return null;
        });
    }

    /** A batch command's element j: its reply, or the whole command's error for every key. */
    private static Object element(Object reply, int j) {
        if (reply instanceof List<?> list && j < list.size()) return list.get(j);
        if (reply instanceof ServerException e) return e;
        return new ServerException("ERR unexpected batch reply: " + reply);
    }
}
