//! A byte ring over caller-provided storage: a peer's queue of outgoing
//! frame bytes (frames wait here while the connection is set up, and
//! while the socket's transmit buffer is full). Pushes are all or
//! nothing, so a frame is never queued in part.

/// A FIFO of bytes in a borrowed buffer.
#[derive(Debug)]
pub(crate) struct Ring<'a> {
    buf: &'a mut [u8],
    /// Index of the first byte. Invariant: `head < buf.len()` or both 0.
    head: usize,
    len: usize,
}

impl<'a> Ring<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf,
            head: 0,
            len: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn free(&self) -> usize {
        self.buf.len() - self.len
    }

    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Appends all of `parts` (concatenated) or nothing; false when they do
    /// not fit.
    pub(crate) fn push(&mut self, parts: &[&[u8]]) -> bool {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > self.free() {
            return false;
        }
        let cap = self.buf.len();
        for part in parts {
            let mut part = *part;
            while !part.is_empty() {
                let tail = (self.head + self.len) % cap;
                let run = (cap - tail).min(part.len());
                self.buf[tail..tail + run].copy_from_slice(&part[..run]);
                self.len += run;
                part = &part[run..];
            }
        }
        true
    }

    /// The first contiguous run of queued bytes (empty when the ring is).
    pub(crate) fn front(&self) -> &[u8] {
        let run = (self.buf.len() - self.head).min(self.len);
        &self.buf[self.head..self.head + run]
    }

    /// Drops the first `n` bytes (at most [`Self::len`]).
    pub(crate) fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.len -= n;
        self.head = if self.len == 0 {
            0
        } else {
            (self.head + n) % self.buf.len()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn drain(r: &mut Ring<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        while !r.is_empty() {
            let f = r.front().to_vec();
            out.extend_from_slice(&f);
            r.consume(f.len());
        }
        out
    }

    #[test]
    fn fifo_with_wrap_around_and_all_or_nothing_pushes() {
        let mut buf = [0u8; 10];
        let mut r = Ring::new(&mut buf);
        assert!(r.push(&[b"abc", b"def"]));
        assert_eq!(r.len(), 6);
        assert!(!r.push(&[b"12345"]), "5 > 4 free: nothing queued");
        assert_eq!(r.len(), 6);
        r.consume(4);
        assert!(r.push(&[b"1234", b"56"]));
        assert_eq!((r.len(), r.free()), (8, 2));
        // The front stops at the end of the buffer; the rest follows.
        assert_eq!(r.front(), b"ef1234");
        assert_eq!(drain(&mut r), b"ef123456");
        assert_eq!(r.capacity(), 10);
        assert!(r.push(&[&[7u8; 10]]));
        assert_eq!(r.free(), 0);
        r.clear();
        assert!(r.is_empty() && r.front().is_empty());
    }

    #[test]
    fn random_operations_keep_fifo_order() {
        let mut buf = [0u8; 37];
        let mut r = Ring::new(&mut buf);
        let mut model = std::collections::VecDeque::new();
        let mut x = 0x9e37_79b9u32;
        let mut next = 0u8;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if x % 3 == 0 {
                let n = (x >> 8) as usize % 20;
                let bytes: Vec<u8> = (0..n)
                    .map(|_| {
                        next = next.wrapping_add(1);
                        next
                    })
                    .collect();
                if r.push(&[&bytes]) {
                    model.extend(bytes);
                } else {
                    assert!(n > r.free());
                    next = next.wrapping_sub(n as u8);
                }
            } else {
                let n = ((x >> 8) as usize % 10).min(r.front().len());
                for &b in &r.front()[..n] {
                    assert_eq!(Some(b), model.pop_front());
                }
                r.consume(n);
            }
            assert_eq!(r.len(), model.len());
        }
    }
}
