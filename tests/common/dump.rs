//! DUMP payloads: Redis's CRC64, and crafting payloads of the module's
//! types (re-framed bodies, filter blobs in the first encoding, records in
//! an older format).
/// A 64-bit CRC as Redis computes it (Jones polynomial, reflected): the
/// checksum at the end of a DUMP payload.
pub fn crc64_redis(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 reflected
    let mut crc: u64 = 0;
    for &byte in data {
        crc ^= byte as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ POLY } else { crc >> 1 };
        }
    }
    crc
}

/// Rewrites the trailing CRC of a DUMP payload so Redis accepts its checksum.
pub fn fix_dump_crc(payload: &mut [u8]) {
    let n = payload.len();
    assert!(n > 10);
    let crc = crc64_redis(&payload[..n - 8]);
    payload[n - 8..].copy_from_slice(&crc.to_le_bytes());
}

/// A DUMP payload split into its body (type, module id, the value's
/// opcodes, EOF) and its 2-byte RDB version footer; the 8-byte CRC dropped.
pub fn split_dump(good: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (good[..good.len() - 10].to_vec(), good[good.len() - 10..good.len() - 8].to_vec())
}

/// A payload from a body and a footer, with a valid checksum.
pub fn reframe(body: &[u8], footer: &[u8]) -> Vec<u8> {
    let mut p = body.to_vec();
    p.extend_from_slice(footer);
    p.extend_from_slice(&[0u8; 8]);
    fix_dump_crc(&mut p);
    p
}

/// Where the filter's own bytes start in a DUMP body (after the module
/// id and the string opcode), and their length.
pub fn blob_span(body: &[u8]) -> (usize, usize) {
    assert_eq!(body[0], 7, "not a RDB_TYPE_MODULE_2 payload");
    assert_eq!(body[1], 0x81, "module id not a 64-bit length");
    assert_eq!(body[10], 5, "RDB_MODULE_OPCODE_STRING expected");
    let i = 11;
    let (len, n) = match body[i] >> 6 {
        0 => ((body[i] & 0x3f) as usize, 1),
        1 => ((((body[i] & 0x3f) as usize) << 8) | body[i + 1] as usize, 2),
        2 if body[i] == 0x80 => (u32::from_be_bytes(body[i + 1..i + 5].try_into().unwrap()) as usize, 5),
        2 if body[i] == 0x81 => (u64::from_be_bytes(body[i + 1..i + 9].try_into().unwrap()) as usize, 9),
        _ => panic!("the filter's string is compressed or encoded: {:x}", body[i]),
    };
    assert!(i + n + len < body.len(), "blob runs past the body");
    (i + n, len)
}

/// A sub-filter: capacity, items, error, hash count, bit array (not
/// folded).
pub type SubFilterBlob = (u64, u64, f64, u32, Vec<u8>);

/// A filter's bytes in its encoding (format 4): parameters, then each
/// shard's start, item count and sub-filters.
pub fn filter_blob(window: u32, period: i64, shards: &[(i64, Vec<SubFilterBlob>)]) -> Vec<u8> {
    let mut blob = vec![4u8];
    blob.extend_from_slice(&0.01f64.to_le_bytes());
    blob.extend_from_slice(&1u64.to_le_bytes());
    blob.extend_from_slice(&window.to_le_bytes());
    blob.extend_from_slice(&period.to_le_bytes());
    blob.extend_from_slice(&1u32.to_le_bytes());
    blob.extend_from_slice(&[7u8; 32]);
    blob.extend_from_slice(&(shards.len() as u32).to_le_bytes());
    for (start, subs) in shards {
        blob.extend_from_slice(&start.to_le_bytes());
        blob.extend_from_slice(&subs.iter().map(|s| s.1).sum::<u64>().to_le_bytes());
        blob.extend_from_slice(&(subs.len() as u32).to_le_bytes());
        for (capacity, items, error, hashes, bits) in subs {
            blob.extend_from_slice(&capacity.to_le_bytes());
            blob.extend_from_slice(&items.to_le_bytes());
            blob.extend_from_slice(&error.to_le_bytes());
            blob.extend_from_slice(&hashes.to_le_bytes());
            blob.extend_from_slice(&(bits.len() as u32).to_le_bytes());
            blob.extend_from_slice(&0u32.to_le_bytes()); // folds
            blob.extend_from_slice(bits);
        }
    }
    blob
}

/// A DUMP payload of a module type holding `blob`, framed like `good` (a
/// real DUMP of a value of that type: a filter's for a filter blob, a
/// record's for a record's bytes), with a valid checksum.
pub fn module_payload(good: &[u8], blob: &[u8]) -> Vec<u8> {
    let mut payload = good[..11].to_vec(); // type, module id, string opcode
    payload.push(0x81);
    payload.extend_from_slice(&(blob.len() as u64).to_be_bytes());
    payload.extend_from_slice(blob);
    payload.push(0); // RDB_MODULE_OPCODE_EOF
    payload.extend_from_slice(&good[good.len() - 10..good.len() - 8]);
    payload.extend_from_slice(&[0u8; 8]);
    fix_dump_crc(&mut payload);
    payload
}

/// A claimed record's bytes in record format 3, as the module wrote them
/// before `OWNER` (format 4): version, phase (0 processing, 1 released),
/// flags (4: a token follows), then attempt, claimed_at, lease_end and
/// done_at (0) as LEB128 varints, then the token.
pub fn claimed_record_v3(phase: u8, attempt: u64, claimed_at: i64, lease_end: i64, token: [u8; 16]) -> Vec<u8> {
    let mut blob = vec![3, phase, 4];
    for mut value in [attempt, claimed_at as u64, lease_end as u64, 0] {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                blob.push(byte);
                break;
            }
            blob.push(byte | 0x80);
        }
    }
    blob.extend_from_slice(&token);
    blob
}
