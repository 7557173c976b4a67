//! The caller's memory: registering and deregistering regions, and keys
//! packed to bytes for peers.

use std::ffi::c_void;
use std::os::raw::c_int;

use btl_linux::world::RegionKey;

use crate::codes::{BTL_ERR_ARG, BTL_ERR_KEY, BTL_KEY_BYTES, BTL_OK};
use crate::error::{entry, fail, need};
use crate::handle::{btl_t, handle};
use crate::iov::slice;
use crate::types::btl_key_t;

/// Registers `len` bytes at `base` (the caller's memory): peers may get
/// from and put into it through `*key` (send them btl_key_pack's bytes),
/// and btl_iput/btl_iget use it as their local side. The memory must stay
/// valid until btl_deregister succeeds or the handle is finalized, and is
/// not to be touched by the caller while operations on it run. Allowed
/// inside an event callback.
///
/// # Safety
///
/// `h` a handle; `base` points to `len` readable and writable bytes;
/// `key` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_register(
    h: *mut btl_t,
    base: *mut c_void,
    len: usize,
    key: *mut btl_key_t,
) -> c_int {
    entry("btl_register", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(base.cast_const().cast::<u8>(), "base")?;
        need(key, "key")?;
        if len == 0 {
            return Err(fail(BTL_ERR_ARG, "len is 0 (nothing to register)"));
        }
        if len > isize::MAX as usize || (base as usize).checked_add(len).is_none() {
            return Err(fail(BTL_ERR_ARG, "base + len overflows"));
        }
        let k = h.with_regions(|r| match r {
            // SAFETY: the caller's promise on the memory.
            Ok(cx) => unsafe { cx.register_raw(base.cast(), len) },
            // SAFETY: as above.
            Err(w) => unsafe { w.register_raw(base.cast(), len) },
        })?;
        // SAFETY: checked.
        unsafe {
            key.write(btl_key_t {
                rank: k.rank,
                id: k.id,
                len: k.len,
                base: base as u64,
            })
        };
        Ok(BTL_OK)
    })
}

/// Removes one of our regions: later requests naming it (ours or peers')
/// are refused. BTL_ERR_BUSY while operations of ours use it, or while a
/// peer's get is answered from it (over shared memory, and over TCP for
/// answers of 32 KiB or more: progress and retry); BTL_ERR_KEY
/// for a key that is not ours or names no region. Allowed inside an event
/// callback.
///
/// # Safety
///
/// `h` a handle; `key` readable.
#[no_mangle]
pub unsafe extern "C" fn btl_deregister(h: *mut btl_t, key: *const btl_key_t) -> c_int {
    entry("btl_deregister", || {
        // SAFETY: the caller's handle.
        let h = unsafe { handle(h) }?;
        need(key, "key")?;
        // SAFETY: checked.
        let k = unsafe { key.read() };
        if k.rank != h.rank {
            return Err(fail(
                BTL_ERR_KEY,
                format!("the key is rank {}'s, not ours ({})", k.rank, h.rank),
            ));
        }
        let rk = RegionKey {
            rank: k.rank,
            id: k.id,
            len: k.len,
        };
        h.with_regions(|r| match r {
            Ok(cx) => cx.deregister(&rk),
            Err(w) => w.deregister(&rk),
        })?;
        Ok(BTL_OK)
    })
}

/// Packs `*key` into BTL_KEY_BYTES bytes at `out` (little endian), to
/// send to peers.
///
/// # Safety
///
/// `key` readable; `out` points to BTL_KEY_BYTES writable bytes.
#[no_mangle]
pub unsafe extern "C" fn btl_key_pack(key: *const btl_key_t, out: *mut u8) -> c_int {
    entry("btl_key_pack", || {
        need(key, "key")?;
        need(out, "out")?;
        // SAFETY: checked.
        let k = unsafe { key.read() };
        let mut b = [0u8; BTL_KEY_BYTES];
        b[..RegionKey::LEN].copy_from_slice(
            &RegionKey {
                rank: k.rank,
                id: k.id,
                len: k.len,
            }
            .to_bytes(),
        );
        b[RegionKey::LEN..].copy_from_slice(&k.base.to_le_bytes());
        // SAFETY: the caller's BTL_KEY_BYTES writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out, BTL_KEY_BYTES) };
        Ok(BTL_OK)
    })
}

/// Unpacks btl_key_pack's bytes (`len` must be BTL_KEY_BYTES) into
/// `*key`. The key is only decoded here: its owner validates it on use.
///
/// # Safety
///
/// `bytes` points to `len` readable bytes; `key` writable.
#[no_mangle]
pub unsafe extern "C" fn btl_key_unpack(
    bytes: *const c_void,
    len: usize,
    key: *mut btl_key_t,
) -> c_int {
    entry("btl_key_unpack", || {
        need(bytes.cast::<u8>(), "bytes")?;
        need(key, "key")?;
        if len != BTL_KEY_BYTES {
            return Err(fail(
                BTL_ERR_KEY,
                format!("a packed key is {BTL_KEY_BYTES} bytes, not {len}"),
            ));
        }
        // SAFETY: checked: `len` readable bytes.
        let b = unsafe { slice(bytes.cast(), len) };
        let rk = RegionKey::from_bytes(&b[..RegionKey::LEN])
            .ok_or_else(|| fail(BTL_ERR_KEY, "malformed key"))?;
        let mut base = [0u8; 8];
        base.copy_from_slice(&b[RegionKey::LEN..]);
        // SAFETY: checked.
        unsafe {
            key.write(btl_key_t {
                rank: rk.rank,
                id: rk.id,
                len: rk.len,
                base: u64::from_le_bytes(base),
            })
        };
        Ok(BTL_OK)
    })
}
