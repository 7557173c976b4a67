//! The C ABI's numbers: return codes, limits, event kinds and parameter
//! types (`BTL_*` in btl.h).

use std::os::raw::c_int;

use btl_linux::world::MAX_USER_TAG;

use crate::wireup;

/// Success.
pub const BTL_OK: c_int = 0;
/// Success, and the operation is complete: no BTL_EVENT_DONE follows.
pub const BTL_DONE: c_int = 1;
/// An argument is invalid: a NULL pointer, a zero length, a bad count.
pub const BTL_ERR_ARG: c_int = -1;
/// A parameter is unknown or its value malformed (btl_last_error names it
/// and says what it accepts).
pub const BTL_ERR_PARAM: c_int = -2;
/// Wire-up failed (no source, a timeout naming the missing ranks, a
/// malformed peer record, the fetch callback failed).
pub const BTL_ERR_WIREUP: c_int = -3;
/// A transport failed to start (shared-memory segment, TCP listen).
pub const BTL_ERR_TRANSPORT: c_int = -4;
/// There is no such rank.
pub const BTL_ERR_RANK: c_int = -5;
/// The tag is reserved: user tags are 0..=BTL_MAX_TAG.
pub const BTL_ERR_TAG: c_int = -6;
/// The rank exists but this handle does not reach it (transport
/// `sm-local` and a rank of another node).
pub const BTL_ERR_UNREACHABLE: c_int = -7;
/// The peer failed (died, its connection broke).
pub const BTL_ERR_PEER_FAILED: c_int = -8;
/// The peer's send queue is full: progress and retry.
pub const BTL_ERR_WOULD_BLOCK: c_int = -9;
/// The message is larger than the transport carries.
pub const BTL_ERR_TOO_LARGE: c_int = -10;
/// The target refused a get or put (unknown region, range outside it,
/// copy failed).
pub const BTL_ERR_REFUSED: c_int = -11;
/// A key is malformed, not ours where ours is needed, or names no
/// registered region.
pub const BTL_ERR_KEY: c_int = -12;
/// An address range is outside the key's region.
pub const BTL_ERR_RANGE: c_int = -13;
/// The region is used by operations in flight.
pub const BTL_ERR_BUSY: c_int = -14;
/// A blocking call waited longer than BTL_TIMEOUT.
pub const BTL_ERR_TIMEOUT: c_int = -15;
/// Not allowed now: before btl_connect, inside an event callback, after a
/// failed btl_connect.
pub const BTL_ERR_STATE: c_int = -16;
/// The handle was finalized.
pub const BTL_ERR_FINALIZED: c_int = -17;
/// The receiver could not handle the message.
pub const BTL_ERR_REMOTE: c_int = -18;
/// An internal error (a caught Rust panic): finalize the handle.
pub const BTL_ERR_INTERNAL: c_int = -19;

/// Largest user tag (Open MPI's ob1 uses 0x40..0x5f, MCA_BTL_TAG_USR is
/// 0x80: both fit; 0xf0..0xff are btl's own).
pub const BTL_MAX_TAG: u8 = 239;
const _: () = assert!(BTL_MAX_TAG == MAX_USER_TAG);
/// Bytes of a packed key (btl_key_pack).
pub const BTL_KEY_BYTES: usize = 24;
/// Most bytes an address blob (btl_address) has: the capacity the fetch
/// callback is given.
pub const BTL_ADDRESS_MAX: usize = 65536;
const _: () = assert!(BTL_ADDRESS_MAX == wireup::MAX_ADDRESS);

/// A message arrived (`rank`, `tag`, `data`, `len`).
pub const BTL_EVENT_MESSAGE: c_int = 1;
/// A posted operation completed (`context`, `rank`, `status`, `text`).
pub const BTL_EVENT_DONE: c_int = 2;
/// A peer failed (`rank`, `text`): reported once per peer.
pub const BTL_EVENT_PEER_FAILED: c_int = 3;

/// Parameter type: signed integer.
pub const BTL_PARAM_INT: c_int = 0;
/// Parameter type: unsigned integer.
pub const BTL_PARAM_UINT: c_int = 1;
/// Parameter type: a size in bytes.
pub const BTL_PARAM_SIZE: c_int = 2;
/// Parameter type: boolean (0/1; also true/false/yes/no as text).
pub const BTL_PARAM_BOOL: c_int = 3;
/// Parameter type: string.
pub const BTL_PARAM_STRING: c_int = 4;
