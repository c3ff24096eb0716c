package io.github.redisidem;

import java.lang.reflect.ParameterizedType;
import java.lang.reflect.Type;

/**
 * A generic result type for {@code process}, kept at run time by an
 * anonymous subclass: {@code new TypeRef<List<Receipt>>() {}}.
 *
 * @param <T> the type
 */
public abstract class TypeRef<T> {
    private final Type type;

    /** Reads {@code T} from the subclass's declaration. */
    protected TypeRef() {
        Type parent = getClass().getGenericSuperclass();
        if (!(parent instanceof ParameterizedType p)) {
            throw new IllegalStateException("TypeRef needs its type argument: new TypeRef<List<Receipt>>() {}");
        }
        this.type = p.getActualTypeArguments()[0];
    }

    /** @return the type */
    public Type type() {
        return type;
    }

    /** @return its class without type arguments */
    public Class<?> rawClass() {
        return Typed.raw(type);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof TypeRef<?> other && other.type.equals(type);
    }

    @Override
    public int hashCode() {
        return type.hashCode();
    }

    @Override
    public String toString() {
        return "TypeRef<" + type.getTypeName() + ">";
    }
}
