//! How a result becomes the bytes `IDEM.DONE ... RESULT` stores, and back
//! when a claim replays it.
use crate::error::BoxError;

/// Encodes a work's result for the record and decodes a replayed one.
/// [`JsonCodec`] (serde_json) is the default; implement this for another
/// format.
pub trait Codec<T>: Send + Sync {
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError>;
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// serde_json, for any `Serialize + DeserializeOwned` result.
#[cfg(feature = "json")]
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonCodec;

#[cfg(feature = "json")]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Codec<T> for JsonCodec {
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// The bytes as they are: for `Vec<u8>` and `String` results that are
/// already serialised.
#[derive(Clone, Copy, Debug, Default)]
pub struct BytesCodec;

impl Codec<Vec<u8>> for BytesCodec {
    fn encode(&self, value: &Vec<u8>) -> Result<Vec<u8>, BoxError> {
        Ok(value.clone())
    }
    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(bytes.to_vec())
    }
}

impl Codec<String> for BytesCodec {
    fn encode(&self, value: &String) -> Result<Vec<u8>, BoxError> {
        Ok(value.as_bytes().to_vec())
    }
    fn decode(&self, bytes: &[u8]) -> Result<String, BoxError> {
        Ok(String::from_utf8(bytes.to_vec())?)
    }
}

/// The codec when none is chosen: JSON with the `json` feature, else bytes.
#[cfg(feature = "json")]
pub type DefaultCodec = JsonCodec;
#[cfg(not(feature = "json"))]
pub type DefaultCodec = BytesCodec;
