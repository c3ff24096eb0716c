//! The library's calls the conformance runner makes, on the sync `Idem` or
//! on `AsyncIdem` driven by a runtime (`Blocking`), behind one trait so
//! that every topology's instance is a `Box<dyn Loop>`.
use redis_idem_client::*;
use serde_json::Value as Json;
use std::time::Duration;

/// A work's value: any JSON, or a map JSON cannot encode (non-string keys).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Out {
    Json(Json),
    Unserializable(std::collections::BTreeMap<(u8, u8), u8>),
}

impl Out {
    pub fn json(&self) -> Json {
        match self {
            Out::Json(v) => v.clone(),
            Out::Unserializable(_) => serde_json::json!("<unserializable>"),
        }
    }
}

/// The `typed` steps' record: what the work returns, and the type a
/// replay must give back.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Charge {
    pub amount: i64,
    pub currency: String,
}

pub type Call = Result<Outcome<Out>, ProcessError<Out, String>>;
pub type TypedCall = Result<Outcome<Charge>, ProcessError<Charge, String>>;
pub type Work<'a> = &'a (dyn Fn(&Job) -> Result<Out, String> + Sync);
pub type TypedWork<'a> = &'a (dyn Fn(&Job) -> Result<Charge, String> + Sync);

pub trait Loop: Sync {
    fn process(&self, key: &str, call: &ProcessOptions, work: Work) -> Call;
    fn process_typed(&self, key: &str, work: TypedWork) -> TypedCall;
    fn process_many(&self, keys: &[&str], work: Work) -> Vec<BatchItem<Out, String>>;
    fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error>;
    fn claim_many(&self, keys: &[&str], lease: Duration) -> Vec<Result<Claim, Error>>;
    fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error>;
    fn done_many(&self, items: &[DoneItem]) -> Vec<Result<Done, Error>>;
    fn release(&self, key: &str, token: &str) -> bool;
    fn release_many(&self, items: &[ReleaseItem]) -> Vec<Result<bool, Error>>;
    fn get(&self, key: &str) -> Option<Record>;
    fn stats(&self) -> Stats;
    fn edition(&self) -> Edition;
}

impl<S: ConnectionSource> Loop for Idem<S> {
    fn process(&self, key: &str, call: &ProcessOptions, work: Work) -> Call {
        self.process_with(key, call, work)
    }
    fn process_typed(&self, key: &str, work: TypedWork) -> TypedCall {
        Idem::process(self, key, work)
    }
    fn process_many(&self, keys: &[&str], work: Work) -> Vec<BatchItem<Out, String>> {
        Idem::process_many(self, keys, work).unwrap()
    }
    fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        Idem::claim(self, key, lease, options)
    }
    fn claim_many(&self, keys: &[&str], lease: Duration) -> Vec<Result<Claim, Error>> {
        Idem::claim_many(self, keys, lease).unwrap()
    }
    fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        Idem::done(self, key, token, options)
    }
    fn done_many(&self, items: &[DoneItem]) -> Vec<Result<Done, Error>> {
        Idem::done_many(self, items).unwrap()
    }
    fn release(&self, key: &str, token: &str) -> bool {
        Idem::release(self, key, token).unwrap()
    }
    fn release_many(&self, items: &[ReleaseItem]) -> Vec<Result<bool, Error>> {
        Idem::release_many(self, items).unwrap()
    }
    fn get(&self, key: &str) -> Option<Record> {
        Idem::get(self, key).unwrap()
    }
    fn stats(&self) -> Stats {
        Idem::stats(self)
    }
    fn edition(&self) -> Edition {
        Idem::edition(self)
    }
}

pub struct Blocking<S: AsyncConnectionSource> {
    pub idem: AsyncIdem<S>,
    pub runtime: tokio::runtime::Runtime,
}

impl<S: AsyncConnectionSource> Blocking<S> {
    pub fn new(source: S, options: Options) -> Blocking<S> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let idem = runtime.block_on(AsyncIdem::with_options(source, options)).unwrap();
        Blocking { idem, runtime }
    }
}

impl<S: AsyncConnectionSource> Loop for Blocking<S> {
    fn process(&self, key: &str, call: &ProcessOptions, work: Work) -> Call {
        self.runtime.block_on(self.idem.process_with(key, call, |job| async move { work(&job) }))
    }
    fn process_typed(&self, key: &str, work: TypedWork) -> TypedCall {
        self.runtime.block_on(self.idem.process(key, |job| async move { work(&job) }))
    }
    fn process_many(&self, keys: &[&str], work: Work) -> Vec<BatchItem<Out, String>> {
        self.runtime.block_on(self.idem.process_many(keys, |job| async move { work(&job) })).unwrap()
    }
    fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        self.runtime.block_on(self.idem.claim(key, lease, options))
    }
    fn claim_many(&self, keys: &[&str], lease: Duration) -> Vec<Result<Claim, Error>> {
        self.runtime.block_on(self.idem.claim_many(keys, lease)).unwrap()
    }
    fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        self.runtime.block_on(self.idem.done(key, token, options))
    }
    fn done_many(&self, items: &[DoneItem]) -> Vec<Result<Done, Error>> {
        self.runtime.block_on(self.idem.done_many(items)).unwrap()
    }
    fn release(&self, key: &str, token: &str) -> bool {
        self.runtime.block_on(self.idem.release(key, token)).unwrap()
    }
    fn release_many(&self, items: &[ReleaseItem]) -> Vec<Result<bool, Error>> {
        self.runtime.block_on(self.idem.release_many(items)).unwrap()
    }
    fn get(&self, key: &str) -> Option<Record> {
        self.runtime.block_on(self.idem.get(key)).unwrap()
    }
    fn stats(&self) -> Stats {
        self.idem.stats()
    }
    fn edition(&self) -> Edition {
        self.idem.edition()
    }
}
