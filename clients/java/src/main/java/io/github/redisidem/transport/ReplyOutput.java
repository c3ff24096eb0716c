package io.github.redisidem.transport;

import io.github.redisidem.exceptions.ServerException;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.output.CommandOutput;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;

/**
 * Any reply as the Transport's types, for Lettuce: nested arrays (a map as
 * its flat key-value list), error elements as {@code ServerException}. It
 * counts each array's elements itself, so it does not depend on how the
 * parser reports depth.
 */
final class ReplyOutput extends CommandOutput<byte[], byte[], Object> {
    private static final class Open {
        final List<Object> list;
        int left;

        Open(List<Object> list, int left) {
            this.list = list;
            this.left = left;
        }
    }

    private final Deque<Open> stack = new ArrayDeque<>();

    ReplyOutput() {
        super(ByteArrayCodec.INSTANCE, null);
    }

    private void add(Object value) {
        if (stack.isEmpty()) {
            output = value;
            return;
        }
        Open top = stack.peek();
        top.list.add(value);
        top.left--;
        while (!stack.isEmpty() && stack.peek().left <= 0) stack.pop();
    }

    private void open(int count) {
        if (count < 0) {
            add(null);
            return;
        }
        List<Object> list = new ArrayList<>(count);
        add(list);
        if (count > 0) stack.push(new Open(list, count));
    }

    @Override
    public void set(ByteBuffer bytes) {
        if (bytes == null) {
            add(null);
            return;
        }
        add(copy(bytes));
    }

    private static byte[] copy(ByteBuffer buffer) {
        byte[] b = new byte[buffer.remaining()];
        buffer.get(b);
        return b;
    }

    @Override
    public void setSingle(ByteBuffer bytes) {
        set(bytes);
    }

    @Override
    public void setBigNumber(ByteBuffer bytes) {
        set(bytes);
    }

    @Override
    public void set(long integer) {
        add(integer);
    }

    @Override
    public void set(double number) {
        add(number);
    }

    @Override
    public void set(boolean value) {
        add(value ? 1L : 0L);
    }

    @Override
    public void setError(ByteBuffer error) {
        if (stack.isEmpty()) {
            super.setError(error);
            return;
        }
        add(ServerException.of(new String(copy(error), StandardCharsets.UTF_8)));
    }

    @Override
    public void multi(int count) {
        open(count);
    }

    @Override
    public void multiArray(int count) {
        open(count);
    }

    @Override
    public void multiSet(int count) {
        open(count);
    }

    @Override
    public void multiPush(int count) {
        open(count);
    }

    @Override
    public void multiMap(int count) {
        open(count < 0 ? count : count * 2);
    }
}
