//! The external runtime's address exchange behind `btl_open` /
//! `btl_connect`: btl's wire-up records (node name, pid, TCP addresses)
//! travel as one opaque blob per rank that the runtime publishes and
//! fetches (Open MPI's modex: `OPAL_MODEX_SEND` in component init, its own
//! fence, `OPAL_MODEX_RECV` per peer).
//!
//! The blob is `BTL\x01`, a u16 count, then per record a u8 key length,
//! the key, a u32 value length and the value (little endian). A peer's
//! blob is untrusted: every length is checked, keys must be wire-up keys,
//! nothing may follow the last record.

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex, PoisonError};

use btl_linux::wireup::{check_put, copy_value, valid_key, Wireup, WireupError, MAX_VALUE};

/// Largest address blob (what the fetch callback is given room for; our
/// records — node name, pid, TCP addresses — take about 100 bytes).
pub(crate) const MAX_ADDRESS: usize = 65536;

const MAGIC: &[u8; 4] = b"BTL\x01";

/// The fetch callback: copies rank `rank`'s blob into `buf` (`cap` bytes),
/// sets `*len`, returns 0 (anything else is a failure).
pub type FetchFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    rank: u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int;

type Records = Vec<(String, Vec<u8>)>;

/// What the handle and the wire-up object share.
#[derive(Default)]
pub struct Shared {
    mine: Records,
    /// The runtime's callback and its context, during `btl_connect` only.
    fetch: Option<(FetchFn, usize)>,
    peers: HashMap<u32, Records>,
}

impl Shared {
    /// Our records as the blob to publish.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&(self.mine.len() as u16).to_le_bytes());
        for (k, v) in &self.mine {
            b.push(k.len() as u8);
            b.extend_from_slice(k.as_bytes());
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            b.extend_from_slice(v);
        }
        b
    }

    /// Sets (or, with `None`, clears) the fetch callback.
    pub fn set_fetch(&mut self, f: Option<(FetchFn, usize)>) {
        self.fetch = f;
    }
}

/// Decodes a peer's blob; the error says what is wrong and where.
pub fn decode(b: &[u8]) -> Result<Records, String> {
    let bad = |at: usize, what: &str| format!("malformed at byte {at}: {what}");
    if b.len() < 6 || &b[..4] != MAGIC {
        return Err(bad(0, "not a btl address (wrong magic or too short)"));
    }
    let count = u16::from_le_bytes([b[4], b[5]]) as usize;
    let mut at = 6;
    let mut out = Vec::with_capacity(count.min(16));
    for _ in 0..count {
        let kl = *b.get(at).ok_or_else(|| bad(at, "truncated key length"))? as usize;
        let key = b
            .get(at + 1..at + 1 + kl)
            .ok_or_else(|| bad(at, "truncated key"))?;
        let key = std::str::from_utf8(key)
            .ok()
            .filter(|k| valid_key(k))
            .ok_or_else(|| bad(at + 1, "invalid key"))?;
        at += 1 + kl;
        let vl = b
            .get(at..at + 4)
            .ok_or_else(|| bad(at, "truncated value length"))?;
        let vl = u32::from_le_bytes([vl[0], vl[1], vl[2], vl[3]]) as usize;
        if vl > MAX_VALUE {
            return Err(bad(at, "value larger than a wire-up record"));
        }
        at += 4;
        let v = b
            .get(at..at + vl)
            .ok_or_else(|| bad(at, "truncated value"))?;
        at += vl;
        out.push((key.to_string(), v.to_vec()));
    }
    if at != b.len() {
        return Err(bad(at, "bytes after the last record"));
    }
    Ok(out)
}

/// The [`Wireup`] of a handle opened with an external runtime.
pub struct External {
    rank: u32,
    size: u32,
    shared: Arc<Mutex<Shared>>,
}

impl External {
    /// A wire-up for `rank` of `size`, and the state the handle keeps.
    pub fn new(rank: u32, size: u32) -> (Self, Arc<Mutex<Shared>>) {
        let shared = Arc::new(Mutex::new(Shared::default()));
        (
            Self {
                rank,
                size,
                shared: shared.clone(),
            },
            shared,
        )
    }
}

fn fetch(rank: u32, f: FetchFn, ctx: usize) -> Result<Records, WireupError> {
    let mut buf = vec![0u8; MAX_ADDRESS];
    let mut len = usize::MAX;
    // SAFETY: `buf` has `MAX_ADDRESS` writable bytes and `len` is a valid
    // location; the callback's contract (btl.h, btl_fetch_fn) is to write
    // at most `cap` bytes and set `len`.
    let rc = unsafe {
        f(
            ctx as *mut c_void,
            rank,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(WireupError::External(format!(
            "the fetch callback failed for rank {rank} (returned {rc})"
        )));
    }
    if len > buf.len() {
        return Err(WireupError::External(format!(
            "the fetch callback reported {len} bytes for rank {rank}, more than the {} it was given",
            buf.len()
        )));
    }
    decode(&buf[..len])
        .map_err(|e| WireupError::External(format!("rank {rank}'s address blob is {e}")))
}

impl Wireup for External {
    type Error = WireupError;

    btl_linux::wireup_rank_size!();

    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), WireupError> {
        check_put(self.rank, key, value)?;
        let mut s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        s.mine.retain(|(k, _)| k != key);
        s.mine.push((key.into(), value.to_vec()));
        if s.encode().len() > MAX_ADDRESS {
            s.mine.pop();
            return Err(WireupError::TooLarge {
                rank: self.rank,
                key: key.into(),
            });
        }
        Ok(())
    }

    fn fence(&mut self) -> Result<(), WireupError> {
        Err(WireupError::External(
            "a handle opened with btl_open is connected with btl_connect after the runtime's own \
             fence; btl runs no fence of its own"
                .into(),
        ))
    }

    fn get(&mut self, rank: u32, key: &str, out: &mut [u8]) -> Result<Option<usize>, WireupError> {
        let mut s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let copy = |recs: &Records, out: &mut [u8]| {
            let v = recs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_slice());
            copy_value(rank, key, v, out)
        };
        if rank == self.rank {
            return copy(&s.mine, out);
        }
        if rank >= self.size {
            return Err(WireupError::External(format!(
                "there is no rank {rank} (size {})",
                self.size
            )));
        }
        if !s.peers.contains_key(&rank) {
            let (f, ctx) = s.fetch.ok_or_else(|| {
                WireupError::External("peer records are read only during btl_connect".into())
            })?;
            // The callback runs without our lock held.
            drop(s);
            let recs = fetch(rank, f, ctx)?;
            s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            s.peers.insert(rank, recs);
        }
        copy(&s.peers[&rank], out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_round_trip_and_bad_ones_are_named() {
        let (mut w, shared) = External::new(0, 2);
        w.put("node", b"n1").unwrap();
        w.put("tcp-addr", b"127.0.0.1:5000").unwrap();
        w.put("node", b"n2").unwrap();
        let blob = shared.lock().unwrap().encode();
        let recs = decode(&blob).unwrap();
        assert_eq!(
            recs,
            vec![
                ("tcp-addr".to_string(), b"127.0.0.1:5000".to_vec()),
                ("node".to_string(), b"n2".to_vec())
            ]
        );
        for cut in 0..blob.len() {
            assert!(decode(&blob[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = blob.clone();
        longer.push(0);
        assert!(decode(&longer)
            .unwrap_err()
            .contains("after the last record"));
        let mut badkey = blob.clone();
        badkey[7] = b' ';
        assert!(decode(&badkey).unwrap_err().contains("invalid key"));
        assert!(w.put("bad key", b"").is_err());
        assert!(w.fence().is_err());
        let mut out = [0u8; 8];
        assert!(
            w.get(1, "node", &mut out).is_err(),
            "no fetch outside connect"
        );
        assert_eq!(w.get(0, "node", &mut out).unwrap(), Some(2));
    }
}
