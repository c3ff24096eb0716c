package io.github.redisidem;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Batch planning: keys grouped by cluster hash slot (CRC16 of the hash tag, as the Redis Cluster spec), then chunked. */
final class Slots {
    private Slots() {}

    static int slot(String key) {
        byte[] k = key.getBytes(StandardCharsets.UTF_8);
        int start = 0;
        int end = k.length;
        int open = indexOf(k, (byte) '{', 0);
        if (open >= 0) {
            int close = indexOf(k, (byte) '}', open + 1);
            if (close > open + 1) {
                start = open + 1;
                end = close;
            }
        }
        return crc16(k, start, end) & 16383;
    }

    private static int indexOf(byte[] k, byte b, int from) {
        for (int i = from; i < k.length; i++) if (k[i] == b) return i;
        return -1;
    }

    /** CRC16-CCITT (XMODEM), the cluster's key hash. */
    static int crc16(byte[] bytes, int start, int end) {
        int crc = 0;
        for (int i = start; i < end; i++) {
            crc ^= (bytes[i] & 0xff) << 8;
            for (int bit = 0; bit < 8; bit++) crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
        }
        return crc & 0xffff;
    }

    /** The batches for keys: one group per slot in a cluster, each at most 10,000 keys; each group the keys' indices in order. */
    static List<List<Integer>> batches(List<String> keys, boolean cluster) {
        Map<Integer, List<Integer>> bySlot = new LinkedHashMap<>();
        for (int i = 0; i < keys.size(); i++) bySlot.computeIfAbsent(cluster ? slot(keys.get(i)) : 0, s -> new ArrayList<>()).add(i);
        List<List<Integer>> out = new ArrayList<>();
        for (List<Integer> group : bySlot.values()) {
            for (int from = 0; from < group.size(); from += Wire.MAX_BATCH) {
                out.add(group.subList(from, Math.min(group.size(), from + Wire.MAX_BATCH)));
            }
        }
        return out;
    }
}
