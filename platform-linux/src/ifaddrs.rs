//! The machine's network interfaces, from `getifaddrs(3)` (rustix has no
//! wrapper; this is the one audited use of it, over `libc`).
//!
//! # Safety
//!
//! `getifaddrs` returns a linked list the C library allocated; it is walked
//! read-only, every pointer checked for null before use, socket addresses
//! read only after checking their family (so the cast to `sockaddr_in` /
//! `sockaddr_in6` matches what the kernel wrote), and the list is freed with
//! `freeifaddrs` exactly once, on every path (a guard owns it).
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name (`eth0`).
    pub name: String,
    /// Kernel interface index.
    pub index: u32,
    /// The address.
    pub addr: IpAddr,
    /// Prefix length of its network (from the netmask).
    pub prefix_len: u8,
    /// Interface is up.
    pub up: bool,
    /// Interface is a loopback.
    pub loopback: bool,
}

/// Frees the list on drop.
struct List(*mut libc::ifaddrs);

impl Drop for List {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from a successful getifaddrs and is
            // freed only here, once.
            unsafe { libc::freeifaddrs(self.0) };
        }
    }
}

/// Reads an IPv4 or IPv6 address from a `sockaddr`, `None` for other
/// families or null.
///
/// # Safety
///
/// `sa` is null or points to a socket address the kernel filled in, at
/// least as long as its family's structure.
unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null, points to a sockaddr (caller's contract).
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

fn prefix_len(mask: Option<IpAddr>) -> u8 {
    match mask {
        Some(IpAddr::V4(m)) => u32::from(m).leading_ones() as u8,
        Some(IpAddr::V6(m)) => u128::from(m).leading_ones() as u8,
        None => 0,
    }
}

/// `getifaddrs()` — every IPv4 and IPv6 address of every interface.
///
/// # References
///
/// getifaddrs(3), netdevice(7).
pub fn interfaces() -> io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is owned
    // by the guard below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let list = List(head);
    let mut out = Vec::new();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: non-null node of the list getifaddrs returned, alive
        // until the guard drops.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        // SAFETY: ifa_addr is null or a kernel-filled sockaddr.
        let Some(addr) = (unsafe { ip_of(ifa.ifa_addr) }) else {
            continue;
        };
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: non-null, NUL-terminated name owned by the list.
        let cname = unsafe { CStr::from_ptr(ifa.ifa_name) };
        // SAFETY: the name is a valid C string (above).
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        // SAFETY: ifa_netmask is null or a kernel-filled sockaddr.
        let mask = unsafe { ip_of(ifa.ifa_netmask) };
        let flags = ifa.ifa_flags;
        out.push(IfAddr {
            name: cname.to_string_lossy().into_owned(),
            index,
            addr,
            prefix_len: prefix_len(mask),
            up: flags & libc::IFF_UP as u32 != 0,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed() {
        let ifs = interfaces().unwrap();
        let lo = ifs
            .iter()
            .find(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 on some interface");
        assert!(lo.loopback && lo.up);
        assert_eq!(lo.prefix_len, 8);
        assert!(lo.index > 0);
    }

    #[test]
    fn prefix_lengths() {
        assert_eq!(
            prefix_len(Some(IpAddr::V4(Ipv4Addr::new(255, 255, 255, 0)))),
            24
        );
        assert_eq!(
            prefix_len(Some(IpAddr::V6(Ipv6Addr::from(!0u128 << 64)))),
            64
        );
        assert_eq!(prefix_len(None), 0);
    }
}
