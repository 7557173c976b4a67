//! The transport's configuration: parameters from the environment, the
//! verified parameters it uses, and which addresses to listen on.

use std::net::IpAddr;

use btl_core::params::Params as _;
use btl_core::tcp::params::TcpParams;

use super::*;

/// What the transport needs from the verified parameters.
#[derive(Clone, Copy, Debug)]
pub(super) struct Config {
    pub(super) port_min: u16,
    pub(super) port_range: u16,
    pub(super) port_min6: u16,
    pub(super) port_range6: u16,
    pub(super) nodelay: bool,
    pub(super) sndbuf: usize,
    pub(super) rcvbuf: usize,
    pub(super) cache: usize,
    /// Most bytes corked per connection for write combining (0: off).
    pub(super) combine: usize,
    pub(super) max_frame: u32,
    /// `recv_lowat` (0: off; below 4096 counts as 4096).
    pub(super) recv_lowat: u32,
    pub(super) handshake_ms: u64,
    /// Idle seconds before keep-alive probes (0: off).
    pub(super) keepalive_time: u32,
    /// Seconds between probes.
    pub(super) keepalive_intvl: u32,
    /// Unanswered probes before the connection fails.
    pub(super) keepalive_probes: u32,
    /// `TCP_USER_TIMEOUT` in milliseconds (0: the kernel's default).
    pub(super) user_timeout_ms: u32,
    /// Bounds of the per-peer queue in user space.
    pub(super) limits: QueueLimits,
}

impl Config {
    pub(super) fn from(p: &TcpParams) -> Self {
        use btl_core::tcp::params::IpFamily;
        let (v4, v6) = (p.listen_ports(IpFamily::V4), p.listen_ports(IpFamily::V6));
        let span = |r: &std::ops::RangeInclusive<u16>| {
            r.end().saturating_sub(*r.start()).saturating_add(1)
        };
        let (port_min, port_range) = (*v4.start(), span(&v4));
        let (port_min6, port_range6) = (*v6.start(), span(&v6));
        Self {
            port_min,
            port_range,
            port_min6,
            port_range6,
            nodelay: !p.use_nagle,
            sndbuf: usize::try_from(p.sndbuf).unwrap_or(0),
            rcvbuf: usize::try_from(p.rcvbuf).unwrap_or(0),
            cache: usize::try_from(p.endpoint_cache)
                .unwrap_or(30 * 1024)
                .max(64),
            // Combining corks writes with MSG_MORE and pushes them by
            // setting TCP_NODELAY again: with Nagle's algorithm on, the
            // kernel combines by itself and nothing is corked.
            combine: if p.use_nagle {
                0
            } else {
                usize::try_from(p.write_combine).unwrap_or(0)
            },
            max_frame: p.max_frame(),
            recv_lowat: match p.recv_lowat {
                0 => 0,
                v => v.max(4096),
            },
            handshake_ms: u64::from(p.handshake_timeout),
            keepalive_time: p.keepalive_time,
            keepalive_intvl: p.keepalive_intvl,
            keepalive_probes: p.keepalive_probes,
            user_timeout_ms: p.user_timeout,
            limits: QueueLimits {
                bytes: u64::from(p.queue_bytes),
                messages: p.queue_messages,
            },
        }
    }
}

/// Reads the `tcp` parameters from the environment (`BTL_TCP_*`,
/// `OMPI_MCA_btl_tcp_*`) over the defaults, and verifies them.
pub fn params_from_env() -> Result<TcpParams, TcpError> {
    let mut p = params_from_env_unverified()?;
    p.verify().map_err(|e| TcpError::Param(e.to_string()))?;
    Ok(p)
}

/// The `tcp` parameters from the environment over the defaults, each value
/// checked, the rules between them not yet ([`TcpParams::verify`]).
pub fn params_from_env_unverified() -> Result<TcpParams, TcpError> {
    crate::job::params_from_env_unverified().map_err(|e| TcpError::Param(e.to_string()))
}

/// The addresses to listen on and connect from, one per address family
/// (IPv4 first): `BTL_BIND` if set (one address); else, when
/// `if_include` is given, the IPv4 and (global) IPv6 address of the first
/// interface that interface selection (`btl_core::tcp::ifsel`) picks from
/// the machine's interfaces; else, for a job on one machine, loopback
/// (127.0.0.1 and ::1) — such a job never leaves the machine unless told
/// which interface to use; for a job across machines (`multi_node`), the
/// first interface the selection picks with the default exclusions
/// (`127.0.0.1/8,sppp`). `disable_family` drops a family.
pub fn choose_binds(params: &TcpParams, multi_node: bool) -> Result<Vec<IpAddr>, TcpError> {
    use btl_core::tcp::ifsel::{select, Instance, Interface};
    use btl_core::tcp::params::IpFamily;
    use std::net::{Ipv4Addr, Ipv6Addr};
    if let Ok(b) = std::env::var("BTL_BIND") {
        let ip: IpAddr = b.trim().parse().map_err(|_| {
            TcpError::Param(format!(
                "BTL_BIND={b:?}: accepts an IP address such as 127.0.0.1"
            ))
        })?;
        return Ok(vec![ip]);
    }
    let ifs = crate::ifaddrs::interfaces().map_err(io_err("list the network interfaces"))?;
    let enabled = |ip: &IpAddr| params.family_enabled(IpFamily::of(ip));
    let mut binds = Vec::new();
    if params.if_include().is_empty() && !multi_node {
        let v6_lo = ifs
            .iter()
            .any(|i| i.addr == IpAddr::V6(Ipv6Addr::LOCALHOST));
        binds.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
        if v6_lo {
            binds.push(IpAddr::V6(Ipv6Addr::LOCALHOST));
        }
    } else {
        let list: Vec<Interface<'_>> = ifs
            .iter()
            .map(|i| Interface {
                name: &i.name,
                index: i.index,
                addr: i.addr,
                prefix_len: i.prefix_len,
                up: i.up,
                loopback: i.loopback,
            })
            .collect();
        let mut out = vec![Instance::EMPTY; list.len().max(1) * params.links.max(1) as usize];
        let n = select(&list, params, &mut out, |w| {
            log::warn!("tcp interface selection: {w}")
        })
        .map_err(|e| TcpError::Param(e.to_string()))?;
        let first = out[..n]
            .first()
            .ok_or(TcpError::Param("tcp: no interface selected".into()))?;
        log::debug!("tcp: using interface {} ({})", first.if_name, first.addr);
        binds.extend(first.addr_v4.map(IpAddr::V4));
        // A link-local IPv6 address needs a scope to be reached: skip it.
        binds.extend(
            first
                .addr_v6
                .filter(|a| (a.segments()[0] & 0xffc0) != 0xfe80)
                .map(IpAddr::V6),
        );
    }
    binds.retain(enabled);
    if binds.is_empty() {
        return Err(TcpError::Param(
            "tcp: no address left to listen on (disable_family removed them all)".into(),
        ));
    }
    Ok(binds)
}
