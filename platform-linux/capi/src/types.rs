//! The C ABI's plain data types and callback types: what a caller fills
//! in and what btl hands back (`btl_*_t`, `btl_*_fn` in btl.h).

use std::ffi::{c_char, c_void};
use std::os::raw::c_int;

/// One piece of a message: `len` bytes at `base` (`base` may be NULL only
/// when `len` is 0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_iovec_t {
    /// First byte.
    pub base: *const c_void,
    /// Number of bytes.
    pub len: usize,
}

/// A registered region, as its owner and its peers see it. Plain data:
/// copy it freely; send it to peers packed (btl_key_pack). Peers' keys are
/// validated by their owner on every use, so a stale or forged key is
/// refused, never obeyed.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct btl_key_t {
    /// The rank owning the region.
    pub rank: u32,
    /// The region's id at its owner (never reused).
    pub id: u32,
    /// Its length in bytes.
    pub len: u64,
    /// Its first byte's address in the owner's address space: remote
    /// addresses given to btl_iput/btl_iget are offsets from it.
    pub base: u64,
}

/// Who this process is, for btl_open.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_identity_t {
    /// The job's name, 1 to 64 characters of [A-Za-z0-9._-]; the same at
    /// every rank. Handles of one process that both use shared memory need
    /// different job names.
    pub job: *const c_char,
    /// This rank, below `size`.
    pub rank: u32,
    /// Number of ranks, at least 1.
    pub size: u32,
    /// This node's name, as `job`: ranks with the same node name share
    /// memory.
    pub node: *const c_char,
}

/// Message sizes of the transport that reaches a peer (btl_limits).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct btl_limits_t {
    /// Messages up to this size go eagerly, in one fragment or frame.
    pub eager: u64,
    /// Largest message sent as one fragment; larger ones are pipelined or
    /// read by the receiver (single copy).
    pub max_send: u64,
    /// Largest message at all.
    pub max_message: u64,
}

/// What btl_progress hands the callback. Every pointer in it is valid only
/// during the callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_event_t {
    /// BTL_EVENT_MESSAGE, BTL_EVENT_DONE or BTL_EVENT_PEER_FAILED.
    pub kind: c_int,
    /// Message: the sender; done: the peer of the operation; peer failed:
    /// the peer.
    pub rank: u32,
    /// Message: its tag.
    pub tag: u8,
    /// Done: BTL_OK or the operation's error (BTL_ERR_REFUSED, ...).
    pub status: c_int,
    /// Message: its bytes, in place (in the shared-memory fragment, which
    /// goes back to the sender only when the callback returns, or the TCP
    /// read buffer; a message larger than one fragment, or one kept from
    /// btl_barrier or a NULL-callback btl_progress, is a buffer of btl's):
    /// valid until the callback returns, read-only. Copy what you keep.
    pub data: *const c_void,
    /// Message: its length.
    pub len: usize,
    /// Done: the context given when the operation was posted.
    pub context: *mut c_void,
    /// Peer failed: why; done with an error: the message; otherwise NULL.
    /// NUL-terminated, valid during the callback only.
    pub text: *const c_char,
}

/// The event callback of btl_progress: `ctx` is btl_progress's `ctx`.
pub type btl_event_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, ev: *const btl_event_t)>;

/// The fetch callback of btl_connect: copies rank `rank`'s address blob
/// (what that rank's btl_address gave) into `buf` (room for `cap` =
/// BTL_ADDRESS_MAX bytes), sets `*len` to its length and returns 0;
/// anything else is a failure. Called for every other rank, once each,
/// during btl_connect only.
pub type btl_fetch_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        rank: u32,
        buf: *mut c_void,
        cap: usize,
        len: *mut usize,
    ) -> c_int,
>;

/// One parameter's definition (btl_param_info). Strings are
/// NUL-terminated and live as long as the process.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct btl_param_info_t {
    /// The component (`sm`, `tcp`).
    pub component: *const c_char,
    /// The parameter's name (`fifo_size`).
    pub name: *const c_char,
    /// BTL_PARAM_INT, _UINT, _SIZE, _BOOL or _STRING.
    pub kind: c_int,
    /// The default, as text.
    pub default_value: *const c_char,
    /// Smallest accepted number (0 for a string).
    pub min: i64,
    /// Largest accepted number; for a string, its longest length.
    pub max: i64,
    /// When not NULL: the only accepted numbers (`nvalues` of them).
    pub values: *const i64,
    /// Number of `values`.
    pub nvalues: usize,
    /// When 1: every number in [min, max] but `except`.
    pub has_except: c_int,
    /// See `has_except`.
    pub except: i64,
    /// What it accepts, for people ("a power of two >= 16").
    pub accepts: *const c_char,
    /// One-line help text.
    pub help: *const c_char,
    /// Open MPI info level (1 = basic user .. 9 = developer).
    pub level: u32,
    /// Its environment variable (`BTL_SM_FIFO_SIZE`).
    pub env_name: *const c_char,
    /// Open MPI's environment variable (`OMPI_MCA_btl_sm_fifo_size`).
    pub ompi_env_name: *const c_char,
}
