//! Shared segments: creation (memory checked, pages reserved, sealed), the
//! rendezvous that hands them to peers (credentials checked), what a peer
//! refuses to map, name validation, and process liveness.

use std::process::Command;
use std::time::Duration;

use btl_linux::segment::{
    available_memory, fetch, process_alive, process_start_time, segment_name, Offer, Segment,
    SegmentError, SEALS,
};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;

fn uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A name no other test (or job) uses.
fn unique(what: &str) -> String {
    segment_name(uid(), &format!("segtest{}", std::process::id()), what).unwrap()
}

/// Creates a segment, offers it, and fetches it as a peer would (from a
/// thread, while this thread serves).
fn create_and_fetch(name: &str, len: usize) -> (Segment, Segment) {
    let a = Segment::create(name, len).unwrap();
    let offer = Offer::new(name).unwrap();
    let peer = {
        let name = name.to_owned();
        std::thread::spawn(move || fetch(&name, Some(std::process::id()), Duration::from_secs(20)))
    };
    while !peer.is_finished() {
        offer.serve(&a);
        std::thread::sleep(Duration::from_millis(1));
    }
    let fd = peer.join().unwrap().unwrap();
    let b = Segment::from_fd(fd, name, len).unwrap();
    (a, b)
}

#[test]
fn create_fetch_and_share_bytes() {
    let name = unique("share");
    let (a, b) = create_and_fetch(&name, 1 << 20);
    assert_eq!((a.len(), b.len()), (1 << 20, 1 << 20));
    assert_eq!(b.name(), name);
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

    // The memfd has no path: nothing named after it in /dev/shm.
    assert!(!std::path::Path::new("/dev/shm").join(&name).exists());
}

#[test]
fn segments_cannot_shrink_but_may_grow() {
    let name = unique("seals");
    let (a, b) = create_and_fetch(&name, 64 * 1024);
    let fd = b.fd();
    assert_eq!(rustix::fs::fcntl_get_seals(fd).unwrap(), SEALS);
    // What a hostile process of our user would try, through its own
    // descriptor of the file: refused, so no page of ours can vanish.
    assert_eq!(rustix::fs::ftruncate(fd, 0), Err(Errno::PERM));
    assert_eq!(rustix::fs::ftruncate(fd, 4096), Err(Errno::PERM));
    assert_eq!(
        rustix::fs::fcntl_add_seals(fd, SealFlags::WRITE),
        Err(Errno::PERM),
        "nobody adds seals"
    );
    // Growing is allowed (a segment that grows as it is used), and the
    // mappings are unaffected.
    rustix::fs::ftruncate(fd, 128 * 1024).unwrap();
    a.region().write_bytes(0, b"still here").unwrap();
    let mut buf = [0u8; 10];
    b.region().read_bytes(0, &mut buf).unwrap();
    assert_eq!(&buf, b"still here");
}

#[test]
fn a_peer_refuses_descriptors_it_cannot_trust() {
    let name = unique("refuse");
    // A memfd without seals: it could be truncated under us.
    let loose =
        rustix::fs::memfd_create("loose", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&loose, 8192).unwrap();
    let err = Segment::from_fd(loose, &name, 4096).unwrap_err();
    assert!(matches!(err, SegmentError::Unsafe { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not sealed against shrinking"),
        "{err}"
    );
    // A plain file: no seals at all.
    let path = std::env::temp_dir().join(format!("btl-segtest-{}", std::process::id()));
    std::fs::write(&path, [0u8; 8192]).unwrap();
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let err = Segment::from_fd(file.into(), &name, 4096).unwrap_err();
    assert!(matches!(err, SegmentError::Unsafe { .. }), "{err:?}");
    // A sealed segment smaller than needed.
    let small = Segment::create(&name, 4096).unwrap();
    let dup = rustix::io::fcntl_dupfd_cloexec(small.fd(), 0).unwrap();
    let err = Segment::from_fd(dup, &name, 8192).unwrap_err();
    assert!(
        err.to_string().contains("fewer than the 8192 needed"),
        "{err}"
    );
}

#[test]
fn fetch_checks_who_offers() {
    let name = unique("who");
    let a = Segment::create(&name, 4096).unwrap();
    let offer = Offer::new(&name).unwrap();
    // A second offer of the same name (another job with the same names).
    assert!(matches!(
        Offer::new(&name),
        Err(SegmentError::Exists { .. })
    ));
    // We expect pid 1 to be the creator: the offer is ours, so refused.
    let peer = {
        let name = name.clone();
        std::thread::spawn(move || fetch(&name, Some(1), Duration::from_secs(20)))
    };
    while !peer.is_finished() {
        offer.serve(&a);
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = peer.join().unwrap().unwrap_err();
    assert!(matches!(err, SegmentError::NotOurs { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not by local rank 0 (pid 1"),
        "{err}"
    );
    drop(offer);
    // Nobody offers: a timeout naming the segment.
    let err = fetch(&name, None, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, SegmentError::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains(&name), "{err}");
}

#[test]
fn a_withdrawn_offer_is_no_offer() {
    // The fetch connects into the listener's backlog and waits for an
    // answer; the offer is withdrawn before serving it (or its listening
    // descriptor lived on a moment in a forked child: how CI met this).
    // The reset is "nobody offers", as a refused connection is: the fetch
    // tries again and times out naming the segment, instead of failing at
    // once with a socket error.
    let name = unique("withdrawn");
    let offer = Offer::new(&name).unwrap();
    let peer = {
        let name = name.clone();
        std::thread::spawn(move || fetch(&name, None, Duration::from_millis(600)))
    };
    std::thread::sleep(Duration::from_millis(150));
    drop(offer);
    let err = peer.join().unwrap().unwrap_err();
    assert!(matches!(err, SegmentError::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains(&name), "{err}");
}

#[test]
fn too_little_memory_is_a_clear_error() {
    let Some(available) = available_memory() else {
        panic!("neither /proc/meminfo nor the memory cgroup can be read");
    };
    let needed = available + (1 << 30);
    let Ok(len) = usize::try_from(needed) else {
        return; // cannot even express the size on this target
    };
    let name = unique("nospace");
    let err = Segment::create(&name, len).unwrap_err();
    match &err {
        SegmentError::NoSpace {
            needed: n,
            available: a,
            ..
        } => {
            assert_eq!(*n, needed);
            assert!(*a < *n);
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&needed.to_string()), "{msg}");
    assert!(msg.contains("MiB") && msg.contains(&name), "{msg}");
}

#[test]
fn names_are_validated() {
    let me = uid();
    assert_eq!(
        segment_name(7, "j.1_x-y", "Node9").unwrap(),
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
        let err = segment_name(me, job, node).unwrap_err();
        assert!(
            matches!(err, SegmentError::InvalidName { .. }),
            "{job:?}/{node:?}: {err:?}"
        );
        assert!(!err.to_string().is_empty());
    }
    let long = "x".repeat(200);
    assert!(matches!(
        segment_name(me, &long, "n"),
        Err(SegmentError::NameTooLong { .. })
    ));
    let base = format!("btl-{me}-j-");
    let fits = "n".repeat(200 - base.len());
    assert_eq!(segment_name(me, "j", &fits).unwrap().len(), 200);
    let over = "n".repeat(201 - base.len());
    assert!(segment_name(me, "j", &over).is_err());
    // A long name still gets a rendezvous (its abstract socket name is cut
    // and hashed).
    let long_name = segment_name(me, &"j".repeat(64), &"n".repeat(64)).unwrap();
    let seg = Segment::create(&long_name, 4096).unwrap();
    drop(Offer::new(&long_name).unwrap());
    drop(seg);
}

#[test]
fn liveness_follows_pid_and_start_time() {
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    assert!(!process_alive(dead_pid, 1));

    let my_pid = std::process::id();
    let my_start = process_start_time(my_pid).unwrap();
    assert!(process_alive(my_pid, my_start));
    assert!(!process_alive(my_pid, my_start + 1), "recycled pid");
    assert!(!process_alive(0, 0));
}
