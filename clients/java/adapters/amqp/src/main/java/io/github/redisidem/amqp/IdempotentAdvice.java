package io.github.redisidem.amqp;

import com.rabbitmq.client.Channel;
import io.github.redisidem.Idem;
import io.github.redisidem.Job;
import org.aopalliance.intercept.MethodInterceptor;
import org.aopalliance.intercept.MethodInvocation;
import org.springframework.amqp.core.Message;

/**
 * The same as {@link IdempotentListener}, for the listener a container
 * already has (a {@code @RabbitListener} method): an advice for the
 * container's advice chain, by configuration. The listener is the work:
 * it runs at most once per key, the advice acknowledges, gives back and
 * dead-letters (the container's acknowledge mode MANUAL; the listener
 * acknowledges nothing itself), and {@link #currentJob()} is the claim
 * while it runs.
 *
 * <pre>{@code
 * @Bean
 * SimpleRabbitListenerContainerFactory idempotentFactory(ConnectionFactory cf, Idem idem) {
 *     SimpleRabbitListenerContainerFactory factory = new SimpleRabbitListenerContainerFactory();
 *     factory.setConnectionFactory(cf);
 *     factory.setAcknowledgeMode(AcknowledgeMode.MANUAL);
 *     factory.setAdviceChain(IdempotentAdvice.builder(idem).build());
 *     return factory;
 * }
 *
 * @RabbitListener(queues = "orders", containerFactory = "idempotentFactory")
 * void charge(Order order) { payments.charge(order, IdempotentAdvice.currentJob().attempt()); }
 * }</pre>
 *
 * The listener's return value is not stored (the container sends it as a reply, if any); a replay runs nothing.
 * Batch listeners are not supported (each message needs its own claim).
 */
public final class IdempotentAdvice implements MethodInterceptor {
    private static final ThreadLocal<Job> CURRENT = new ThreadLocal<>();
    private final Settler settler;

    private IdempotentAdvice(Builder b) {
        this.settler = new Settler(b);
    }

    /**
     * @param idem the Idem (the caller closes it)
     * @return a builder
     */
    public static Builder builder(Idem idem) {
        return new Builder(idem);
    }

    /** @return the claim of the message the calling listener thread is at work on, or null outside one */
    public static Job currentJob() {
        return CURRENT.get();
    }

    /** @return the counters so far */
    public AmqpStats stats() {
        return settler.stats();
    }

    /** Around the container's {@code invokeListener(Channel, Object)}: the rest of the chain and the listener are the work. */
    @Override
    public Object invoke(MethodInvocation invocation) throws Throwable {
        Object[] args = invocation.getArguments();
        if (args.length != 2 || !(args[0] instanceof Channel channel)) return invocation.proceed();
        if (!(args[1] instanceof Message message)) {
            throw new IllegalStateException("IdempotentAdvice handles one message at a time, not a batch: " + args[1].getClass().getName());
        }
        settler.settle(message, channel, job -> {
            CURRENT.set(job);
            try {
                invocation.proceed();
                return null;
            } catch (Exception e) {
                throw e;
            } catch (Throwable t) { // an Error of the listener's: a failure like any other (the claim released)
                throw new IllegalStateException(t);
            } finally {
                CURRENT.remove();
            }
        });
        return null;
    }

    /** An IdempotentAdvice's settings. */
    public static final class Builder extends AmqpOptions<Builder> {
        private Builder(Idem idem) {
            super(idem);
        }

        /** @return the advice (set the container's acknowledge mode to MANUAL) */
        public IdempotentAdvice build() {
            return new IdempotentAdvice(this);
        }
    }
}
