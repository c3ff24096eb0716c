//! One Bloom filter's bit array, probed with an item's 128-bit hash.
//!
//! Every sub-filter of every shard probes with the same hash, computed once
//! per item, and maps each probe onto its array with a multiply-shift
//! instead of a division. (The `bloomfilter` crate, tried first, hashes an
//! item twice per sub-filter and divides twice per probe; and its layout
//! and hashing are its own to change, while RDB files keep a filter's for
//! years.)
//!
//! An array is stored in equal chunks, each an allocation class, so that
//! its size need not be one (see [`layout`]). A probe's position over the
//! whole array is found chunk first, by two multiply-shifts that give
//! exactly the position one multiply-shift over the whole array would: the
//! chunks are a matter of storage, and one chunk is the array of old.

use super::ItemHash;

/// An array's chunks, and the table of them: each an allocation.
pub type Chunks = Box<[Box<[u64]>]>;

/// One Bloom filter's bits. The hash count is its sub-filter's, passed to
/// each probe: an array is 16 bytes in its sub-filter, so that a small
/// filter's structures fit one allocation (see [`ShardedBloom`](super::ShardedBloom)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bits {
    storage: Storage,
}

/// Where an array's words are kept, as [`layout`] chooses.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Storage {
    /// One allocation: every array that no chunking divides, small ones
    /// among them.
    Whole(Box<[u64]>),
    /// Equal chunks. The table is boxed once more: a thin pointer, which
    /// keeps this enum the size of one slice.
    Chunked(Box<Chunks>),
}

/// Most probes of an item: the most hash functions a sub-filter uses.
const MAX_PROBES: usize = super::MAX_HASHES as usize;

/// Most chunks an array is stored in.
pub const MAX_CHUNKS: u64 = 256;

/// Bytes jemalloc (Redis's allocator) really takes for a request of
/// `size`: four size classes per doubling above 64 bytes.
pub fn allocation_class(size: u64) -> u64 {
    match size {
        0..=8 => 8,
        9..=16 => 16,
        17..=64 => size.div_ceil(16) * 16,
        _ => {
            let spacing = size.next_power_of_two() / 8;
            size.div_ceil(spacing) * spacing
        }
    }
}

/// Bytes the allocator holds for an array of `bytes` (a multiple of 8)
/// stored as [`layout`] stores it: one allocation, or its chunks, their
/// table and the box of the table.
pub fn allocated_bytes(bytes: u64) -> u64 {
    match layout(bytes) {
        (1, _) => allocation_class(bytes),
        (chunks, chunk_bytes) => chunks * allocation_class(chunk_bytes) + allocation_class(16 * chunks) + 16,
    }
}

/// How an array of `bytes` (a multiple of 8) is stored: `(chunks, chunk
/// bytes)`, the fewest equal chunks (up to [`MAX_CHUNKS`]) that are each an
/// allocation class of at least 64 bytes, or one chunk when none divides
/// it so. A pure function of the size: the bits mean the same however
/// they are stored, so nothing about the chunks is saved.
pub fn layout(bytes: u64) -> (u64, u64) {
    (1..=MAX_CHUNKS.min(bytes / 64))
        .find(|&chunks| {
            let chunk = bytes / chunks;
            bytes.is_multiple_of(chunks) && chunk.is_multiple_of(8) && allocation_class(chunk) == chunk
        })
        .map_or((1, bytes), |chunks| (chunks, bytes / chunks))
}

/// The smallest array of at least `bytes` whose [`layout`] wastes nothing
/// to the allocator's classes, or close: over the chunk sizes that are
/// classes, the count of chunks covering `bytes`, whichever costs least
/// memory (the chunks and their table). Within a few percent of `bytes`
/// from 16 KiB, 1.5% from 256 KiB and 0.6% from 1 MB, where a single
/// allocation can be 25% over (see the `fitted_sizes_waste...` test).
pub fn fitted_bytes(bytes: u64) -> u64 {
    let bytes = bytes.max(8).next_multiple_of(8);
    let mut best = (allocated_bytes(allocation_class(bytes)), allocation_class(bytes));
    let mut chunk = allocation_class(bytes.div_ceil(MAX_CHUNKS)).max(64);
    while chunk < bytes {
        let total = bytes.div_ceil(chunk) * chunk;
        let cost = allocated_bytes(total);
        if cost < best.0 || (cost == best.0 && total < best.1) {
            best = (cost, total);
        }
        chunk = allocation_class(chunk + 1);
    }
    best.1
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
    pub fn new(bytes: u64) -> Bits {
        let (chunks, chunk_bytes) = layout(bytes);
        Bits::clear(chunks, chunk_bytes)
    }

    /// A clear array of `chunks` chunks of `chunk_bytes`.
    fn clear(chunks: u64, chunk_bytes: u64) -> Bits {
        let chunk = || vec![0u64; (chunk_bytes / 8) as usize].into_boxed_slice();
        Bits::from_chunks((0..chunks).map(|_| chunk()).collect())
    }

    /// An array of these chunks (at least one, all of a length).
    fn from_chunks(mut chunks: Vec<Box<[u64]>>) -> Bits {
        let storage = match chunks.len() {
            1 => Storage::Whole(chunks.pop().expect("one chunk")),
            _ => Storage::Chunked(Box::new(chunks.into_boxed_slice())),
        };
        Bits { storage }
    }

    /// An array from its little-endian bytes, as [`write_bytes`](Self::write_bytes)
    /// wrote them. The caller has checked the length.
    pub fn from_bytes(bytes: &[u8]) -> Bits {
        let (_, chunk_bytes) = layout(bytes.len() as u64);
        let chunks = bytes
            .chunks_exact(chunk_bytes as usize)
            .map(|chunk| {
                chunk.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes"))).collect()
            })
            .collect();
        Bits::from_chunks(chunks)
    }

    pub fn write_bytes(&self, out: &mut Vec<u8>) {
        for word in self.words() {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }

    /// The chunks, in order: one for an array kept whole.
    fn stored(&self) -> &[Box<[u64]>] {
        match &self.storage {
            Storage::Whole(words) => std::slice::from_ref(words),
            Storage::Chunked(chunks) => chunks,
        }
    }

    fn stored_mut(&mut self) -> &mut [Box<[u64]>] {
        match &mut self.storage {
            Storage::Whole(words) => std::slice::from_mut(words),
            Storage::Chunked(chunks) => chunks,
        }
    }

    /// Words a chunk holds: all of them when the array is kept whole.
    fn chunk_words(&self) -> usize {
        self.stored()[0].len()
    }

    /// The words of the whole array, in order.
    fn words(&self) -> impl Iterator<Item = &u64> {
        self.stored().iter().flat_map(|chunk| chunk.iter())
    }

    pub fn bytes(&self) -> u64 {
        self.words_len() as u64 * 8
    }

    /// The allocations: the chunks' table and its box when the array is
    /// chunked, then each chunk. For memory accounting, which needs them.
    #[allow(clippy::borrowed_box, reason = "the boxes, not the slices, are what is allocated")]
    pub fn allocations(&self) -> (Option<&Box<Chunks>>, &[Box<[u64]>]) {
        let table = match &self.storage {
            Storage::Whole(_) => None,
            Storage::Chunked(chunks) => Some(chunks),
        };
        (table, self.stored())
    }

    /// A clear array of `bytes` in `chunks` equal chunks, whatever
    /// [`layout`] would choose: for tests that the chunks change nothing.
    #[cfg(test)]
    pub(super) fn with_chunks(bytes: u64, chunks: u64) -> Bits {
        Bits::clear(chunks, bytes / chunks)
    }

    /// Allocations of the array itself.
    pub fn chunks(&self) -> usize {
        self.stored().len()
    }

    /// Bits set.
    pub fn count_ones(&self) -> u64 {
        self.words().map(|word| word.count_ones() as u64).sum()
    }

    /// Whether every one of the item's `hashes` probes is set. An array
    /// kept whole probes as one chunk, known to be one.
    pub fn check(&self, item: ItemHash, hashes: u32) -> bool {
        match &self.storage {
            Storage::Whole(words) => {
                probe_positions(1, words.len(), hashes, item, |_, word, mask| words[word] & mask != 0)
            }
            Storage::Chunked(chunks) => {
                probe_positions(chunks.len(), chunks[0].len(), hashes, item, |chunk, word, mask| {
                    chunks[chunk][word] & mask != 0
                })
            }
        }
    }

    /// Sets only the item's first `probes` probes: for tests that build
    /// the costliest bits a query can meet.
    #[cfg(test)]
    pub(super) fn set_first(&mut self, item: ItemHash, hashes: u32, probes: u32) {
        let mut left = probes;
        let (count, chunk_words) = (self.chunks(), self.chunk_words());
        let chunks = self.stored_mut();
        probe_positions(count, chunk_words, hashes, item, |chunk, word, mask| {
            if left == 0 {
                return false;
            }
            left -= 1;
            chunks[chunk][word] |= mask;
            true
        });
    }

    #[cfg(test)]
    pub(super) fn set(&mut self, item: ItemHash, hashes: u32) {
        self.set_first(item, hashes, hashes);
    }

    /// Sets the item's bits; `true` if any was clear (the item was not
    /// there), the answer of [`check`](Self::check) before, negated. The
    /// probes' words are all read before any is written: reads that depend
    /// on nothing but the item go to memory together, so their cache
    /// misses overlap, where a check then a set waited for the check's
    /// misses one after the other (and a read-modify-write per probe makes
    /// each store wait on its own miss).
    pub fn insert(&mut self, item: ItemHash, hashes: u32) -> bool {
        match &mut self.storage {
            Storage::Whole(words) => insert_into(std::slice::from_mut(words), 1, item, hashes),
            Storage::Chunked(chunks) => {
                let count = chunks.len();
                insert_into(chunks, count, item, hashes)
            }
        }
    }

    /// Whether [`fold`](Self::fold) can halve this array: an even number
    /// of words.
    pub fn can_fold(&self) -> bool {
        self.words_len().is_multiple_of(2)
    }

    fn words_len(&self) -> usize {
        self.chunks() * self.chunk_words()
    }

    /// Divides the array's length by `factor`, which divides its word
    /// count, holding the same items: bit `p` becomes bit `p / factor`.
    /// Exact for any whole factor, as [`fold`](Self::fold) is for 2: a
    /// probe's position in `m / f` bits, `floor(v (m / f) / 2^64)`, is
    /// its position in `m` bits divided by `f`, rounded down. For the odd
    /// factors that stop halving (an array of 935 words folds by 187 to
    /// 5): the result is a new array, as [`layout`] stores it.
    pub fn fold_by(&mut self, factor: u64) {
        let words = self.words_len() as u64;
        debug_assert!(factor >= 1 && words.is_multiple_of(factor));
        let mut folded = Bits::new(words / factor * 8);
        let chunk_bits = folded.chunk_words() as u64 * 64;
        let target = folded.stored_mut();
        for (index, &word) in self.words().enumerate() {
            let mut left = word;
            while left != 0 {
                let position = (index as u64 * 64 + left.trailing_zeros() as u64) / factor;
                let (chunk, bit) = ((position / chunk_bits) as usize, position % chunk_bits);
                target[chunk][(bit / 64) as usize] |= 1 << (bit % 64);
                left &= left - 1;
            }
        }
        *self = folded;
    }

    /// Halves the array, holding the same items: bits `2j` and `2j + 1`
    /// become bit `j`. Exact, because a probe's position in `m` bits is
    /// `floor(v m / 2^64)`, and in `m / 2` bits that is the same position
    /// halved: every item set before is still found, and the result is,
    /// bit for bit, the array of `m / 2` bits those items would have made.
    /// The caller checks [`can_fold`](Self::can_fold).
    ///
    /// An array of an even number of chunks folds in place into its first
    /// half, whose chunks it keeps: nothing is allocated, so a large shard
    /// folds at the cost of reading it once. Others are folded into a new
    /// array.
    pub fn fold(&mut self) {
        let Storage::Chunked(table) = &mut self.storage else {
            *self = self.folded_copy();
            return;
        };
        if table.len() % 2 == 1 {
            *self = self.folded_copy();
            return;
        }
        let half = table[0].len() / 2;
        // Source chunk `i` folds into half of destination chunk `i / 2`,
        // which is chunk `i` itself only for `i = 0`, where word `j` is
        // written after words `2j` and `2j + 1` are read.
        let first = &mut table[0];
        for j in 0..half {
            first[j] = fold_words(first[2 * j], first[2 * j + 1]);
        }
        for source in 1..table.len() {
            let (front, back) = table.split_at_mut(source);
            let target = &mut front[source / 2][(source % 2) * half..][..half];
            for (word, pair) in target.iter_mut().zip(back[0].chunks_exact(2)) {
                *word = fold_words(pair[0], pair[1]);
            }
        }
        let mut chunks = std::mem::take(&mut **table).into_vec();
        chunks.truncate(chunks.len() / 2);
        *self = Bits::from_chunks(chunks);
    }

    /// [`fold`](Self::fold) into a new array, as [`layout`] stores it.
    fn folded_copy(&self) -> Bits {
        let mut folded = Bits::new(self.bytes() / 2);
        let mut words = self.words().copied();
        for word in folded.stored_mut().iter_mut().flat_map(|chunk| chunk.iter_mut()) {
            *word = fold_words(words.next().unwrap_or(0), words.next().unwrap_or(0));
        }
        folded
    }
}

/// [`Bits::insert`] into `chunks`, `count` of them: given as a constant
/// 1 for an array kept whole, whose positions then take one
/// multiply-shift each.
#[inline(always)]
fn insert_into(chunks: &mut [Box<[u64]>], count: usize, item: ItemHash, hashes: u32) -> bool {
    let mut probes = [(0usize, 0usize, 0u64); MAX_PROBES];
    let mut probed = 0;
    probe_positions(count, chunks[0].len(), hashes, item, |chunk, word, mask| {
        probes[probed] = (chunk, word, mask);
        probed += 1;
        probed < MAX_PROBES
    });
    let probes = &probes[..probed];
    // Every word read, none skipped: a read that waited on the one
    // before would wait on its miss.
    let all_set = probes.iter().fold(true, |all, &(chunk, word, mask)| all & (chunks[chunk][word] & mask != 0));
    if all_set {
        return false;
    }
    for &(chunk, word, mask) in probes {
        chunks[chunk][word] |= mask;
    }
    true
}

/// Two neighbouring words folded into one: the low half from `low`, the
/// high half from `high`.
fn fold_words(low: u64, high: u64) -> u64 {
    fold_word(low) | fold_word(high) << 32
}

/// ORs each pair of neighbouring bits of `word` into one: bits `2i` and
/// `2i + 1` become bit `i` of the 32-bit result.
fn fold_word(word: u64) -> u64 {
    let mut x = (word | word >> 1) & 0x5555_5555_5555_5555;
    x = (x | x >> 1) & 0x3333_3333_3333_3333;
    x = (x | x >> 2) & 0x0f0f_0f0f_0f0f_0f0f;
    x = (x | x >> 4) & 0x00ff_00ff_00ff_00ff;
    x = (x | x >> 8) & 0x0000_ffff_0000_ffff;
    (x | x >> 16) & 0x0000_0000_ffff_ffff
}

/// The probes of `item` into an array of `chunks` chunks of `chunk_words`
/// words: calls `probe` with each one's chunk, word index in the chunk and
/// bit mask, in order, until it answers `false`; `true` if it never did.
///
/// A 64-bit value `v`'s position in the array's `m` bits is `floor(v m /
/// 2^64)` (a multiply-shift, no division). It is found in two: `v` times
/// the chunk count gives the chunk in its high half and, in its low half,
/// the fraction of the way into the chunk, which times the chunk's bits
/// gives the position in it. With `m = chunks x chunk_bits` that is the
/// same position; with one chunk, the same arithmetic as a single array.
#[inline(always)]
fn probe_positions(
    chunks: usize,
    chunk_words: usize,
    hashes: u32,
    item: ItemHash,
    mut probe: impl FnMut(usize, usize, u64) -> bool,
) -> bool {
    let chunk_bits = chunk_words as u128 * 64;
    let position = |value: u64| {
        let scaled = value as u128 * chunks as u128;
        let position = ((scaled as u64 as u128 * chunk_bits) >> 64) as u64;
        ((scaled >> 64) as usize, (position >> 6) as usize, 1u64 << (position & 63))
    };
    // Probe `j` is an independently mixed value, `mix(a + j * b)`: no
    // item's probes cluster, whatever the array's size. An odd step makes
    // the `hashes` inputs distinct, so their mixed values are too.
    let mut a = item.0 as u64;
    let b = (item.0 >> 64) as u64 | 1;
    for _ in 0..hashes {
        let (chunk, word, mask) = position(mix(a));
        if !probe(chunk, word, mask) {
            return false;
        }
        a = a.wrapping_add(b);
    }
    true
}
