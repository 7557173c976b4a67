//! Wire-up: how the ranks of a job learn about each other (the seed's
//! modex). Every rank publishes a few small key/value records (its node,
//! its TCP addresses), all ranks meet in a fence, then each reads the
//! records of the peers it needs.
//!
//! - [`Wireup`] is the trait every source implements: the launcher's
//!   key/value service (this module's [`kv`] protocol), PMIx, a session
//!   directory, or static configuration on a bare-metal node.
//! - [`kv`] is the byte protocol of the key/value service and a sans-IO
//!   client state machine for it, so a bare-metal node can reach the same
//!   service as a Linux rank.
//!
//! Keys are 1 to [`MAX_KEY`] characters from `[A-Za-z0-9._-]`; values are at
//! most [`MAX_VALUE`] bytes. A value read back is a peer's data: callers
//! validate it.

use core::fmt;

/// Longest key, in bytes.
pub const MAX_KEY: usize = 64;
/// Largest value, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;

/// Whether `key` is a valid wire-up key (1 to [`MAX_KEY`] characters from
/// `[A-Za-z0-9._-]`).
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `name` is a valid job identifier or node name (1 to 64
/// characters from `[A-Za-z0-9._-]`): the same alphabet as keys.
pub fn valid_name(name: &str) -> bool {
    valid_key(name)
}

/// A source of wire-up: publish my records, meet in a fence, read a peer's.
///
/// The calling pattern is `put`* → `fence` → `get`*; a source may allow
/// more rounds. Every blocking implementation bounds its waits with a
/// timeout and names the ranks it waited for when it gives up.
pub trait Wireup {
    /// What can go wrong.
    type Error: fmt::Debug + fmt::Display;

    /// This process's rank in the job.
    fn rank(&self) -> u32;
    /// Number of ranks in the job.
    fn size(&self) -> u32;
    /// Publishes `value` under `key` for every rank to read after the next
    /// fence. Publishing a key again replaces its value.
    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), Self::Error>;
    /// Waits until every rank has reached the fence (and so published what
    /// it published before it).
    fn fence(&mut self) -> Result<(), Self::Error>;
    /// Copies rank `rank`'s value of `key` into `out`: `Ok(Some(len))`, or
    /// `Ok(None)` when that rank did not publish the key. A value longer
    /// than `out` is an error.
    fn get(&mut self, rank: u32, key: &str, out: &mut [u8]) -> Result<Option<usize>, Self::Error>;
    /// Hands every rank's value of `key` to `each`, in rank order
    /// (`None`: that rank did not publish it); `buf` holds one value. The
    /// default asks [`get`](Self::get) once per rank; a source that can
    /// answer for many ranks at once (the key/value service's GET_ALL)
    /// does so, as a job's every rank reading every rank's record is n²
    /// requests one by one.
    fn get_each(
        &mut self,
        key: &str,
        buf: &mut [u8],
        each: &mut dyn FnMut(u32, Option<&[u8]>),
    ) -> Result<(), Self::Error> {
        for r in 0..self.size() {
            let n = self.get(r, key, buf)?;
            each(r, n.map(|n| &buf[..n]));
        }
        Ok(())
    }
}

pub mod kv;
