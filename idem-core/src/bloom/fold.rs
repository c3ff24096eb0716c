//! Folding: a closed shard's arrays shrink to what their items need.

use super::SubFilter;
use super::bits::allocated_bytes;
use super::sizing::rate_with_hashes;

impl SubFilter {
    /// The rate of its array halved, holding the items it holds.
    #[cfg(test)]
    pub(super) fn folded_rate(&self) -> f64 {
        rate_with_hashes(self.bits.bytes() * 4, self.items, self.hashes())
    }

    /// The bytes it was sized with: its array's, times what it was
    /// folded by.
    pub fn sized_bytes(&self) -> u64 {
        (self.bits.bytes() * self.odd_fold as u64) << self.folds
    }

    /// Whether its array holds its items within its error at `words`.
    fn fits_in(&self, words: u64) -> bool {
        rate_with_hashes(words * 64, self.items, self.hashes()) <= self.error
    }

    /// Folds its array to the fewest words its items need within the
    /// error it was sized for: a sub-filter that will take no more items
    /// (its shard is closed) then costs what its items need, not what was
    /// forecast. The array's length can be divided by any divisor of its
    /// word count, exactly (see [`Bits::fold_by`]): of those that keep the
    /// error, the one the allocator charges least for (the smallest on a
    /// tie). The halvings of that factor are done in place (see
    /// [`Bits::fold`]), its odd part by a copy of what is left. Fitted
    /// sizes are odd multiples of powers of two: 10 items in a 10M
    /// reservation halve only to 935 words, and 935 divides by 187.
    pub(super) fn fold_to_items(&mut self) {
        let words = self.bits.bytes() / 8;
        let (mut best_cost, mut best) = (allocated_bytes(words * 8), words);
        let mut consider = |result: u64| {
            let cost = allocated_bytes(result * 8);
            if (cost < best_cost || (cost == best_cost && result < best)) && self.fits_in(result) {
                (best_cost, best) = (cost, result);
            }
        };
        let mut divisor = 1;
        while divisor * divisor <= words {
            if words.is_multiple_of(divisor) {
                consider(divisor);
                consider(words / divisor);
            }
            divisor += 1;
        }
        let factor = words / best;
        let (halvings, odd) = (factor.trailing_zeros(), factor >> factor.trailing_zeros());
        for _ in 0..halvings {
            self.bits.fold();
        }
        if odd > 1 {
            self.bits.fold_by(odd);
        }
        // At most MAX_FOLDS (26) in all: an array of 8 bytes cannot halve.
        self.folds += halvings as u8;
        self.odd_fold *= odd as u32;
    }
}
