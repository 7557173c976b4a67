//! The QEMU node's configuration parsers, run on the host: its kernel
//! command line (`platform-baremetal/qemu/src/cmdline.rs`) and the device
//! tree reader that finds it (`fdt.rs`). Both take untrusted bytes: every
//! bad input is a named error or `None`, never a panic.

/// What `cmdline.rs` takes from the image's root module.
pub const PEERS: usize = 4;
/// The image's largest message.
pub const MAX_MESSAGE: usize = 256 * 1024;

#[allow(dead_code, missing_docs)]
#[path = "../qemu/src/cmdline.rs"]
mod cmdline;
#[allow(dead_code, missing_docs)]
#[path = "../qemu/src/fdt.rs"]
mod fdt;

use cmdline::{parse, ArgError, Run};

const GOOD: &str =
    "job=j-1 rank=2 size=3 ip=10.79.0.2/24 peer=0@10.79.0.1:7100 peer=1@10.79.0.1:7101";

#[test]
fn a_good_command_line() {
    let a = parse(GOOD).unwrap();
    assert_eq!(
        (a.job, a.rank, a.size, a.prefix, a.port),
        ("j-1", 2, 3, 24, 7000)
    );
    assert_eq!(a.ip.octets(), [10, 79, 0, 2]);
    assert_eq!(a.peers[1].unwrap().1, 7101);
    assert_eq!(
        (a.run, a.messages, a.max_size, a.max_frame),
        (Run::Stress, 200, MAX_MESSAGE, 131_072)
    );
    let line = format!(
        "{GOOD} run=stress messages=5 max_size=100 seed=9 sizes=8,1024 quick=1 log=debug timeout=5"
    );
    let b = parse(&line).unwrap();
    assert_eq!(
        (b.messages, b.max_size, b.seed, b.quick, b.timeout_s),
        (5, 100, 9, true, 5)
    );
    assert_eq!(&b.sizes[..], &[8, 1024]);
}

#[test]
fn bad_command_lines_are_named() {
    let err = |line: &str| parse(line).map(|_| ()).unwrap_err().to_string();
    assert_eq!(parse("").unwrap_err(), ArgError::Missing("job"));
    assert!(err("job=j rank=0 size=2 ip=10.0.0.1/24").contains("no peer=1@"));
    assert!(err("job=j rank=2 size=2 ip=10.0.0.1/24 peer=0@10.0.0.2:1")
        .contains("rank=2 is not below size=2"));
    let many = (0..17).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    // (what GOOD gets added, what its error names)
    for (extra, names) in [
        ("color=blue", "unknown key \"color\""),
        ("verbose", "not key=value"),
        ("size=9", "size=9"),
        ("ip=10.0.0.300/24", "ip=10.0.0.300/24"),
        ("ip=10.0.0.2/33", "prefix"),
        ("ip=0.0.0.0/8", "unicast"),
        ("peer=1@10.0.0.1:0", "RANK@A.B.C.D:PORT"),
        ("peer=1@10.0.0.1", "RANK@A.B.C.D:PORT"),
        ("peer=7@10.0.0.1:5", "peer=7"),
        ("max_frame=100", "max_frame=100"),
        ("max_size=1000000", "max_size"),
        ("messages=-1", "messages=-1"),
        ("job=a/b", "job=a/b"),
        ("run=bench", "bench in a job of 2 ranks"),
        ("log=loud", "log=loud"),
        (&format!("sizes={many}"), "at most 16"),
    ] {
        let e = err(&format!("{GOOD} {extra}"));
        assert!(e.contains(names), "{extra}: {e}");
    }
}

/// A flattened device tree: `/` with `/chosen` (`bootargs`) and `/cpus`
/// (`timebase-frequency`) and a `/cpus/cpu@0` whose own property of the
/// same name must not be taken for its parent's.
fn blob(bootargs: &str) -> Vec<u8> {
    let mut strings = Vec::new();
    let mut name = |n: &str| {
        let off = strings.len() as u32;
        strings.extend_from_slice(n.as_bytes());
        strings.push(0);
        off
    };
    let (n_boot, n_tb, n_x) = (name("bootargs"), name("timebase-frequency"), name("x"));
    let mut st = Vec::new();
    let word = |st: &mut Vec<u8>, w: u32| st.extend_from_slice(&w.to_be_bytes());
    let pad = |st: &mut Vec<u8>| {
        while st.len() % 4 != 0 {
            st.push(0);
        }
    };
    let begin = |st: &mut Vec<u8>, n: &str| {
        word(st, 1);
        st.extend_from_slice(n.as_bytes());
        st.push(0);
        pad(st);
    };
    let prop = |st: &mut Vec<u8>, off: u32, v: &[u8]| {
        word(st, 3);
        word(st, v.len() as u32);
        word(st, off);
        st.extend_from_slice(v);
        pad(st);
    };
    begin(&mut st, "");
    prop(&mut st, n_x, b"root\0");
    begin(&mut st, "cpus");
    begin(&mut st, "cpu@0");
    prop(&mut st, n_tb, &1u32.to_be_bytes());
    word(&mut st, 2);
    prop(&mut st, n_tb, &10_000_000u32.to_be_bytes());
    word(&mut st, 2);
    begin(&mut st, "chosen");
    let mut v = bootargs.as_bytes().to_vec();
    v.push(0);
    prop(&mut st, n_boot, &v);
    word(&mut st, 2);
    word(&mut st, 2);
    word(&mut st, 9);
    let header = 40u32;
    let off_st = header;
    let off_str = off_st + st.len() as u32;
    let total = off_str + strings.len() as u32;
    let mut b = Vec::new();
    for w in [
        0xd00d_feed,
        total,
        off_st,
        off_str,
        header,
        17,
        16,
        0,
        strings.len() as u32,
        st.len() as u32,
    ] {
        b.extend_from_slice(&u32::to_be_bytes(w));
    }
    b.extend_from_slice(&st);
    b.extend_from_slice(&strings);
    b
}

#[test]
fn device_tree_properties_by_path() {
    let b = blob(GOOD);
    let args = fdt::property(&b, &["chosen"], "bootargs").and_then(fdt::string);
    assert_eq!(args, Some(GOOD));
    let hz = fdt::property(&b, &["cpus"], "timebase-frequency").and_then(fdt::number);
    assert_eq!(hz, Some(10_000_000));
    assert_eq!(
        fdt::property(&b, &[], "x").and_then(fdt::string),
        Some("root")
    );
    assert_eq!(
        fdt::property(&b, &["cpus", "cpu"], "timebase-frequency").and_then(fdt::number),
        Some(1)
    );
    assert_eq!(fdt::property(&b, &["chosen"], "nothing"), None);
    assert_eq!(fdt::property(&b, &["memory"], "bootargs"), None);
}

#[test]
fn a_broken_device_tree_is_none_never_a_panic() {
    let b = blob(GOOD);
    // Every truncation, and every single byte overwritten with 0xff.
    for n in 0..b.len() {
        let _ = fdt::property(&b[..n], &["chosen"], "bootargs");
        let mut c = b.clone();
        c[n] = 0xff;
        let _ = fdt::property(&c, &["chosen"], "bootargs");
        let _ = fdt::property(&c, &["cpus"], "timebase-frequency");
    }
    // Offsets pointing past the end.
    let mut c = b.clone();
    c[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(fdt::property(&c, &["chosen"], "bootargs"), None);
}
