package io.github.redisidem;

import io.github.redisidem.exceptions.IdemException;
import io.github.redisidem.exceptions.NotDurableException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Function;

/** {@link Idem}'s batch helpers: the instance's settings, the batches of {@link Batches}, one reply per key. */
final class Helpers {
    private Helpers() {}

    /** A key's answer: its value, or its error element; a connection failure fails the call. */
    private static <T> Reply<T> reply(Answer a, Function<Object, T> decode) {
        if (a.error() instanceof IdemException e) return new Reply<>(null, e);
        if (a.error() != null) throw Core.rethrow(a.error());
        try {
            return new Reply<>(decode.apply(a.reply()), null);
        } catch (IdemException e) {
            return new Reply<>(null, e);
        }
    }

    static List<Reply<Claim>> claimMany(Core core, List<String> keys, Duration lease, List<byte[]> payloads) {
        Wire.checkSeconds("lease", lease);
        if (payloads != null && payloads.size() != keys.size()) throw new IllegalArgumentException("one payload per key");
        List<Step.Claim> ops = new ArrayList<>(keys.size());
        for (int i = 0; i < keys.size(); i++) {
            ops.add(new Step.Claim(core.options.prefix() + keys.get(i), payloads == null ? null : payloads.get(i), null, lease));
        }
        List<Answer> answers = Core.join(core.batches.claims(ops));
        List<Reply<Claim>> out = new ArrayList<>(keys.size());
        List<Step.Release> undo = new ArrayList<>();
        for (Answer a : answers) {
            Reply<Claim> r = reply(a, Replies::claim);
            NotDurableException.Stage notDurable = r.ok() ? ProcessFlow.notDurableStage(core, r.value(), a) : null;
            if (notDurable == NotDurableException.Stage.CLAIM) {
                // Granted but not acknowledged: given back at once.
                undo.add(new Step.Release(ops.get(out.size()).recordKey(), r.value().token()));
            }
            if (notDurable != null) {
                // A replay not acknowledged carries its stored result (the bytes): it holds no claim to give back.
                byte[] stored = notDurable == NotDurableException.Stage.DONE ? r.value().result() : null;
                r = new Reply<>(null, new NotDurableException(notDurable, Math.max(0, a.acknowledged()), stored));
            }
            out.add(r);
        }
        if (!undo.isEmpty()) Core.join(core.batches.releases(undo));
        return out;
    }

    static List<Reply<Done>> doneMany(Core core, List<DoneItem> items, Duration retain) {
        if (retain != null) Wire.checkSeconds("retain", retain);
        List<Step.Done> ops = new ArrayList<>(items.size());
        for (DoneItem item : items) ops.add(new Step.Done(core.options.prefix() + item.key(), item.token(), item.result(), retain));
        List<Reply<Done>> out = new ArrayList<>(items.size());
        for (Answer a : Core.join(core.batches.dones(ops))) {
            Reply<Done> r = reply(a, Replies::done);
            if (r.ok() && r.value().completed() && !a.durableOk()) {
                r = new Reply<>(null, new NotDurableException(NotDurableException.Stage.DONE, Math.max(0, a.acknowledged()), null));
            }
            out.add(r);
        }
        return out;
    }

    static List<Reply<Boolean>> releaseMany(Core core, List<ReleaseItem> items) {
        List<Step.Release> ops = new ArrayList<>(items.size());
        for (ReleaseItem item : items) ops.add(new Step.Release(core.options.prefix() + item.key(), item.token()));
        List<Reply<Boolean>> out = new ArrayList<>(items.size());
        for (Answer a : Core.join(core.batches.releases(ops))) out.add(reply(a, Replies::flag));
        return out;
    }
}
