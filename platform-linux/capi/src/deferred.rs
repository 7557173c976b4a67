//! What callbacks post: operations queued inside a callback and posted
//! when it returns, completions known outside the world, and the requests
//! in flight with their C contexts.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::raw::c_int;

use btl_linux::ops::RawParts;
use btl_linux::world::RegionKey;

/// Bytes the callbacks may queue in copied sends before btl_sendi says
/// would-block.
pub(crate) const DEFERRED_BYTES: usize = 8 << 20;

/// An operation posted from inside a callback, posted when it returns.
pub(crate) enum Deferred {
    Copy {
        peer: u32,
        tag: u8,
        data: Vec<u8>,
    },
    Send {
        peer: u32,
        tag: u8,
        parts: RawParts,
        ctx: usize,
    },
    Rma {
        put: bool,
        local: RegionKey,
        local_off: u64,
        remote: RegionKey,
        remote_off: u64,
        len: u64,
        ctx: usize,
    },
}

/// A completion known outside the world (a deferred post that completed
/// at once or failed).
pub(crate) struct Ready {
    pub(crate) ctx: usize,
    pub(crate) peer: u32,
    pub(crate) status: c_int,
    pub(crate) text: Option<CString>,
}

#[derive(Default)]
pub(crate) struct Side {
    pub(crate) deferred: VecDeque<Deferred>,
    pub(crate) deferred_bytes: usize,
    pub(crate) ready: VecDeque<Ready>,
    /// Requests in flight: their context and peer.
    pub(crate) pending: HashMap<u64, (usize, u32)>,
}
