//! The address record a rank publishes through wire-up: its TCP listen
//! addresses as text, `SocketAddr`s separated by commas
//! (`127.0.0.1:1024,[::1]:1025`; blanks around entries are ignored).
//!
//! The record is written by a peer, so [`AddrRecord::parse`] checks all of
//! it — UTF-8, at least one entry, every entry an address — and refuses the
//! record as a whole rather than keep the entries that happen to parse.
//! Writing is `Display` of each address joined with `,`
//! ([`write_addr_record`]).

use core::fmt;
use core::net::SocketAddr;

/// Why a peer's address record is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AddrRecordError {
    /// The record is not UTF-8 text.
    #[error("the address record is not UTF-8 text")]
    NotText,
    /// The record holds no address.
    #[error("the address record holds no address")]
    Empty,
    /// Entry `index` (0-based) is not an `ip:port` address.
    #[error("entry {index} of the address record is not an ip:port")]
    BadEntry {
        /// Position of the entry in the record.
        index: usize,
    },
}

/// A validated address record (borrowing the record's bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrRecord<'a> {
    text: &'a str,
}

impl<'a> AddrRecord<'a> {
    /// Checks a record: UTF-8, at least one entry, every entry an address.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, AddrRecordError> {
        let text = core::str::from_utf8(bytes)
            .map_err(|_| AddrRecordError::NotText)?
            .trim();
        if text.is_empty() {
            return Err(AddrRecordError::Empty);
        }
        for (index, entry) in text.split(',').enumerate() {
            if entry.trim().parse::<SocketAddr>().is_err() {
                return Err(AddrRecordError::BadEntry { index });
            }
        }
        Ok(Self { text })
    }

    /// The addresses, in the record's order.
    pub fn iter(&self) -> impl Iterator<Item = SocketAddr> + 'a {
        // Every entry parsed in `parse`.
        self.text.split(',').filter_map(|e| e.trim().parse().ok())
    }
}

/// Writes `addrs` as a record ([`AddrRecord::parse`] reads it back).
pub fn write_addr_record(
    out: &mut impl fmt::Write,
    addrs: impl IntoIterator<Item = SocketAddr>,
) -> fmt::Result {
    for (i, a) in addrs.into_iter().enumerate() {
        if i > 0 {
            out.write_char(',')?;
        }
        write!(out, "{a}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::String;
    use std::vec::Vec;

    #[test]
    fn roundtrip_both_families() {
        let addrs: [SocketAddr; 3] = [
            "127.0.0.1:1024".parse().unwrap(),
            "[::1]:1025".parse().unwrap(),
            "[fe80::1%2]:7".parse().unwrap(),
        ];
        let mut s = String::new();
        write_addr_record(&mut s, addrs).unwrap();
        assert_eq!(s, "127.0.0.1:1024,[::1]:1025,[fe80::1%2]:7");
        let r = AddrRecord::parse(s.as_bytes()).unwrap();
        assert_eq!(r.iter().collect::<Vec<_>>(), addrs);
        // Blanks around entries are tolerated.
        let r = AddrRecord::parse(b" 127.0.0.1:1024 , [::1]:1025\n").unwrap();
        assert_eq!(r.iter().collect::<Vec<_>>(), addrs[..2]);
    }

    #[test]
    fn malformed_records_are_refused_whole() {
        assert_eq!(AddrRecord::parse(b""), Err(AddrRecordError::Empty));
        assert_eq!(AddrRecord::parse(b" \n"), Err(AddrRecordError::Empty));
        assert_eq!(AddrRecord::parse(b"\xff:1"), Err(AddrRecordError::NotText));
        // One good entry does not excuse a bad one (it used to be skipped).
        for (record, index) in [
            (&b"127.0.0.1:1024,garbage"[..], 1),
            (b"127.0.0.1:1024,", 1),
            (b"127.0.0.1", 0),
            (b"127.0.0.1:65536", 0),
        ] {
            assert_eq!(
                AddrRecord::parse(record),
                Err(AddrRecordError::BadEntry { index }),
                "{record:?}"
            );
        }
    }
}
