//! One Bloom filter's bit array, probed with an item's 128-bit hash.
//!
//! Every sub-filter of every shard probes with the same hash, computed once
//! per item, and maps each probe onto its array with a multiply-shift
//! instead of a division. (The `bloomfilter` crate, tried first, hashes an
//! item twice per sub-filter and divides twice per probe; and its layout
//! and hashing are its own to change, while RDB files keep a filter's for
//! years.)

use super::ItemHash;

/// How an item's hash becomes its probe positions, and how its arrays are
/// sized. Fixed per filter for its whole life: the bits it set can only
/// be found by the same probes, and a replica or a reload must size the
/// next sub-filter exactly as the filter always did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Format 1: enhanced double hashing over 64-bit values, each mapped
    /// by its high bits. An item whose step maps to less than one bit (one
    /// in `m`) puts all its probes on a few neighbouring bits, so the
    /// sizing puts a floor of about `1.5 / rate` bits under every array.
    /// Kept for filters saved in format 1.
    DoubleHashing,
    /// Format 2: probe `j` is an independently mixed 64-bit value,
    /// `mix(a + j * b)`, mapped by its high bits. No item's probes
    /// cluster, so no floor: arrays are sized by capacity and rate alone,
    /// for the rate a filter has on average. Kept for filters saved in
    /// format 2.
    Mixed,
    /// Format 3: probes as [`Scheme::Mixed`]; arrays sized so that the rate
    /// of each filter, not only the average one, stays within its budget:
    /// a small array's fill varies from filter to filter, and so does its
    /// rate.
    Bounded,
}

impl Scheme {
    /// The scheme of filters created now.
    pub const CURRENT: Scheme = Scheme::Bounded;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bits {
    words: Box<[u64]>,
    hashes: u32,
    scheme: Scheme,
}

/// The splitmix64 / murmur3-style finaliser (Stafford's variant 13): a
/// bijection of 64-bit values in which every input bit flips about half
/// of the output bits. Consecutive values of `a + j * b` come out
/// unrelated.
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Bits {
    /// A clear array of `bytes` bytes (a multiple of 8, at least 8).
    pub fn new(bytes: u64, hashes: u32, scheme: Scheme) -> Bits {
        let words = vec![0u64; (bytes / 8) as usize].into_boxed_slice();
        Bits { words, hashes, scheme }
    }

    /// An array from its little-endian bytes, as [`write_bytes`](Self::write_bytes)
    /// wrote them. The caller has checked the length and hash count.
    pub fn from_bytes(bytes: &[u8], hashes: u32, scheme: Scheme) -> Bits {
        let words = bytes.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes"))).collect();
        Bits { words, hashes, scheme }
    }

    pub fn write_bytes(&self, out: &mut Vec<u8>) {
        for word in self.words.iter() {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }

    pub fn bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The 64-bit words, one boxed slice: for memory accounting, which
    /// needs the allocation.
    #[allow(clippy::borrowed_box, reason = "the box, not the slice, is what is allocated")]
    pub fn words(&self) -> &Box<[u64]> {
        &self.words
    }

    /// Bits set.
    pub fn count_ones(&self) -> u64 {
        self.words.iter().map(|word| word.count_ones() as u64).sum()
    }

    /// Calls `probe` with the word and mask of each of the item's probes,
    /// in order, until it answers `false`; `true` if it never did.
    #[inline(always)]
    fn probes(&self, item: ItemHash, probe: impl FnMut(usize, u64) -> bool) -> bool {
        probe_positions(self.words.len(), self.hashes, self.scheme, item, probe)
    }

    pub fn check(&self, item: ItemHash) -> bool {
        self.probes(item, |word, mask| self.words[word] & mask != 0)
    }

    /// Sets only the item's first `probes` probes: for tests that build
    /// the costliest bits a query can meet.
    #[cfg(test)]
    pub(super) fn set_first(&mut self, item: ItemHash, probes: u32) {
        let words = &mut self.words;
        let mut left = probes;
        probe_positions(words.len(), self.hashes, self.scheme, item, |word, mask| {
            if left == 0 {
                return false;
            }
            left -= 1;
            words[word] |= mask;
            true
        });
    }

    pub fn set(&mut self, item: ItemHash) {
        let words = &mut self.words;
        probe_positions(words.len(), self.hashes, self.scheme, item, |word, mask| {
            words[word] |= mask;
            true
        });
    }
}

/// The probes of `item` into an array of `words` words: calls `probe` with
/// each one's word index and bit mask, in order, until it answers `false`;
/// `true` if it never did. A 64-bit value's position is its high bits
/// scaled onto the array (a multiply-shift, no division).
#[inline(always)]
fn probe_positions(
    words: usize,
    hashes: u32,
    scheme: Scheme,
    item: ItemHash,
    mut probe: impl FnMut(usize, u64) -> bool,
) -> bool {
    let bits = words as u128 * 64;
    let position = |value: u64| {
        let position = ((value as u128 * bits) >> 64) as u64;
        ((position >> 6) as usize, 1u64 << (position & 63))
    };
    let mut a = item.0 as u64;
    let mut b = (item.0 >> 64) as u64;
    match scheme {
        // Enhanced double hashing (Dillinger and Manolios).
        Scheme::DoubleHashing => {
            for i in 0..hashes as u64 {
                let (word, mask) = position(a);
                if !probe(word, mask) {
                    return false;
                }
                a = a.wrapping_add(b);
                b = b.wrapping_add(i);
            }
        }
        // An odd step makes the `hashes` inputs distinct, so their mixed
        // values are too.
        Scheme::Mixed | Scheme::Bounded => {
            b |= 1;
            for _ in 0..hashes {
                let (word, mask) = position(mix(a));
                if !probe(word, mask) {
                    return false;
                }
                a = a.wrapping_add(b);
            }
        }
    }
    true
}
