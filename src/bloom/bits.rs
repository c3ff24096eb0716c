//! One Bloom filter's bit array, probed with an item's 128-bit hash.
//!
//! Every sub-filter of every shard probes with the same hash, computed once
//! per item, and maps each probe onto its array with a multiply-shift
//! instead of a division. (The `bloomfilter` crate, tried first, hashes an
//! item twice per sub-filter, divides twice per probe, and lets a query
//! cover a whole residue class of a small array: 4-25% false positives
//! where 1% was due; measured in this repository's tests and benchmarks.)

use super::ItemHash;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bits {
    words: Box<[u64]>,
    hashes: u32,
}

impl Bits {
    /// A clear array of `bytes` bytes (a multiple of 8, at least 8).
    pub fn new(bytes: u64, hashes: u32) -> Bits {
        let words = vec![0u64; (bytes / 8) as usize].into_boxed_slice();
        Bits { words, hashes }
    }

    /// An array from its little-endian bytes, as [`to_bytes`](Self::to_bytes)
    /// wrote them. The caller has checked the length and hash count.
    pub fn from_bytes(bytes: &[u8], hashes: u32) -> Bits {
        let words = bytes.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes"))).collect();
        Bits { words, hashes }
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

    /// Number of 64-bit words, for memory accounting.
    pub fn words(&self) -> usize {
        self.words.len()
    }

    /// Start of the allocation, for memory accounting.
    pub fn as_ptr(&self) -> *const u64 {
        self.words.as_ptr()
    }

    /// The item's probes: enhanced double hashing (Dillinger and Manolios)
    /// over 64-bit values, each mapped onto the array by its high bits.
    fn probes(&self, item: ItemHash) -> impl Iterator<Item = (usize, u64)> + use<> {
        let bits = self.words.len() as u128 * 64;
        let mut a = item.0 as u64;
        let mut b = (item.0 >> 64) as u64;
        (0..self.hashes as u64).map(move |i| {
            let position = ((a as u128 * bits) >> 64) as u64;
            a = a.wrapping_add(b);
            b = b.wrapping_add(i);
            ((position >> 6) as usize, 1u64 << (position & 63))
        })
    }

    pub fn check(&self, item: ItemHash) -> bool {
        self.probes(item).all(|(word, mask)| self.words[word] & mask != 0)
    }

    pub fn set(&mut self, item: ItemHash) {
        for (word, mask) in self.probes(item) {
            self.words[word] |= mask;
        }
    }
}
