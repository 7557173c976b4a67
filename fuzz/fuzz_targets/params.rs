//! Parameter and interface-spec parsing through the shared registry
//! (`btl_core::params`): settings (environment variables as a user could
//! type them, the same under "code wins", and typed or textual settings
//! from code) applied to the `sm` and `tcp` parameters, then verification,
//! segment sizing and interface selection over arbitrary interfaces.
//!
//! Checked, besides "never panics": a refused setting changes nothing; an
//! environment value that code's value wins over changes nothing, and a
//! value set by code stays; a failing verify leaves the parameters as they
//! were; verify is idempotent (a second call adjusts nothing); every value
//! the listing shows that was set (not adjusted) is accepted by its
//! definition; every error has a message; a parsed CIDR has a prefix length
//! within its family; selection writes only interfaces that exist, and
//! links within `links`.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use std::fmt::Debug;

use arbitrary::Arbitrary;
use btl_core::params::{EnvApplied, ParamDef, ParamKey, ParamSource, Params, Value as Typed};
use btl_core::sm::layout::{calc_sm_max_procs, segment_layout};
use btl_core::sm::params::{ParamId, SmParams};
use btl_core::tcp::iflist::{entries, IfSpec};
use btl_core::tcp::ifsel::{select, Instance, Interface};
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

/// How a setting is made.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Via {
    /// `set_from_env_var` (the value replaces any).
    Env,
    /// `apply_env_var` (a value set by code wins).
    EnvUnderCode,
    /// From code, by parameter name (typed when the value is `Int`).
    Code,
}

#[derive(Arbitrary, Debug)]
struct Input {
    vars: Vec<(Name, Value, Via)>,
    n_local: u8,
    ifaces: Vec<Iface>,
    specs: Vec<String>,
}

const IF_NAMES: [&str; 6] = ["lo", "eth0", "eth1", "eth0:1", "ib0", "enp3s0"];

/// The table parameter `n` names, if it names one.
fn def(n: &Name) -> Option<&'static ParamDef> {
    match n {
        Name::Sm { i, .. } => Some(ParamId::ALL[usize::from(*i) % ParamId::ALL.len()].def()),
        Name::Tcp { i, .. } => Some(TcpParam::ALL[usize::from(*i) % TcpParam::ALL.len()].def()),
        Name::Override { .. } | Name::Raw(_) => None,
    }
}

/// The environment variable for `n`.
fn name(n: &Name) -> String {
    match (n, def(n)) {
        (Name::Sm { ompi: true, .. } | Name::Tcp { ompi: true, .. }, Some(def)) => {
            def.ompi_env_name().to_string()
        }
        (_, Some(def)) => def.env_name().to_string(),
        (Name::Override { latency, rest }, None) => {
            let kind = if *latency { "LATENCY" } else { "BANDWIDTH" };
            format!("BTL_TCP_{kind}_{rest}")
        }
        (_, None) => param_name(n),
    }
}

/// The parameter name for `n`, as code names it.
fn param_name(n: &Name) -> String {
    match (n, def(n)) {
        (_, Some(def)) => def.name.to_string(),
        (Name::Override { latency, rest }, None) => {
            let kind = if *latency { "latency" } else { "bandwidth" };
            format!("{kind}_{rest}")
        }
        (Name::Raw(s), None) => s.clone(),
        (Name::Sm { .. } | Name::Tcp { .. }, None) => unreachable!("table parameters have a def"),
    }
}

/// Applies one setting to `p`, checking that a refused one, or one that
/// code's value wins over, changes nothing.
fn apply<P: Params + Clone + PartialEq + Debug>(p: &mut P, n: &Name, v: &Value, via: Via) {
    let before = p.clone();
    let (what, refused) = match via {
        Via::Env => {
            let (var, val) = (name(n), value(v));
            let r = p.set_from_env_var(&var, &val);
            (format!("{var}={val:?}"), r.err())
        }
        Via::EnvUnderCode => {
            let (var, val) = (name(n), value(v));
            match p.apply_env_var(&var, &val) {
                Ok(EnvApplied::Set) => (String::new(), None),
                Ok(EnvApplied::NotOurs | EnvApplied::KeptCode) => {
                    assert_eq!(*p, before, "{var}={val:?} under code changed something");
                    (String::new(), None)
                }
                Err(e) => (format!("{var}={val:?}"), Some(e)),
            }
        }
        Via::Code => {
            let name = param_name(n);
            let r = match v {
                Value::Int(i) => p.set_typed(&name, Typed::Int(*i), ParamSource::Code),
                _ => p.set(&name, &value(v), ParamSource::Code),
            };
            (format!("code {name}={v:?}"), r.err())
        }
    };
    if let Some(e) = refused {
        assert!(!e.to_string().is_empty());
        assert_eq!(*p, before, "a refused {what} changed the parameters");
    }
}

/// Every value the listing shows as set (from the environment or code, and
/// not changed by verify since) is accepted by its definition.
fn check_listing<P: Params>(p: &P) {
    for info in p.iter() {
        if info.source != ParamSource::Default && !info.adjusted {
            assert!(
                info.def.validate(info.value).is_ok(),
                "{} = {} was accepted but is not valid",
                info.def.name,
                info.value
            );
        }
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
    for (n, v, via) in input.vars.iter().take(64) {
        apply(&mut sm, n, v, *via);
        apply(&mut tcp, n, v, *via);
    }
    check_listing(&sm);
    check_listing(&tcp);

    // sm: verify, idempotence, sizing.
    let before = sm;
    match sm.verify() {
        Ok(_) => {
            let once = sm;
            let again = sm.verify().expect("verify failed on verified parameters");
            assert!(
                again.is_empty(),
                "second verify adjusted {:?}",
                again.adjustments().collect::<Vec<_>>()
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
    let mut out = vec![Instance::EMPTY; cap];
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
