//! Backing files of shared segments: creation, attachment, sizing errors,
//! unlinking, stale-file cleanup and name validation.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use btl_linux::segment::{
    free_space, process_alive, process_start_time, remove_stale, segment_dir, segment_file_name,
    segment_file_prefix, Segment, SegmentError, HEADER_LEN,
};

/// A unique directory under the system temp dir (one per test: `what` is
/// unique), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("btl-segment-test-{}-{what}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

#[test]
fn create_open_and_share_bytes() {
    let tmp = TempDir::new("share");
    let name = segment_file_name(uid(), "job1", "node-a").unwrap();
    assert_eq!(name, format!("btl-{}-job1-node-a", uid()));
    let path = tmp.path().join(&name);

    let mut a = Segment::create(&path, 1 << 20).unwrap();
    assert_eq!(a.len(), 1 << 20);
    assert_eq!(a.path(), path);
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 1 << 20);

    let b = Segment::open(&path, 4096, Duration::from_secs(5)).unwrap();
    assert_eq!(b.len(), 1 << 20, "open maps the whole file");
    assert_ne!(a.as_ptr(), b.as_ptr(), "two distinct mappings");

    a.region().write_bytes(4096, b"hello from a").unwrap();
    let mut buf = [0u8; 12];
    b.region().read_bytes(4096, &mut buf).unwrap();
    assert_eq!(&buf, b"hello from a");

    b.region().write_bytes((1 << 20) - 3, b"end").unwrap();
    let mut end = [0u8; 3];
    a.region().read_bytes((1 << 20) - 3, &mut end).unwrap();
    assert_eq!(&end, b"end");
    assert!(a.region().read_bytes(1 << 20, &mut end).is_err());

    a.unlink().unwrap();
    assert!(!path.exists());
}

#[test]
fn open_waits_for_the_creator() {
    let tmp = TempDir::new("wait");
    let path = tmp.path().join(format!("btl-{}-wait-n0", uid()));
    let creator_path = path.clone();
    let creator = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        Segment::create(&creator_path, 64 * 1024).unwrap()
    });
    let b = Segment::open(&path, 64 * 1024, Duration::from_secs(10)).unwrap();
    let a = creator.join().unwrap();
    a.region().write_bytes(0, &[7; 8]).unwrap();
    let mut got = [0u8; 8];
    b.region().read_bytes(0, &mut got).unwrap();
    assert_eq!(got, [7; 8]);
}

#[test]
fn create_of_an_existing_file_fails() {
    let tmp = TempDir::new("exists");
    let path = tmp.path().join(format!("btl-{}-exists-n0", uid()));
    let _a = Segment::create(&path, 4096).unwrap();
    let err = Segment::create(&path, 4096).unwrap_err();
    assert!(matches!(err, SegmentError::Exists { .. }), "{err:?}");
    assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
    assert!(
        path.exists(),
        "a failed create must not remove the existing file"
    );
}

#[test]
fn open_times_out_naming_the_file() {
    let tmp = TempDir::new("timeout");
    let path = tmp.path().join(format!("btl-{}-missing-n0", uid()));
    let start = Instant::now();
    let err = Segment::open(&path, 4096, Duration::from_millis(200)).unwrap_err();
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    match &err {
        SegmentError::Timeout {
            path: p,
            waited,
            found_len,
            ..
        } => {
            assert_eq!(p, &path);
            assert!(*waited >= Duration::from_millis(200));
            assert_eq!(*found_len, None);
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(path.to_str().unwrap()), "{msg}");
    assert!(msg.contains("never appeared"), "{msg}");

    // A file that exists but is too small also times out, saying so.
    fs::write(&path, [0u8; 10]).unwrap();
    let err = Segment::open(&path, 4096, Duration::from_millis(50)).unwrap_err();
    assert!(
        matches!(
            err,
            SegmentError::Timeout {
                found_len: Some(10),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("it has 10"), "{err}");
}

fn assert_no_space(dir: &Path) {
    let free = free_space(dir).unwrap();
    let needed = free + (1 << 30);
    let Ok(len) = usize::try_from(needed) else {
        return; // cannot even express the size on this target
    };
    let path = dir.join(format!("btl-{}-nospace-{}", uid(), std::process::id()));
    let err = Segment::create(&path, len).unwrap_err();
    match &err {
        SegmentError::NoSpace {
            path: p,
            needed: n,
            free: f,
        } => {
            assert_eq!(p, &path);
            assert_eq!(*n, needed);
            assert!(*f < *n);
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&needed.to_string()), "{msg}");
    assert!(msg.contains("MiB"), "{msg}");
    assert!(!path.exists(), "NoSpace left {} behind", path.display());
}

#[test]
fn no_space_is_reported_and_leaves_no_file() {
    let tmp = TempDir::new("nospace");
    assert_no_space(tmp.path());
    if let Ok(dir) = segment_dir(None) {
        assert_no_space(&dir);
    }
}

#[test]
fn unlink_is_idempotent_and_mappings_survive() {
    let tmp = TempDir::new("unlink");
    let path = tmp.path().join(format!("btl-{}-unlink-n0", uid()));
    let mut a = Segment::create(&path, 8192).unwrap();
    let mut b = Segment::open(&path, 8192, Duration::from_secs(1)).unwrap();
    let mut d = Segment::open(&path, 8192, Duration::from_secs(1)).unwrap();
    a.unlink().unwrap();
    assert!(a.is_unlinked());
    assert!(!path.exists());
    a.unlink().unwrap();
    d.unlink().unwrap(); // someone else already unlinked it (ENOENT): fine
    assert!(d.is_unlinked());

    // A new file took the name: `b` (which did not unlink yet) leaves it be.
    let mut c = Segment::create(&path, 4096).unwrap();
    b.unlink().unwrap();
    assert!(b.is_unlinked());
    assert!(path.exists(), "unlink removed a file that is not ours");
    c.unlink().unwrap();
    assert!(!path.exists());
    b.unlink().unwrap();

    let a2 = a;
    a2.region().write_bytes(100, b"still mapped").unwrap();
    let mut buf = [0u8; 12];
    b.region().read_bytes(100, &mut buf).unwrap();
    assert_eq!(&buf, b"still mapped");
}

#[test]
fn segments_in_dev_shm() {
    let Ok(dir) = segment_dir(None) else {
        eprintln!("no usable /dev/shm: skipped");
        return;
    };
    let job = format!("test{}", std::process::id());
    let path = dir.join(segment_file_name(uid(), &job, "n0").unwrap());
    let mut a = Segment::create(&path, 1 << 16).unwrap();
    let b = Segment::open(&path, 1 << 16, Duration::from_secs(1)).unwrap();
    a.region().write_bytes(0, b"shm").unwrap();
    let mut buf = [0u8; 3];
    b.region().read_bytes(0, &mut buf).unwrap();
    assert_eq!(&buf, b"shm");
    assert!(path
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with(&segment_file_prefix(uid(), &job)));
    a.unlink().unwrap();
    assert!(!path.exists());
}

fn header(pid: u64, start: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(b"BTLTEST!");
    h[8..16].copy_from_slice(&pid.to_le_bytes());
    h[16..24].copy_from_slice(&start.to_le_bytes());
    h
}

#[test]
fn remove_stale_removes_dead_creators_only() {
    let tmp = TempDir::new("stale");
    let me = uid();

    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    assert!(!process_alive(dead_pid, 1));

    let my_pid = std::process::id();
    let my_start = process_start_time(my_pid).unwrap();
    assert!(process_alive(my_pid, my_start));
    assert!(!process_alive(my_pid, my_start + 1), "recycled pid");

    let dead = tmp.path().join(format!("btl-{me}-job-dead"));
    let live = tmp.path().join(format!("btl-{me}-job-live"));
    let fresh_unknown = tmp.path().join(format!("btl-{me}-job-fresh"));
    let short = tmp.path().join(format!("btl-{me}-job-short"));
    let other_prefix = tmp.path().join("other-job-dead");
    let other_uid = tmp.path().join(format!("btl-{}-job-dead", me + 1));

    let mut dead_content = header(u64::from(dead_pid), 1).to_vec();
    dead_content.extend_from_slice(&[0; 100]);
    fs::write(&dead, &dead_content).unwrap();
    fs::write(&live, header(u64::from(my_pid), my_start)).unwrap();
    fs::write(&fresh_unknown, header(0, 0)).unwrap();
    fs::write(&short, [1, 2, 3]).unwrap();
    fs::write(&other_prefix, header(u64::from(dead_pid), 1)).unwrap();
    fs::write(&other_uid, header(u64::from(dead_pid), 1)).unwrap();

    let removed = remove_stale(tmp.path(), me).unwrap();
    assert_eq!(removed, vec![dead.clone()]);
    assert!(!dead.exists());
    assert!(live.exists(), "our own live segment was removed");
    assert!(
        fresh_unknown.exists(),
        "young file with unknown creator removed"
    );
    assert!(short.exists(), "young file without header removed");
    assert!(other_prefix.exists(), "file of another prefix removed");
    assert!(other_uid.exists(), "file of another uid removed");

    // A second sweep finds nothing.
    assert!(remove_stale(tmp.path(), me).unwrap().is_empty());

    // Old files whose creator is unknown go (the 60 s rule).
    let old = std::time::SystemTime::now() - Duration::from_secs(120);
    for p in [&fresh_unknown, &short] {
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let mut removed = remove_stale(tmp.path(), me).unwrap();
    removed.sort();
    let mut want = vec![fresh_unknown.clone(), short.clone()];
    want.sort();
    assert_eq!(removed, want);
    assert!(live.exists());
}

#[test]
fn names_are_validated() {
    let me = uid();
    assert_eq!(segment_file_prefix(7, "j"), "btl-7-j-");
    assert_eq!(
        segment_file_name(7, "j.1_x-y", "Node9").unwrap(),
        "btl-7-j.1_x-y-Node9"
    );
    for (job, node) in [
        ("a/b", "n"),
        ("j", "a/b"),
        ("", "n"),
        ("j", ""),
        ("a b", "n"),
        ("j", "n "),
        ("j\0", "n"),
        ("j", "nœud"),
    ] {
        let err = segment_file_name(me, job, node).unwrap_err();
        assert!(
            matches!(err, SegmentError::InvalidName { .. }),
            "{job:?}/{node:?}: {err:?}"
        );
        assert!(!err.to_string().is_empty());
    }
    let long = "x".repeat(200);
    assert!(matches!(
        segment_file_name(me, &long, "n"),
        Err(SegmentError::NameTooLong { .. })
    ));
    let base = format!("btl-{me}-j-");
    let fits = "n".repeat(200 - base.len());
    assert_eq!(segment_file_name(me, "j", &fits).unwrap().len(), 200);
    let over = "n".repeat(201 - base.len());
    assert!(segment_file_name(me, "j", &over).is_err());
}
