//! Fixed-capacity text: the storage of string parameters and of names
//! quoted in errors, without an allocator.

use core::fmt;

/// A string of at most `N` bytes stored inline (`N` at most 65535).
#[derive(Clone, Copy)]
pub struct FixedStr<const N: usize> {
    buf: [u8; N],
    len: u16,
}

impl<const N: usize> FixedStr<N> {
    /// Capacity in bytes.
    pub const CAPACITY: usize = N;

    const FITS: () = assert!(N <= u16::MAX as usize, "FixedStr holds at most 65535 bytes");

    /// The empty string.
    pub const EMPTY: Self = {
        let () = Self::FITS;
        FixedStr {
            buf: [0; N],
            len: 0,
        }
    };

    /// A copy of `s` if it fits in `N` bytes, else `None` (usable in `const`
    /// contexts).
    pub const fn new(s: &str) -> Option<Self> {
        let bytes = s.as_bytes();
        if bytes.len() > N {
            return None;
        }
        let mut out = Self::EMPTY;
        let mut i = 0;
        while i < bytes.len() {
            out.buf[i] = bytes[i];
            i += 1;
        }
        // `bytes.len() <= N <= u16::MAX` (checked by `FITS`).
        out.len = bytes.len() as u16;
        Some(out)
    }

    /// A copy of `s` cut to at most `N` bytes at a character boundary, and
    /// whether it was cut.
    pub fn truncated(s: &str) -> (Self, bool) {
        let mut end = s.len().min(N);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let head = s.get(..end).unwrap_or("");
        (Self::new(head).unwrap_or(Self::EMPTY), end < s.len())
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        let bytes = self.buf.get(..usize::from(self.len)).unwrap_or(&[]);
        // Always valid: only whole `&str`s, or prefixes cut at character
        // boundaries, are copied in.
        core::str::from_utf8(bytes).unwrap_or("")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<const N: usize> Default for FixedStr<N> {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl<const N: usize> PartialEq for FixedStr<N> {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl<const N: usize> Eq for FixedStr<N> {}

impl<const N: usize> fmt::Debug for FixedStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> fmt::Display for FixedStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Appends; fails (appending nothing) when the text would not fit.
impl<const N: usize> fmt::Write for FixedStr<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let start = self.len();
        let end = start.checked_add(s.len()).ok_or(fmt::Error)?;
        let dst = self.buf.get_mut(start..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        // `end <= N <= u16::MAX`.
        self.len = u16::try_from(end).map_err(|_| fmt::Error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn copies_cuts_and_appends() {
        assert_eq!(FixedStr::<4>::new("abcd").unwrap().as_str(), "abcd");
        assert!(FixedStr::<4>::new("abcde").is_none());
        let (s, cut) = FixedStr::<4>::truncated("abÜx");
        assert_eq!((s.as_str(), cut), ("abÜ", true));
        let (s, cut) = FixedStr::<3>::truncated("abÜ");
        assert_eq!((s.as_str(), cut), ("ab", true));
        assert_eq!(
            FixedStr::<3>::truncated("ab"),
            (FixedStr::new("ab").unwrap(), false)
        );
        let mut w = FixedStr::<5>::EMPTY;
        assert!(w.is_empty());
        write!(w, "{}", 123).unwrap();
        assert!(write!(w, "{}", 456).is_err());
        assert_eq!((w.as_str(), w.len()), ("123", 3));
    }
}
