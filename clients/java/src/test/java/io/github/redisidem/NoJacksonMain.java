package io.github.redisidem;

/** Run without Jackson on the class path: prints the default codec, and that a String round-trips with it. */
public final class NoJacksonMain {
    private NoJacksonMain() {}

    public static void main(String[] args) throws Exception {
        Codec codec = Codec.defaultCodec();
        System.out.println(codec.getClass().getSimpleName() + " " + new String((byte[]) codec.decode(codec.encode("ok")), "UTF-8"));
    }
}
