//! Caller memory a transport keeps until an operation completes: one
//! buffer by address ([`RawBuf`]) and several read as one message
//! ([`RawParts`]). A leaf module: the transports, the region table and the
//! job API all use it, and it uses none of them.
//!
//! # Safety
//!
//! [`RawBuf`] names caller memory by address; turning it back into a slice
//! is `unsafe`, with the contract on the type. This module only builds and
//! slices such addresses.
#![allow(unsafe_code)]

use std::ptr::NonNull;

/// Caller memory a transport reads (a send's or put's source) or writes (a
/// get's destination) after the post returned, until the operation
/// completes or is cancelled.
///
/// Creating one is safe; using it ([`Self::as_slice`],
/// [`Self::as_mut_slice`]) is not: the creator promises the memory stays
/// valid, and is not used otherwise, until then. The job API keeps that
/// promise for registered regions (borrowed for the job's lifetime `'m`)
/// and for owned buffers (kept in the request); the C ABI passes it on to
/// C callers.
#[derive(Clone, Copy, Debug)]
pub struct RawBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RawBuf is an address and a length; the memory it names is
// owned by whoever created it, under the contract above, which does not
// depend on the thread that uses it (the job API is `Send`, not `Sync`).
unsafe impl Send for RawBuf {}

impl RawBuf {
    /// Names `s` (read-only use).
    pub fn new(s: &[u8]) -> Self {
        Self {
            ptr: NonNull::from(s).cast(),
            len: s.len(),
        }
    }

    /// Names `s` (read or write use).
    pub fn new_mut(s: &mut [u8]) -> Self {
        let len = s.len();
        Self {
            ptr: NonNull::from(s).cast(),
            len,
        }
    }

    /// Names `len` bytes at `ptr` (a null pointer is accepted only with
    /// `len == 0`).
    pub fn from_raw(ptr: *mut u8, len: usize) -> Option<Self> {
        match NonNull::new(ptr) {
            Some(ptr) => Some(Self { ptr, len }),
            None if len == 0 => Some(Self::empty()),
            None => None,
        }
    }

    /// An empty buffer.
    pub fn empty() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address (for single copy: a peer reads or writes it).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// `[off, off + len)` of this buffer, if inside it.
    pub fn sub(&self, off: usize, len: usize) -> Option<Self> {
        let end = off.checked_add(len)?;
        (end <= self.len).then(|| Self {
            // SAFETY: off <= len of the named memory (checked above), so the
            // pointer stays inside it or one past its end.
            ptr: unsafe { self.ptr.add(off) },
            len,
        })
    }

    /// The bytes.
    ///
    /// # Safety
    ///
    /// The memory must be valid for reads for `'a` and not written
    /// meanwhile by anything but a peer's single copy under the protocol.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        // SAFETY: the caller's promise above; ptr is non-null and aligned
        // (u8), len is the length the creator named.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    ///
    /// # Safety
    ///
    /// The memory must be valid for writes for `'a` and not accessed
    /// otherwise meanwhile.
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        // SAFETY: the caller's promise above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Pieces a [`RawParts`] keeps without allocating (a header and a payload,
/// as Open MPI's descriptors have, fit).
const INLINE_PARTS: usize = 2;

/// Slices [`RawParts::with_slices`] builds on the stack.
const STACK_SLICES: usize = 4;

/// Several [`RawBuf`]s read as one message (a vectored send). Up to two
/// pieces are kept inline: posting a message, the per-fragment path of a
/// pipelined large message, allocates nothing.
#[derive(Clone, Debug)]
pub struct RawParts {
    inline: [RawBuf; INLINE_PARTS],
    /// Pieces in `inline` (when `spill` is empty).
    n: usize,
    /// All the pieces, when there are more than fit inline.
    spill: Vec<RawBuf>,
    len: usize,
}

impl Default for RawParts {
    fn default() -> Self {
        Self {
            inline: [RawBuf::empty(); INLINE_PARTS],
            n: 0,
            spill: Vec::new(),
            len: 0,
        }
    }
}

impl RawParts {
    /// Names the slices of `parts`, in order.
    pub fn new(parts: &[&[u8]]) -> Self {
        let mut r = Self::default();
        for p in parts.iter().filter(|p| !p.is_empty()) {
            r.push(RawBuf::new(p));
        }
        r
    }

    /// Names `bufs`, in order (empty ones skipped).
    pub fn from_bufs(bufs: impl IntoIterator<Item = RawBuf>) -> Self {
        let mut r = Self::default();
        for b in bufs.into_iter().filter(|b| !b.is_empty()) {
            r.push(b);
        }
        r
    }

    /// One buffer.
    pub fn one(b: RawBuf) -> Self {
        let mut r = Self::default();
        if !b.is_empty() {
            r.push(b);
        }
        r
    }

    fn push(&mut self, b: RawBuf) {
        self.len += b.len();
        if self.spill.is_empty() && self.n < INLINE_PARTS {
            self.inline[self.n] = b;
            self.n += 1;
        } else {
            if self.spill.is_empty() {
                self.spill.extend_from_slice(&self.inline[..self.n]);
            }
            self.spill.push(b);
        }
    }

    /// The pieces, in order.
    fn parts(&self) -> &[RawBuf] {
        if self.spill.is_empty() {
            &self.inline[..self.n]
        } else {
            &self.spill
        }
    }

    /// Total length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The single contiguous buffer, if the message is one piece.
    pub fn contiguous(&self) -> Option<RawBuf> {
        match self.parts() {
            [] => Some(RawBuf::empty()),
            [one] => Some(*one),
            _ => None,
        }
    }

    /// A message of exactly two pieces, the first at most `head_max`
    /// bytes: (the first, the second). What a header and a payload in
    /// place look like (Open MPI's descriptors): the header can be copied
    /// cheaply and the payload read where it is.
    pub fn head_and_body(&self, head_max: usize) -> Option<(RawBuf, RawBuf)> {
        match self.parts() {
            [h, b] if h.len() <= head_max => Some((*h, *b)),
            _ => None,
        }
    }

    /// The pieces covering `[off, off + len)` of the message, appended to
    /// `out` (cleared first).
    pub fn range(&self, mut off: usize, mut len: usize, out: &mut Vec<RawBuf>) {
        out.clear();
        for p in self.parts() {
            if len == 0 {
                break;
            }
            if off >= p.len() {
                off -= p.len();
                continue;
            }
            let take = (p.len() - off).min(len);
            if let Some(s) = p.sub(off, take) {
                out.push(s);
            }
            len -= take;
            off = 0;
        }
    }

    /// The slices of the message.
    ///
    /// # Safety
    ///
    /// As [`RawBuf::as_slice`], for every part.
    pub unsafe fn slices(&self, out: &mut Vec<&[u8]>) {
        out.clear();
        // SAFETY: the caller's promise, part by part.
        out.extend(self.parts().iter().map(|p| unsafe { p.as_slice() }));
    }

    /// Calls `f` with the slices of the message, gathered on the stack
    /// when there are few (no allocation on a message's fast path).
    ///
    /// # Safety
    ///
    /// As [`RawBuf::as_slice`], for every part, for the duration of `f`.
    pub unsafe fn with_slices<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let parts = self.parts();
        if parts.len() <= STACK_SLICES {
            let mut a: [&[u8]; STACK_SLICES] = [&[]; STACK_SLICES];
            for (d, p) in a.iter_mut().zip(parts) {
                // SAFETY: the caller's promise, part by part.
                *d = unsafe { p.as_slice() };
            }
            f(&a[..parts.len()])
        } else {
            let mut v = Vec::new();
            // SAFETY: the caller's promise.
            unsafe { self.slices(&mut v) };
            f(&v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_parts_ranges_cross_pieces() {
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        let c = [6u8, 7, 8, 9];
        let p = RawParts::new(&[&a, &[], &b, &c]);
        assert_eq!(p.len(), 9);
        assert!(p.contiguous().is_none());
        let mut out = Vec::new();
        p.range(2, 4, &mut out);
        // SAFETY: a, b, c live for the whole test and are not written.
        let got: Vec<u8> = out
            .iter()
            .flat_map(|r| unsafe { r.as_slice() }.to_vec())
            .collect();
        assert_eq!(got, vec![3, 4, 5, 6]);
        p.range(8, 10, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len(), 1);
        assert!(RawBuf::from_raw(std::ptr::null_mut(), 1).is_none());
        assert!(RawBuf::from_raw(std::ptr::null_mut(), 0).is_some());
    }

    #[test]
    fn raw_parts_inline_spilled_and_gathered_alike() {
        let bufs: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; usize::from(i) + 1]).collect();
        for n in 0..=bufs.len() {
            let refs: Vec<&[u8]> = bufs[..n].iter().map(|b| b.as_slice()).collect();
            let want = refs.concat();
            let p = RawParts::new(&refs);
            assert_eq!(p.len(), want.len(), "{n} parts");
            assert_eq!(p.contiguous().is_some(), n <= 1, "{n} parts");
            // SAFETY: `bufs` lives for the whole test and is not written.
            let got = unsafe { p.with_slices(|s| (s.len(), s.concat())) };
            assert_eq!(got, (n, want.clone()), "{n} parts");
            let mut out = Vec::new();
            p.range(0, want.len(), &mut out);
            assert_eq!(out.len(), n, "{n} parts");
            let mut v = Vec::new();
            // SAFETY: as above.
            unsafe { p.slices(&mut v) };
            assert_eq!(v.concat(), want, "{n} parts");
        }
    }
}
