//! Wire-up through the job's session directory: each rank publishes small
//! key/value records as files, and reads its peers' records, waiting for
//! them with a timeout.
//!
//! This works wherever the ranks share the session directory's file system:
//! one machine under `btl run`, and network namespaces of one machine.
//! Across machines the launcher's key/value service ([`super::kv`]) or PMIx
//! ([`super::pmix`]) takes this role.
//!
//! A record is written to a temporary name and renamed into place, so a
//! reader never sees half a record. Values are read back with a size limit
//! ([`MAX_VALUE`]); a peer's record is data, validated by the caller.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{check_key, check_put, copy_value, Wireup, WireupError, DEFAULT_TIMEOUT, MAX_VALUE};

/// Key/value records of one job in its session directory.
#[derive(Debug, Clone)]
pub struct SessionWireup {
    dir: PathBuf,
    rank: u32,
    size: u32,
    timeout: Duration,
    fences: u64,
}

impl SessionWireup {
    /// Records of rank `rank` of `size` in `session_dir` (a `wireup`
    /// subdirectory is created on first publish); waits time out after
    /// [`DEFAULT_TIMEOUT`].
    pub fn new(session_dir: &Path, rank: u32, size: u32) -> Self {
        Self {
            dir: session_dir.join("wireup"),
            rank,
            size,
            timeout: DEFAULT_TIMEOUT,
            fences: 0,
        }
    }

    /// The same, with another timeout for [`Wireup::fence`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn path(&self, rank: u32, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.{rank}"))
    }

    /// Publishes `value` under `key` for this rank (atomically: temporary
    /// file, then rename).
    pub fn publish(&self, key: &str, value: &[u8]) -> Result<(), WireupError> {
        check_key(key)?;
        let path = self.path(self.rank, key);
        let err = |source| WireupError::Publish {
            path: path.clone(),
            source,
        };
        fs::create_dir_all(&self.dir).map_err(err)?;
        let tmp = self.dir.join(format!(".{key}.{}.tmp", self.rank));
        let mut f = fs::File::create(&tmp).map_err(err)?;
        f.write_all(value).map_err(err)?;
        f.sync_data().ok();
        drop(f);
        fs::rename(&tmp, &path).map_err(err)
    }

    /// Rank `rank`'s value of `key`, if it has published it.
    pub fn try_get(&self, rank: u32, key: &str) -> Result<Option<Vec<u8>>, WireupError> {
        check_key(key)?;
        let path = self.path(rank, key);
        let f = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(WireupError::Read { path, source }),
        };
        let mut v = Vec::new();
        f.take(MAX_VALUE as u64 + 1)
            .read_to_end(&mut v)
            .map_err(|source| WireupError::Read {
                path: path.clone(),
                source,
            })?;
        if v.len() > MAX_VALUE {
            return Err(WireupError::TooLarge {
                rank,
                key: key.into(),
            });
        }
        Ok(Some(v))
    }

    /// Waits (polling) until every rank in `ranks` has published `key`,
    /// returning their values in the same order; times out naming the
    /// ranks it still waits for.
    pub fn get_all(
        &self,
        ranks: &[u32],
        key: &str,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, WireupError> {
        let mut deadline = crate::wait::Deadline::new(timeout);
        let mut got: Vec<Option<Vec<u8>>> = vec![None; ranks.len()];
        let done = deadline.poll(|| {
            for (slot, &r) in got.iter_mut().zip(ranks) {
                if slot.is_none() {
                    *slot = self.try_get(r, key)?;
                }
            }
            Ok::<_, WireupError>(got.iter().all(Option::is_some).then_some(()))
        })?;
        if done.is_some() {
            return Ok(got.into_iter().flatten().collect());
        }
        let missing: Vec<u32> = ranks
            .iter()
            .zip(&got)
            .filter(|(_, g)| g.is_none())
            .map(|(&r, _)| r)
            .collect();
        Err(WireupError::Timeout {
            what: format!("the record {key:?}"),
            count: missing.len() as u32,
            missing,
            waited: deadline.elapsed(),
        })
    }
}

impl Wireup for SessionWireup {
    type Error = WireupError;
    crate::wireup_rank_size!();

    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), WireupError> {
        check_put(self.rank, key, value)?;
        self.publish(key, value)
    }

    /// Publishes a marker for this fence and waits for every rank's.
    fn fence(&mut self) -> Result<(), WireupError> {
        self.fences += 1;
        let key = format!("fence-{}", self.fences);
        self.publish(&key, b"")?;
        let all: Vec<u32> = (0..self.size).collect();
        self.get_all(&all, &key, self.timeout).map(drop)
    }

    fn get(&mut self, rank: u32, key: &str, out: &mut [u8]) -> Result<Option<usize>, WireupError> {
        let v = self.try_get(rank, key)?;
        copy_value(rank, key, v.as_deref(), out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("btl-wireup-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn publish_then_get() {
        let d = tmpdir("pg");
        let (a, b) = (SessionWireup::new(&d, 0, 2), SessionWireup::new(&d, 1, 2));
        a.publish("tcp-addr", b"127.0.0.1:5000").unwrap();
        assert_eq!(
            b.try_get(0, "tcp-addr").unwrap().as_deref(),
            Some(&b"127.0.0.1:5000"[..])
        );
        assert_eq!(b.try_get(1, "tcp-addr").unwrap(), None);
        b.publish("tcp-addr", b"x").unwrap();
        let all = a
            .get_all(&[0, 1], "tcp-addr", Duration::from_secs(1))
            .unwrap();
        assert_eq!(all, vec![b"127.0.0.1:5000".to_vec(), b"x".to_vec()]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn missing_ranks_time_out_by_name() {
        let d = tmpdir("to");
        let a = SessionWireup::new(&d, 0, 2);
        a.publish("k", b"v").unwrap();
        match a.get_all(&[0, 3, 5], "k", Duration::from_millis(50)) {
            Err(WireupError::Timeout { missing, .. }) => assert_eq!(missing, vec![3, 5]),
            other => panic!("{other:?}"),
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn keys_and_sizes_are_checked() {
        let d = tmpdir("ks");
        let a = SessionWireup::new(&d, 0, 2);
        assert!(matches!(
            a.publish("../x", b"v"),
            Err(WireupError::BadKey { .. })
        ));
        assert!(matches!(
            a.publish("", b"v"),
            Err(WireupError::BadKey { .. })
        ));
        a.publish("big", &vec![0u8; MAX_VALUE + 1]).unwrap();
        assert!(matches!(
            a.try_get(0, "big"),
            Err(WireupError::TooLarge { .. })
        ));
        fs::remove_dir_all(&d).unwrap();
    }
}
