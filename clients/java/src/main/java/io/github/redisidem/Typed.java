package io.github.redisidem;

import java.lang.reflect.GenericArrayType;
import java.lang.reflect.ParameterizedType;
import java.lang.reflect.Type;
import java.util.Map;

/** The default {@link Codec#as} and the class checks behind it. */
final class Typed {
    private Typed() {}

    private static final Map<Class<?>, Class<?>> BOXES = Map.of(long.class, Long.class, int.class, Integer.class,
            double.class, Double.class, float.class, Float.class, boolean.class, Boolean.class, short.class, Short.class,
            byte.class, Byte.class, char.class, Character.class, void.class, Void.class);

    @SuppressWarnings("unchecked")
    static <U> Class<U> boxed(Class<U> type) {
        return (Class<U>) BOXES.getOrDefault(type, type);
    }

    static Class<?> raw(Type type) {
        if (type instanceof Class<?> c) return c;
        if (type instanceof ParameterizedType p) return raw(p.getRawType());
        if (type instanceof GenericArrayType a) return java.lang.reflect.Array.newInstance(raw(a.getGenericComponentType()), 0).getClass();
        return Object.class;
    }

    /** The codec's own decoding, refused (not cast) when the value is not a {@code U}. */
    static <T, U> Codec<U> checked(Codec<T> codec, Class<U> type) {
        return new Codec<>() {
            @SuppressWarnings("unchecked")
            @Override
            public byte[] encode(U value) throws Exception {
                return codec.encode((T) value);
            }

            @Override
            public U decode(byte[] bytes) throws Exception {
                Object value = codec.decode(bytes);
                if (value != null && !type.isInstance(value)) {
                    throw new ClassCastException("the stored result decodes to a " + value.getClass().getName() + ", not a " + type.getName());
                }
                return type.cast(value);
            }
        };
    }
}
