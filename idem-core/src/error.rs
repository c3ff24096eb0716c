//! A command's error reply, built without a server: the parsers and the
//! cores return it, the command layer replies it.

use std::ffi::{CStr, CString};

/// An error reply. Static text on the common paths; formatted only when the
/// message names a value.
#[derive(Debug)]
pub enum CmdError {
    Static(&'static CStr),
    Owned(CString),
}

impl CmdError {
    pub fn new(message: String) -> CmdError {
        // Messages are built from our own text and argument bytes a client
        // sent; a NUL in those would truncate, never fail.
        let bytes: Vec<u8> = message.into_bytes().into_iter().filter(|&b| b != 0).collect();
        CmdError::Owned(CString::new(bytes).unwrap_or_default())
    }

    /// The reply's text.
    pub fn message(&self) -> String {
        self.as_cstr().to_string_lossy().into_owned()
    }

    pub fn as_cstr(&self) -> &CStr {
        match self {
            CmdError::Static(text) => text,
            CmdError::Owned(text) => text,
        }
    }
}

pub const WRONGTYPE: CmdError = CmdError::Static(c"WRONGTYPE Operation against a key holding the wrong kind of value");
pub const NOT_AN_INTEGER: CmdError = CmdError::Static(c"ERR value is not an integer or out of range");

pub type CmdResult = Result<(), CmdError>;
