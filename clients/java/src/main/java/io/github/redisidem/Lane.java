package io.github.redisidem;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Function;

/**
 * One batch per tick (docs/clients.md, "Concurrent calls"): a command
 * alone goes at once; while one is in flight, the ops that arrive queue
 * and go together as one batch when it returns. Each caller gets its own
 * op's answer.
 *
 * <p>Blocking callers take turns as the sender: the one that finds the
 * lane idle sends the queue (itself included); when it returns, the next
 * queued caller is woken to send what queued meanwhile, so no caller
 * waits for a batch that is not its own. Async callers chain: the batch's
 * completion sends the next one.
 *
 * @param <O> the op
 */
final class Lane<O> {
    private static final class Pending<O> {
        final O op;
        final Thread thread;
        final CompletableFuture<Answer> future;
        volatile Answer answer;
        volatile boolean lead;

        Pending(O op, Thread thread, CompletableFuture<Answer> future) {
            this.op = op;
            this.thread = thread;
            this.future = future;
        }
    }

    private final Function<List<O>, CompletableFuture<List<Answer>>> send;
    private ArrayList<Pending<O>> queue = new ArrayList<>();
    private boolean busy;

    Lane(Function<List<O>, CompletableFuture<List<Answer>>> send) {
        this.send = send;
    }

    private List<Answer> sendNow(List<Pending<O>> batch) {
        List<O> ops = new ArrayList<>(batch.size());
        for (Pending<O> p : batch) ops.add(p.op);
        try {
            return Core.join(send.apply(ops));
        } catch (RuntimeException | Error e) {
            // Every caller gets the failure; the lane never stays taken (an Error too reaches each caller as its own).
            List<Answer> failed = new ArrayList<>(batch.size());
            for (int i = 0; i < batch.size(); i++) failed.add(Answer.failed(e));
            return failed;
        }
    }

    private synchronized List<Pending<O>> drain() {
        List<Pending<O>> batch = queue;
        queue = new ArrayList<>();
        return batch;
    }

    /** The op's answer, the caller's thread sending or waiting its turn. */
    Answer blocking(O op) {
        Pending<O> me = new Pending<>(op, Thread.currentThread(), null);
        boolean lead;
        synchronized (this) {
            queue.add(me);
            lead = !busy;
            busy = true;
        }
        boolean interrupted = false;
        while (true) {
            if (lead) {
                List<Pending<O>> batch = drain();
                List<Answer> answers = sendNow(batch);
                for (int i = 0; i < batch.size(); i++) batch.get(i).answer = answers.get(i);
                Pending<O> next = null;
                synchronized (this) {
                    if (queue.isEmpty()) busy = false;
                    else next = queue.get(0);
                }
                if (next != null) {
                    next.lead = true;
                    LockSupport.unpark(next.thread);
                }
                for (Pending<O> p : batch) if (p != me) LockSupport.unpark(p.thread);
                if (interrupted) Thread.currentThread().interrupt();
                return me.answer;
            }
            LockSupport.park(this);
            // The op may be in a batch on the wire: its answer is waited for, the interrupt kept for later.
            if (Thread.interrupted()) interrupted = true;
            if (me.answer != null) {
                if (interrupted) Thread.currentThread().interrupt();
                return me.answer;
            }
            lead = me.lead;
        }
    }

    /** The op's answer to come; the batch in flight's completion sends the next. */
    CompletableFuture<Answer> async(O op) {
        Pending<O> me = new Pending<>(op, null, new CompletableFuture<>());
        boolean lead;
        synchronized (this) {
            queue.add(me);
            lead = !busy;
            busy = true;
        }
        if (lead) flush();
        return me.future;
    }

    private void flush() {
        List<Pending<O>> batch = drain();
        List<O> ops = new ArrayList<>(batch.size());
        for (Pending<O> p : batch) ops.add(p.op);
        CompletableFuture<List<Answer>> sent;
        try {
            sent = send.apply(ops);
        } catch (RuntimeException | Error e) {
            sent = CompletableFuture.failedFuture(e);
        }
        sent.whenComplete((answers, error) -> {
            for (int i = 0; i < batch.size(); i++) {
                batch.get(i).future.complete(error == null ? answers.get(i) : Answer.failed(Core.unwrap(error)));
            }
            synchronized (this) {
                if (queue.isEmpty()) {
                    busy = false;
                    return;
                }
            }
            // Off the completing thread: a transport that answers in the caller's thread would otherwise nest.
            ForkJoinPool.commonPool().execute(this::flush);
        });
    }
}
