//! Parameter and interface-spec parsing: environment variables (names and
//! values as a user could type them) applied to the `sm` and `tcp`
//! parameters, then verification, segment sizing and interface selection
//! over arbitrary interfaces.
//!
//! Checked, besides "never panics": a refused variable changes nothing; a
//! failing verify leaves the parameters as they were; verify is idempotent
//! (a second call adjusts nothing); every error has a message; a parsed
//! CIDR has a prefix length within its family; selection writes only
//! interfaces that exist, and links within `links`.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use btl_core::sm::params::{calc_sm_max_procs, ParamId, SmParams};
use btl_core::sm::layout::segment_layout;
use btl_core::tcp::ifsel::{entries, select, IfSpec, Instance, Interface};
use btl_core::tcp::params::{TcpParam, TcpParams};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Name {
    /// A parameter of `sm` by index, Open MPI's name or btl's.
    Sm { i: u8, ompi: bool },
    /// A parameter of `tcp` by index.
    Tcp { i: u8, ompi: bool },
    /// A per-interface override: `BTL_TCP_BANDWIDTH_<rest>` or latency.
    Override { latency: bool, rest: String },
    /// Anything.
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Value {
    Int(i64),
    /// A number with a suffix or a sign or blanks, as typed.
    Typed {
        n: u32,
        form: u8,
    },
    Text(String),
}

#[derive(Arbitrary, Debug)]
struct Iface {
    name: u8,
    index: u8,
    v6: bool,
    addr: u128,
    prefix_len: u8,
    up: bool,
    loopback: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    vars: Vec<(Name, Value)>,
    n_local: u8,
    ifaces: Vec<Iface>,
    specs: Vec<String>,
}

const IF_NAMES: [&str; 6] = ["lo", "eth0", "eth1", "eth0:1", "ib0", "enp3s0"];

fn name(n: &Name) -> String {
    match n {
        Name::Sm { i, ompi } => {
            let def = ParamId::ALL[usize::from(*i) % ParamId::ALL.len()].def();
            if *ompi {
                def.ompi_env_name().to_string()
            } else {
                def.env_name().to_string()
            }
        }
        Name::Tcp { i, ompi } => {
            let p = TcpParam::ALL[usize::from(*i) % TcpParam::ALL.len()];
            if *ompi {
                p.ompi_env_name().to_string()
            } else {
                p.env_name().to_string()
            }
        }
        Name::Override { latency, rest } => {
            let kind = if *latency { "LATENCY" } else { "BANDWIDTH" };
            format!("BTL_TCP_{kind}_{rest}")
        }
        Name::Raw(s) => s.clone(),
    }
}

fn value(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::Typed { n, form } => match form % 8 {
            0 => format!("{n}k"),
            1 => format!("{n}M"),
            2 => format!("{n}G"),
            3 => format!("0x{n:x}"),
            4 => format!(" {n} "),
            5 => format!("-{n}"),
            6 => ["true", "false", "yes", "no"][*n as usize % 4].to_string(),
            _ => IF_NAMES[*n as usize % IF_NAMES.len()].to_string() + ",10.0.0.0/8",
        },
        Value::Text(s) => s.clone(),
    }
}

fuzz_target!(|input: Input| {
    let mut sm = SmParams::default();
    let mut tcp = TcpParams::default();
    for (n, v) in input.vars.iter().take(64) {
        let (var, val) = (name(n), value(v));
        let before = sm;
        match sm.set_from_env_var(&var, &val) {
            Ok(_) => {}
            Err(e) => {
                assert!(!e.to_string().is_empty());
                assert_eq!(
                    sm, before,
                    "a refused {var}={val:?} changed the sm parameters"
                );
            }
        }
        let before = tcp.clone();
        if let Err(e) = tcp.set_from_env_var(&var, &val) {
            assert!(!e.to_string().is_empty());
            assert_eq!(
                tcp, before,
                "a refused {var}={val:?} changed the tcp parameters"
            );
        }
    }

    // sm: verify, idempotence, sizing.
    let before = sm;
    match sm.verify() {
        Ok(_) => {
            let once = sm;
            let again = sm.verify().expect("verify failed on verified parameters");
            assert!(
                again.is_empty(),
                "second verify adjusted {:?}",
                again.adjustments()
            );
            assert_eq!(sm, once);
            let n_local = u32::from(input.n_local % 64) + 1;
            if let Ok(max_procs) = calc_sm_max_procs(&sm, n_local) {
                assert!(max_procs >= n_local);
                if let Ok(layout) = segment_layout(&sm, max_procs.min(256)) {
                    assert!(layout.part_bytes > 0);
                    assert!(layout.total_bytes >= layout.part_bytes);
                }
            }
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(sm, before, "a failing verify changed the parameters");
        }
    }

    // tcp: verify, idempotence.
    let before = tcp.clone();
    match tcp.verify() {
        Ok(_) => {
            let once = tcp.clone();
            let again = tcp.verify().expect("verify failed on verified parameters");
            assert!(again.is_empty(), "second verify adjusted something");
            assert_eq!(tcp, once);
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(tcp, before, "a failing verify changed the parameters");
        }
    }

    // Interface specs, as typed.
    for s in input.specs.iter().take(16) {
        for entry in entries(s) {
            match IfSpec::parse(entry) {
                Ok(IfSpec::Cidr { addr, prefix_len }) => {
                    let max = if addr.is_ipv4() { 32 } else { 128 };
                    assert!(prefix_len <= max);
                    assert!(IfSpec::Cidr { addr, prefix_len }.contains(&addr));
                }
                Ok(IfSpec::Name(n)) => {
                    assert!(!n.is_empty());
                    assert!(IfSpec::Name(n).matches_name(n));
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }

    // Selection over arbitrary interfaces.
    let ifaces: Vec<Interface<'_>> = input
        .ifaces
        .iter()
        .take(8)
        .map(|i| Interface {
            name: IF_NAMES[usize::from(i.name) % IF_NAMES.len()],
            index: u32::from(i.index % 4),
            addr: if i.v6 {
                IpAddr::V6(Ipv6Addr::from(i.addr))
            } else {
                IpAddr::V4(Ipv4Addr::from(i.addr as u32))
            },
            prefix_len: i.prefix_len,
            up: i.up,
            loopback: i.loopback,
        })
        .collect();
    let cap = ifaces.len() * (tcp.links.min(4) as usize);
    let mut out = vec![
        Instance {
            if_name: "",
            index: 0,
            addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            addr_v4: None,
            addr_v6: None,
            link: 0,
            bandwidth: 0,
            latency: 0,
        };
        cap
    ];
    match select(&ifaces, &tcp, &mut out, |w| {
        let _ = w.to_string();
    }) {
        Ok(n) => {
            assert!(n <= out.len());
            for inst in &out[..n] {
                assert!(ifaces.iter().any(|i| i.name == inst.if_name));
                assert!(inst.link < tcp.links);
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
