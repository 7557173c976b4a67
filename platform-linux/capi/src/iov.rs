//! Byte arguments: checked iovec arrays lent as slices without
//! allocating on the send fast path.

use crate::codes::{BTL_ERR_ARG, BTL_ERR_INTERNAL, BTL_ERR_TOO_LARGE};
use crate::error::{fail, need, Fail};
use crate::types::btl_iovec_t;

/// `len` bytes at `p` (an empty slice for `len` 0, whatever `p`).
///
/// # Safety
///
/// With `len > 0`, `p` must point to `len` readable bytes that stay valid
/// and unchanged for the slice's use.
pub(crate) unsafe fn slice<'a>(p: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

/// Checks an iovec array (count, NULL bases with bytes, total length) and
/// lends it.
///
/// # Safety
///
/// `iov`, when not NULL, points to `iovcnt` elements that live for `'a`.
#[inline(always)]
pub(crate) unsafe fn iov_array<'a>(
    iov: *const btl_iovec_t,
    iovcnt: usize,
) -> Result<&'a [btl_iovec_t], Fail> {
    if iovcnt == 0 {
        return Ok(&[]);
    }
    need(iov, "iov")?;
    if iovcnt > 1024 {
        return Err(fail(BTL_ERR_ARG, format!("iovcnt {iovcnt} is above 1024")));
    }
    // SAFETY: not NULL; the caller's promise of `iovcnt` elements.
    let v = unsafe { std::slice::from_raw_parts(iov, iovcnt) };
    // One branch-free pass; the cold one names the first bad piece. A
    // saturated sum is above isize::MAX exactly when some prefix's is.
    let (mut total, mut null) = (0usize, false);
    for p in v {
        null |= p.base.is_null() & (p.len != 0);
        total = total.saturating_add(p.len);
    }
    if null || total > isize::MAX as usize {
        return Err(bad_iov(v));
    }
    Ok(v)
}

/// Why [`iov_array`] refused `v`: its first piece with a NULL base and
/// bytes, or the piece where the total length passes isize::MAX.
#[cold]
#[inline(never)]
fn bad_iov(v: &[btl_iovec_t]) -> Fail {
    let mut total = 0usize;
    for (i, p) in v.iter().enumerate() {
        if p.base.is_null() && p.len > 0 {
            return fail(
                BTL_ERR_ARG,
                format!("iov[{i}].base is NULL with len {}", p.len),
            );
        }
        match total.checked_add(p.len) {
            Some(t) if t <= isize::MAX as usize => total = t,
            _ => return fail(BTL_ERR_TOO_LARGE, "the pieces' total length overflows"),
        }
    }
    // iov_array calls this only for an array that fails above.
    fail(
        BTL_ERR_INTERNAL,
        "an iovec array was refused without a bad piece",
    )
}

/// How many pieces [`with_pieces`] lends without allocating.
const FEW: usize = 4;

/// Lends checked pieces ([`iov_array`]'s) to `f` as slices, without
/// allocating for up to [`FEW`] and without a loop for one or two (a
/// payload, a header and a payload): the send fast path builds nothing it
/// does not pass on.
///
/// # Safety
///
/// Every piece of `v` is `len` readable bytes at `base` for `'a` (NULL
/// bases have no bytes: [`iov_array`] checked).
#[inline(always)]
pub(crate) unsafe fn with_pieces<'a, T>(v: &[btl_iovec_t], f: impl FnOnce(&[&'a [u8]]) -> T) -> T {
    // SAFETY: the caller's promise of readable pieces.
    let piece = |p: &btl_iovec_t| unsafe { slice(p.base.cast(), p.len) };
    match v {
        [] => f(&[]),
        [a] => f(&[piece(a)]),
        [a, b] => f(&[piece(a), piece(b)]),
        _ if v.len() <= FEW => {
            let mut a: [&[u8]; FEW] = [&[]; FEW];
            for (d, p) in a.iter_mut().zip(v) {
                *d = piece(p);
            }
            f(&a[..v.len()])
        }
        _ => f(&v.iter().map(piece).collect::<Vec<_>>()),
    }
}
