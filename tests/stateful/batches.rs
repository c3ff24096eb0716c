//! The batch commands in the stateful run: an IDEM.MCLAIM, MDONE or
//! MRELEASE is drawn as the single commands it stands for, which
//! `Run::check` holds its reply elements to, one by one.

use super::{PAYLOADS, Run};
use crate::common::model::command::Cmd;

impl Run {
    /// An IDEM.MCLAIM, MDONE or MRELEASE of 1 to 4 record keys, often one
    /// key twice.
    pub(super) fn batch(&mut self) -> Cmd {
        let n = self.rng.range(1, 4) as usize;
        let mut keys: Vec<String> = (0..n).map(|_| self.rec_key()).collect();
        if n > 1 && self.rng.chance(40) {
            keys[n - 1] = keys[0].clone();
        }
        let parts = match self.rng.below(3) {
            0 => {
                let lease = self.rng.range(1, 2);
                let payloads = self.rng.chance(40);
                let maxtries = self.rng.chance(30).then(|| self.rng.range(1, 3));
                let owner = self.owner();
                keys.into_iter()
                    .map(|key| Cmd::Claim {
                        key,
                        lease,
                        payload: payloads.then(|| self.rng.pick(&PAYLOADS).to_vec()),
                        maxtries,
                        bloom: None,
                        owner: owner.clone(),
                    })
                    .collect()
            }
            1 => {
                let results = self.rng.chance(50);
                let retain = self.rng.chance(40).then(|| self.rng.range(1, 3));
                keys.into_iter()
                    .map(|key| {
                        let token = self.token_for(&key);
                        Cmd::Done { key, token, result: results.then(|| self.result()), retain, bloom: None }
                    })
                    .collect()
            }
            _ => keys
                .into_iter()
                .map(|key| {
                    let token = self.token_for(&key);
                    Cmd::Release { key, token }
                })
                .collect(),
        };
        Cmd::Batch(parts)
    }
}
