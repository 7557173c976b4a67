//! The syntax of the interface lists (`if_include`, `if_exclude`):
//! comma-separated entries ([`entries`]; surrounding blanks and empty
//! entries ignored), each an interface name prefix (`eth` matches `eth0`)
//! or a CIDR network (`10.0.0.0/8`, `fd00::/8`; host bits may be set, as in
//! the default `127.0.0.1/8`) — [`IfSpec`]. An address without `/prefix`,
//! an unparsable address or a prefix above 32 / 128 is a [`SpecError`], and
//! [`validate_list`] turns it into the parameter's error.
//!
//! The parameters ([`super::params`]) check their lists with it; interface
//! selection ([`super::ifsel`]) matches interfaces with it.

use core::fmt;
use core::net::IpAddr;

pub use crate::params::entries;
use crate::params::{ParamDef, ParamError, ParamName};

/// One parsed entry of `if_include` / `if_exclude`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfSpec<'a> {
    /// An interface name prefix (`eth` matches `eth0`; an exact name
    /// matches itself).
    Name(&'a str),
    /// A network: an interface matches if one of its addresses is inside.
    Cidr {
        /// The network address (host bits may be set).
        addr: IpAddr,
        /// Prefix length, at most 32 (IPv4) or 128 (IPv6).
        prefix_len: u8,
    },
}

/// Why a list entry is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SpecError {
    /// The entry is empty.
    Empty,
    /// An IP address without `/prefix`.
    MissingPrefix,
    /// The part before `/` is not an IPv4 or IPv6 address.
    BadAddress,
    /// The part after `/` is not a number.
    BadPrefix,
    /// The prefix length exceeds the address size.
    PrefixTooLong {
        /// 32 or 128.
        max: u8,
    },
}

impl SpecError {
    /// What is wrong, as a sentence fragment ("empty entry").
    pub const fn message(self) -> &'static str {
        match self {
            SpecError::Empty => "empty entry",
            SpecError::MissingPrefix => "an address needs a /prefix length",
            SpecError::BadAddress => "not an IPv4 or IPv6 address before the `/`",
            SpecError::BadPrefix => "the prefix length after the `/` is not a number",
            SpecError::PrefixTooLong { max: 32 } => "the prefix length is above 32",
            SpecError::PrefixTooLong { max: 128 } => "the prefix length is above 128",
            SpecError::PrefixTooLong { .. } => "the prefix length is above the address size",
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl core::error::Error for SpecError {}

impl<'a> IfSpec<'a> {
    /// Parses one entry (surrounding blanks ignored): with a `/` a CIDR,
    /// otherwise a name prefix — unless it is a bare IP address, which is
    /// [`SpecError::MissingPrefix`].
    pub fn parse(entry: &'a str) -> Result<IfSpec<'a>, SpecError> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(SpecError::Empty);
        }
        if let Some((addr, prefix)) = entry.split_once('/') {
            let addr: IpAddr = addr.trim().parse().map_err(|_| SpecError::BadAddress)?;
            let prefix = prefix.trim();
            if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                return Err(SpecError::BadPrefix);
            }
            let max = match addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            };
            let prefix_len = prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or(SpecError::PrefixTooLong { max })?;
            return Ok(IfSpec::Cidr { addr, prefix_len });
        }
        if entry.parse::<IpAddr>().is_ok() {
            return Err(SpecError::MissingPrefix);
        }
        Ok(IfSpec::Name(entry))
    }

    /// Whether interface name `if_name` starts with this name prefix (never
    /// for a CIDR).
    pub fn matches_name(&self, if_name: &str) -> bool {
        matches!(self, IfSpec::Name(prefix) if if_name.starts_with(prefix))
    }

    /// Whether `addr` lies in this network (never for a name; never across
    /// families).
    pub fn contains(&self, addr: &IpAddr) -> bool {
        let IfSpec::Cidr {
            addr: net,
            prefix_len,
        } = self
        else {
            return false;
        };
        match (net, addr) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(*prefix_len))
                    .unwrap_or(0);
                u32::from(*net) & mask == u32::from(*a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(*prefix_len))
                    .unwrap_or(0);
                u128::from(*net) & mask == u128::from(*a) & mask
            }
            _ => false,
        }
    }
}

/// Checks every entry of `list`, the value of the list parameter `def`;
/// the first malformed one is [`ParamError::BadListEntry`] naming the
/// parameter and what it accepts.
pub fn validate_list(def: &ParamDef, list: &str) -> Result<(), ParamError> {
    for entry in entries(list) {
        IfSpec::parse(entry).map_err(|reason| ParamError::BadListEntry {
            component: def.component,
            name: def.name,
            entry: ParamName::new(entry),
            reason: reason.message(),
            accepts: def.accepts,
        })?;
    }
    Ok(())
}

/// The parsed entries of `list` (validated beforehand: malformed entries
/// are skipped).
pub fn specs(list: &str) -> impl Iterator<Item = IfSpec<'_>> {
    entries(list).filter_map(|e| IfSpec::parse(e).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::table;
    use core::net::{Ipv4Addr, Ipv6Addr};
    use std::string::ToString;
    use std::vec::Vec;

    const V4: fn(u8, u8, u8, u8) -> IpAddr = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));

    #[test]
    fn specs_parse_and_match() {
        assert_eq!(IfSpec::parse(" eth "), Ok(IfSpec::Name("eth")));
        let net = IfSpec::parse("10.0.0.0/8").unwrap();
        assert!(net.contains(&V4(10, 255, 0, 1)) && !net.contains(&V4(11, 0, 0, 1)));
        let v6 = IfSpec::parse("fd00::/8").unwrap();
        assert!(v6.contains(&"fd12::1".parse().unwrap()));
        assert!(!v6.contains(&V4(10, 0, 0, 1)) && !net.matches_name("10.0.0.0"));
        assert!(IfSpec::parse("0.0.0.0/0")
            .unwrap()
            .contains(&V4(1, 2, 3, 4)));
        assert!(IfSpec::parse("::/128")
            .unwrap()
            .contains(&IpAddr::V6(Ipv6Addr::UNSPECIFIED)));
        for (bad, err) in [
            ("10.0.0.0/33", SpecError::PrefixTooLong { max: 32 }),
            ("fd00::/129", SpecError::PrefixTooLong { max: 128 }),
            ("10.0.0/8", SpecError::BadAddress),
            ("10.0.0.0/", SpecError::BadPrefix),
            ("10.0.0.0/-1", SpecError::BadPrefix),
            ("10.0.0.1", SpecError::MissingPrefix),
            ("", SpecError::Empty),
        ] {
            assert_eq!(IfSpec::parse(bad), Err(err), "{bad}");
        }
        assert_eq!(entries(" a,, b ,").collect::<Vec<_>>(), ["a", "b"]);
    }

    static LISTS: [ParamDef; 1] = table(
        "tcp",
        [ParamDef::text("if_exclude", "", 64).doc(1, "a list", "A list.")],
    );

    #[test]
    fn list_errors_name_the_parameter() {
        let def = &LISTS[0];
        assert_eq!(validate_list(def, " eth0, ,10.0.0.0/8,fd00::/8"), Ok(()));
        let e = validate_list(def, "eth0,fd00::/129").unwrap_err();
        assert_eq!(
            e.to_string(),
            std::format!(
                "BTL_TCP_IF_EXCLUDE: malformed entry `fd00::/129` (the prefix length is above \
                 128); it accepts {}",
                def.accepts
            )
        );
        assert_eq!(
            specs("eth0,10.0.0.1,10.0.0.0/8").collect::<Vec<_>>(),
            [
                IfSpec::Name("eth0"),
                IfSpec::Cidr {
                    addr: V4(10, 0, 0, 0),
                    prefix_len: 8
                }
            ]
        );
        assert_eq!(
            SpecError::PrefixTooLong { max: 7 }.to_string(),
            "the prefix length is above the address size"
        );
    }
}
