//! Interface selection for the TCP transport, as pure logic: a list of
//! interface addresses ([`Interface`], what `getifaddrs` gives on Linux or a
//! static list on bare metal) and the [`TcpParams`] in, TCP instances
//! ([`Instance`]) and typed [`Warning`]s out ([`select`]). It re-designs the
//! seed's `mca_btl_tcp_component_create_instances`, `split_and_resolve` and
//! `mca_btl_tcp_create`.
//!
//! # Rules
//!
//! - **Interfaces** are grouped by kernel index: one group per index, named
//!   after its first entry, whatever number of addresses (and Linux alias
//!   labels such as `eth0:1`) it has. Entries with index 0 (unknown, as on
//!   a static list) are grouped by name instead. A group is *usable* when
//!   one of its entries is up and has an address of a family that
//!   `disable_family` leaves on; only those addresses are used.
//! - **One instance per usable interface and link**, as the seed creates one
//!   module per kernel index (not per address family): an interface with
//!   IPv4 and IPv6 addresses is one instance carrying both
//!   ([`Instance::addr_v4`], [`Instance::addr_v6`]; [`Instance::addr`]
//!   prefers IPv4); [`addresses`] lists all of them for the address
//!   exchange. Instances come in the order of the interface list.
//! - **List entries** (`if_include`, `if_exclude`; their syntax is
//!   [`super::iflist`]'s) are name prefixes (`eth` matches `eth0` and
//!   `eth1`; any entry name of the group counts) or CIDR networks
//!   (`10.0.0.0/8`, `fd00::/8`). A malformed entry is an error naming the
//!   variable ([`ParamError::BadListEntry`]), checked before anything else.
//! - **`if_include` given** (at least one entry): exactly the usable
//!   interfaces it matches, in include mode a CIDR matching only addresses
//!   of an enabled family. `if_exclude` is then ignored unless it is not
//!   its default, which is an error (the two are mutually exclusive, as the
//!   seed's open checks). Every include entry that matches no interface is
//!   a [`Warning::Unresolvable`]; an interface it matches that is down or
//!   has no address of an enabled family is a [`Warning::NotUsable`]; if
//!   nothing at all is selected it is [`SelectError::NothingSelected`]
//!   naming `BTL_TCP_IF_INCLUDE`. (The seed fails on an include *name* that
//!   does not exist; here it is a warning, so that one list such as
//!   `eth0,ib0` can serve nodes that have only one of them.)
//! - **Otherwise** every usable interface not matched by `if_exclude` (a
//!   CIDR here matches any address of the interface, whatever its family or
//!   state, so excluding `127.0.0.1/8` also drops the `::1` of `lo`). While
//!   `if_exclude` has its default value, interfaces flagged loopback (or
//!   with a loopback address) are excluded too — the default's
//!   `127.0.0.1/8` stands for "the loopback" —, except when they are the
//!   only usable interfaces: then they are used, with a
//!   [`Warning::LoopbackOnly`] each. A user-set `if_exclude` replaces the
//!   default entirely, as in the seed (the loopback is then used unless
//!   listed). Unfound exclude entries are warned about only with
//!   `warn_all_unfound_interfaces` (names and CIDRs alike). Nothing left is
//!   [`SelectError::NothingSelected`].
//! - **Links**: `links` instances per interface. Link 0 has the interface's
//!   bandwidth and latency (`bandwidth_<if>` / `latency_<if>` overrides,
//!   else the `bandwidth` / `latency` parameters); each further link halves
//!   the bandwidth and doubles the latency of the previous one (100, 50, 25
//!   Mbps; 100, 200, 400 µs — the seed applies its `>>= 1` / `<<= 1` once to
//!   every link > 0, as each starts from a copy of the template module);
//!   then a per-link override `bandwidth_<if>:<n>` / `latency_<if>:<n>`
//!   replaces the value of link `n`. Overrides match the interface name
//!   ASCII case-insensitively; one naming no interface of the list, or a
//!   link >= `links`, is a [`Warning::UnusedOverride`].

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::iflist::{entries, specs, validate_list, IfSpec};
use super::params::{
    IfOverride, IpFamily, OverrideKind, TcpParamId, TcpParams, TextParamId, DEFAULT_IF_EXCLUDE,
};
use crate::params::ParamError;

/// One address of a network interface (an interface with several addresses
/// appears once per address, as `getifaddrs` lists it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interface<'a> {
    /// Interface name (`eth0`; Linux alias labels like `eth0:1` share the
    /// kernel index of `eth0`).
    pub name: &'a str,
    /// Kernel interface index (0 = unknown: such entries are grouped by
    /// name).
    pub index: u32,
    /// The address.
    pub addr: IpAddr,
    /// Network prefix length of the address.
    pub prefix_len: u8,
    /// Whether the interface is up (`IFF_UP`).
    pub up: bool,
    /// Whether it is a loopback interface (`IFF_LOOPBACK`).
    pub loopback: bool,
}

/// One TCP instance (the seed's module): an interface and a link number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance<'a> {
    /// Interface name (of the interface's first entry).
    pub if_name: &'a str,
    /// Kernel interface index.
    pub index: u32,
    /// The preferred address: [`Instance::addr_v4`] if any, else
    /// [`Instance::addr_v6`].
    pub addr: IpAddr,
    /// The interface's first IPv4 address, if IPv4 is enabled and it has
    /// one.
    pub addr_v4: Option<Ipv4Addr>,
    /// The interface's first IPv6 address that is not link-local, else its
    /// first link-local one, if IPv6 is enabled and it has one.
    pub addr_v6: Option<Ipv6Addr>,
    /// Link number, 0 to `links - 1`.
    pub link: u32,
    /// Bandwidth in Mbps.
    pub bandwidth: u32,
    /// Latency in microseconds.
    pub latency: u32,
}

impl Instance<'_> {
    /// An unset entry (no interface, unspecified address, all zero): what
    /// the slots of an output buffer for [`select`] may start as.
    pub const EMPTY: Instance<'static> = Instance {
        if_name: "",
        index: 0,
        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        addr_v4: None,
        addr_v6: None,
        link: 0,
        bandwidth: 0,
        latency: 0,
    };
}

/// Why an interface that `if_include` names is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum NotUsable {
    /// It is down.
    Down,
    /// It has no address of a family that `disable_family` leaves on.
    FamilyDisabled,
}

/// Why a per-interface override applies to nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum UnusedReason {
    /// No interface of the list has that name.
    NoSuchInterface,
    /// The link number is >= `links`.
    NoSuchLink {
        /// The `links` parameter.
        links: u32,
    },
}

/// Something worth telling the user; selection went on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warning<'a> {
    /// A list entry matches no interface (always reported for
    /// `if_include`; for `if_exclude` only with
    /// `warn_all_unfound_interfaces`).
    Unresolvable {
        /// The list.
        param: TextParamId,
        /// The entry, as written.
        entry: &'a str,
    },
    /// An interface `if_include` selects cannot be used.
    NotUsable {
        /// Interface name.
        name: &'a str,
        /// Why.
        reason: NotUsable,
    },
    /// The loopback interface is used because it is the only usable one
    /// (the default `if_exclude` would drop it).
    LoopbackOnly {
        /// Interface name.
        name: &'a str,
    },
    /// A per-interface override applies to nothing.
    UnusedOverride {
        /// The override.
        over: &'a IfOverride,
        /// Why.
        reason: UnusedReason,
    },
}

impl fmt::Display for Warning<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let include = TextParamId::IfInclude.def().env_name();
        match self {
            Warning::Unresolvable { param, entry } => write!(
                f,
                "{}: no network interface matches `{entry}`; ignoring it",
                param.def().env_name()
            ),
            Warning::NotUsable {
                name,
                reason: NotUsable::Down,
            } => write!(
                f,
                "interface {name} matches {include} but is down; not using it"
            ),
            Warning::NotUsable {
                name,
                reason: NotUsable::FamilyDisabled,
            } => write!(
                f,
                "interface {name} matches {include} but has no address of an enabled family \
                 ({}); not using it",
                TcpParamId::DisableFamily.def().env_name()
            ),
            Warning::LoopbackOnly { name } => write!(
                f,
                "using the loopback interface {name}: it is the only usable interface (set \
                 {include} to choose)"
            ),
            Warning::UnusedOverride {
                over,
                reason: UnusedReason::NoSuchInterface,
            } => write!(
                f,
                "{}: no network interface is named `{}`; ignoring it",
                over.env_name(),
                over.if_name()
            ),
            Warning::UnusedOverride {
                over,
                reason: UnusedReason::NoSuchLink { links },
            } => write!(
                f,
                "{}: there are only {links} links per interface ({}); ignoring it",
                over.env_name(),
                TcpParamId::Links.def().env_name()
            ),
        }
    }
}

/// Why no instance could be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SelectError {
    /// A parameter is invalid (malformed list entry, `if_include` with a
    /// non-default `if_exclude`, `links` 0).
    #[error(transparent)]
    Param(ParamError),
    /// No interface is selected. `param` is the list that left nothing:
    /// `if_include` when given, else `if_exclude` when it excluded every
    /// usable interface; `None` when no interface is usable at all.
    #[error("{}", NothingSelected(*.param))]
    NothingSelected {
        /// The list responsible, if any.
        param: Option<TextParamId>,
    },
    /// `out` is too small for the selected instances.
    #[error("{needed} TCP instances selected but room for only {capacity}")]
    OutputFull {
        /// Instances selected (interfaces × `links`).
        needed: usize,
        /// Length of `out`.
        capacity: usize,
    },
}

wrap_from!(SelectError { Param(ParamError) });

/// What a [`SelectError::NothingSelected`] says: which list left nothing.
struct NothingSelected(Option<TextParamId>);

impl fmt::Display for NothingSelected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(TextParamId::IfInclude) => write!(
                f,
                "{} selects no usable network interface (up, with an address of an enabled \
                 family)",
                TextParamId::IfInclude.def().env_name()
            ),
            Some(TextParamId::IfExclude) => write!(
                f,
                "{} excludes every usable network interface",
                TextParamId::IfExclude.def().env_name()
            ),
            None => f.write_str(
                "no usable network interface (none is up with an address of an enabled family)",
            ),
        }
    }
}

/// Whether two entries belong to the same interface: same kernel index, or
/// same name when neither has an index.
fn same_iface(a: &Interface<'_>, b: &Interface<'_>) -> bool {
    if a.index != 0 || b.index != 0 {
        a.index == b.index
    } else {
        a.name == b.name
    }
}

/// One interface: every entry of `all` that belongs with `first`.
#[derive(Clone, Copy)]
struct Group<'a> {
    all: &'a [Interface<'a>],
    first: &'a Interface<'a>,
}

impl<'a> Group<'a> {
    /// The groups of `all`, in the order of their first entries.
    fn all(all: &'a [Interface<'a>]) -> impl Iterator<Item = Group<'a>> + 'a {
        all.iter().enumerate().filter_map(move |(i, first)| {
            let earlier = all.get(..i).unwrap_or(&[]);
            (!earlier.iter().any(|e| same_iface(e, first))).then_some(Group { all, first })
        })
    }

    fn members(self) -> impl Iterator<Item = &'a Interface<'a>> {
        let first = self.first;
        self.all.iter().filter(move |m| same_iface(m, first))
    }

    /// Entries that are up with an address of an enabled family.
    fn usable(self, params: &'a TcpParams) -> impl Iterator<Item = &'a Interface<'a>> {
        self.members()
            .filter(move |m| m.up && params.family_enabled(IpFamily::of(&m.addr)))
    }

    fn is_usable(self, params: &'a TcpParams) -> bool {
        self.usable(params).next().is_some()
    }

    fn is_loopback(self) -> bool {
        self.members().any(|m| m.loopback || m.addr.is_loopback())
    }

    fn name_matches(self, spec: &IfSpec<'_>) -> bool {
        self.members().any(|m| spec.matches_name(m.name))
    }

    /// Include rule: a name prefix, or a CIDR holding an address of an
    /// enabled family.
    fn include_matches(self, spec: &IfSpec<'_>, params: &TcpParams) -> bool {
        self.name_matches(spec)
            || self
                .members()
                .any(|m| params.family_enabled(IpFamily::of(&m.addr)) && spec.contains(&m.addr))
    }

    /// Exclude rule: a name prefix, or a CIDR holding any of its addresses.
    fn exclude_matches(self, spec: &IfSpec<'_>) -> bool {
        self.name_matches(spec) || self.members().any(|m| spec.contains(&m.addr))
    }
}

/// The selection rules, fixed for one call of [`select`].
struct Rules<'a> {
    params: &'a TcpParams,
    include_mode: bool,
    default_exclude: bool,
    /// Only the (otherwise excluded) loopback interfaces are usable.
    loopback_only: bool,
}

impl<'a> Rules<'a> {
    fn selected(&self, g: Group<'a>) -> bool {
        if !g.is_usable(self.params) {
            return false;
        }
        if self.loopback_only {
            return g.is_loopback();
        }
        if self.include_mode {
            specs(self.params.if_include()).any(|s| g.include_matches(&s, self.params))
        } else {
            let excluded = specs(self.params.if_exclude()).any(|s| g.exclude_matches(&s))
                || (self.default_exclude && g.is_loopback());
            !excluded
        }
    }
}

/// `v << n`, saturating at `u32::MAX`.
fn shl_saturating(v: u32, n: u32) -> u32 {
    if v == 0 {
        0
    } else if n > v.leading_zeros() {
        u32::MAX
    } else {
        v << n
    }
}

/// Selects the TCP instances for the interfaces `ifaces` under `params` (see
/// the module documentation for the rules), writes them to the start of
/// `out` and returns how many; warnings go to `warn` as they are found.
///
/// Errors, before anything is written: a malformed list entry, `if_include`
/// with a non-default `if_exclude`, or `links` 0 ([`SelectError::Param`],
/// naming the variable); nothing selected
/// ([`SelectError::NothingSelected`]); `out` shorter than interfaces ×
/// `links` ([`SelectError::OutputFull`]).
pub fn select<'a>(
    ifaces: &'a [Interface<'a>],
    params: &'a TcpParams,
    out: &mut [Instance<'a>],
    mut warn: impl FnMut(Warning<'a>),
) -> Result<usize, SelectError> {
    params.check_exclusive()?;
    validate_list(TextParamId::IfInclude.def(), params.if_include())?;
    validate_list(TextParamId::IfExclude.def(), params.if_exclude())?;
    let links = params.links;
    if links == 0 {
        return Err(SelectError::Param(TcpParamId::Links.def().out_of_range(0)));
    }

    for over in params.overrides() {
        let reason = if !ifaces
            .iter()
            .any(|i| i.name.eq_ignore_ascii_case(over.if_name()))
        {
            Some(UnusedReason::NoSuchInterface)
        } else {
            over.link()
                .filter(|&l| l >= links)
                .map(|_| UnusedReason::NoSuchLink { links })
        };
        if let Some(reason) = reason {
            warn(Warning::UnusedOverride { over, reason });
        }
    }

    let mut rules = Rules {
        params,
        include_mode: entries(params.if_include()).next().is_some(),
        default_exclude: params.if_exclude() == DEFAULT_IF_EXCLUDE,
        loopback_only: false,
    };

    if rules.include_mode {
        for entry in entries(params.if_include()) {
            let Ok(spec) = IfSpec::parse(entry) else {
                continue;
            };
            if !Group::all(ifaces).any(|g| g.include_matches(&spec, params)) {
                warn(Warning::Unresolvable {
                    param: TextParamId::IfInclude,
                    entry,
                });
            }
        }
        for g in Group::all(ifaces) {
            if specs(params.if_include()).any(|s| g.include_matches(&s, params))
                && !g.is_usable(params)
            {
                let reason = if g
                    .members()
                    .any(|m| params.family_enabled(IpFamily::of(&m.addr)))
                {
                    NotUsable::Down
                } else {
                    NotUsable::FamilyDisabled
                };
                warn(Warning::NotUsable {
                    name: g.first.name,
                    reason,
                });
            }
        }
    } else if params.warn_all_unfound_interfaces {
        for entry in entries(params.if_exclude()) {
            let Ok(spec) = IfSpec::parse(entry) else {
                continue;
            };
            if !Group::all(ifaces).any(|g| g.exclude_matches(&spec)) {
                warn(Warning::Unresolvable {
                    param: TextParamId::IfExclude,
                    entry,
                });
            }
        }
    }

    let mut count = Group::all(ifaces).filter(|&g| rules.selected(g)).count();
    let any_usable = Group::all(ifaces).any(|g| g.is_usable(params));
    if count == 0 && !rules.include_mode && rules.default_exclude {
        let usable = || Group::all(ifaces).filter(|g| g.is_usable(params));
        if any_usable && usable().all(|g| g.is_loopback()) {
            rules.loopback_only = true;
            for g in usable() {
                warn(Warning::LoopbackOnly { name: g.first.name });
            }
            count = usable().count();
        }
    }
    if count == 0 {
        let param = if rules.include_mode {
            Some(TextParamId::IfInclude)
        } else if any_usable {
            Some(TextParamId::IfExclude)
        } else {
            None
        };
        return Err(SelectError::NothingSelected { param });
    }

    let per_iface = usize::try_from(links).unwrap_or(usize::MAX);
    let needed = count.saturating_mul(per_iface);
    if needed > out.len() {
        return Err(SelectError::OutputFull {
            needed,
            capacity: out.len(),
        });
    }

    let mut slots = out.iter_mut();
    let mut written = 0;
    for g in Group::all(ifaces).filter(|&g| rules.selected(g)) {
        let addr_v4 = g.usable(params).find_map(|m| match m.addr {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        });
        let v6 = || {
            g.usable(params).filter_map(|m| match m.addr {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            })
        };
        let addr_v6 = v6()
            .find(|a| !a.is_unicast_link_local())
            .or_else(|| v6().next());
        let Some(addr) = addr_v4.map(IpAddr::V4).or(addr_v6.map(IpAddr::V6)) else {
            continue;
        };
        let name = g.first.name;
        let bw0 = params
            .override_value(OverrideKind::Bandwidth, name, None)
            .unwrap_or(params.bandwidth);
        let lat0 = params
            .override_value(OverrideKind::Latency, name, None)
            .unwrap_or(params.latency);
        for link in 0..links {
            let Some(slot) = slots.next() else {
                return Ok(written);
            };
            *slot = Instance {
                if_name: name,
                index: g.first.index,
                addr,
                addr_v4,
                addr_v6,
                link,
                bandwidth: params
                    .override_value(OverrideKind::Bandwidth, name, Some(link))
                    .unwrap_or(bw0.checked_shr(link).unwrap_or(0)),
                latency: params
                    .override_value(OverrideKind::Latency, name, Some(link))
                    .unwrap_or(shl_saturating(lat0, link)),
            };
            written += 1;
        }
    }
    Ok(written)
}

/// Every usable address of the interface of `instance` (entries of `ifaces`
/// with its kernel index — or its name when the index is 0 —, up, of an
/// enabled family): what the address exchange publishes for it.
pub fn addresses<'a>(
    ifaces: &'a [Interface<'a>],
    params: &'a TcpParams,
    instance: &Instance<'a>,
) -> impl Iterator<Item = IpAddr> + 'a {
    let (index, name) = (instance.index, instance.if_name);
    ifaces
        .iter()
        .filter(move |m| {
            let same = if index != 0 || m.index != 0 {
                m.index == index
            } else {
                m.name == name
            };
            same && m.up && params.family_enabled(IpFamily::of(&m.addr))
        })
        .map(|m| m.addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{ParamSource, Params};
    use crate::tcp::iflist::SpecError;
    use std::string::ToString;
    use std::vec::Vec;

    const V4: fn(u8, u8, u8, u8) -> IpAddr = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));

    fn iface(name: &str, index: u32, addr: IpAddr, prefix_len: u8, up: bool) -> Interface<'_> {
        Interface {
            name,
            index,
            addr,
            prefix_len,
            up,
            loopback: name == "lo",
        }
    }

    /// lo 127.0.0.1/8 + ::1, eth0 10.1.2.3/24 + fe80::1/64, eth1
    /// 192.168.5.7/24 (down), ib0 172.16.0.4/16.
    fn fixture() -> [Interface<'static>; 6] {
        [
            iface("lo", 1, V4(127, 0, 0, 1), 8, true),
            iface("lo", 1, IpAddr::V6(Ipv6Addr::LOCALHOST), 128, true),
            iface("eth0", 2, V4(10, 1, 2, 3), 24, true),
            iface("eth0", 2, "fe80::1".parse().unwrap(), 64, true),
            iface("eth1", 3, V4(192, 168, 5, 7), 24, false),
            iface("ib0", 4, V4(172, 16, 0, 4), 16, true),
        ]
    }

    /// Runs selection with room for 8 instances; the names selected (one
    /// per instance) and the warnings.
    fn run<'a>(
        ifaces: &'a [Interface<'a>],
        params: &'a TcpParams,
    ) -> Result<(Vec<Instance<'a>>, Vec<Warning<'a>>), SelectError> {
        let mut out = [Instance::EMPTY; 8];
        let mut warnings = Vec::new();
        let n = select(ifaces, params, &mut out, |w| warnings.push(w))?;
        Ok((out[..n].to_vec(), warnings))
    }

    fn names<'a>(inst: &[Instance<'a>]) -> Vec<&'a str> {
        inst.iter().map(|i| i.if_name).collect()
    }

    fn with(settings: &[(&str, &str)]) -> TcpParams {
        let mut p = TcpParams::new();
        for (name, value) in settings {
            p.set(name, value, ParamSource::Environment).unwrap();
        }
        p
    }

    #[test]
    fn default_selection() {
        let ifs = fixture();
        let p = TcpParams::new();
        let (inst, warnings) = run(&ifs, &p).unwrap();
        assert_eq!(names(&inst), ["eth0", "ib0"]);
        assert!(warnings.is_empty());
        let eth0 = inst[0];
        assert_eq!((eth0.index, eth0.link), (2, 0));
        assert_eq!(eth0.addr, V4(10, 1, 2, 3));
        assert_eq!(eth0.addr_v6, Some("fe80::1".parse().unwrap()));
        assert_eq!((eth0.bandwidth, eth0.latency), (100, 100));
        let all: Vec<_> = addresses(&ifs, &p, &eth0).collect();
        assert_eq!(all, [ifs[2].addr, ifs[3].addr]);
    }

    #[test]
    fn include_by_name_and_cidr() {
        let ifs = fixture();
        let p = with(&[("if_include", "eth")]);
        let (inst, warnings) = run(&ifs, &p).unwrap();
        assert_eq!(names(&inst), ["eth0"]);
        assert_eq!(
            warnings,
            [Warning::NotUsable {
                name: "eth1",
                reason: NotUsable::Down
            }]
        );
        assert_eq!(
            warnings[0].to_string(),
            "interface eth1 matches BTL_TCP_IF_INCLUDE but is down; not using it"
        );
        let p = with(&[("if_include", "ib0, 10.1.2.0/24")]);
        assert_eq!(names(&run(&ifs, &p).unwrap().0), ["eth0", "ib0"]);
        let p = with(&[("if_include", "172.16.0.0/12")]);
        assert_eq!(names(&run(&ifs, &p).unwrap().0), ["ib0"]);
    }

    #[test]
    fn exclude_by_cidr_replaces_the_default() {
        let ifs = fixture();
        let p = with(&[("if_exclude", "10.0.0.0/8")]);
        // A user-set exclude list replaces the default: lo is usable again.
        assert_eq!(names(&run(&ifs, &p).unwrap().0), ["lo", "ib0"]);
        let p = with(&[("if_exclude", "10.0.0.0/8,127.0.0.1/8")]);
        assert_eq!(names(&run(&ifs, &p).unwrap().0), ["ib0"]);
        let p = with(&[("if_exclude", "lo,eth,ib")]);
        assert_eq!(
            run(&ifs, &p).unwrap_err(),
            SelectError::NothingSelected {
                param: Some(TextParamId::IfExclude)
            }
        );
    }

    #[test]
    fn include_and_exclude_conflict() {
        let ifs = fixture();
        let p = with(&[("if_include", "eth0"), ("if_exclude", "ib0")]);
        let e = run(&ifs, &p).unwrap_err();
        assert!(matches!(
            e,
            SelectError::Param(ParamError::Conflict {
                name: "if_include",
                ..
            })
        ));
        assert!(e
            .to_string()
            .starts_with("BTL_TCP_IF_INCLUDE conflicts with BTL_TCP_IF_EXCLUDE"));
    }

    #[test]
    fn loopback() {
        let ifs = fixture();
        // Only lo is up (eth1 is down): lo is used, with a warning.
        let only = [ifs[0], ifs[1], ifs[4]];
        let p = TcpParams::new();
        let (inst, warnings) = run(&only, &p).unwrap();
        assert_eq!(names(&inst), ["lo"]);
        assert_eq!(warnings, [Warning::LoopbackOnly { name: "lo" }]);
        assert_eq!(inst[0].addr_v6, Some(Ipv6Addr::LOCALHOST));
        // Explicitly included, by name or CIDR.
        for inc in ["lo", "127.0.0.0/8"] {
            let p = with(&[("if_include", inc)]);
            let (inst, warnings) = run(&ifs, &p).unwrap();
            assert_eq!(names(&inst), ["lo"], "{inc}");
            assert!(warnings.is_empty());
        }
        // Nothing up at all.
        assert_eq!(
            run(&ifs[4..5], &p).unwrap_err(),
            SelectError::NothingSelected { param: None }
        );
    }

    #[test]
    fn disable_family() {
        let ifs = fixture();
        let p = with(&[("disable_family", "4")]);
        let (inst, _) = run(&ifs, &p).unwrap();
        assert_eq!(names(&inst), ["eth0"], "ib0 has only IPv4");
        assert_eq!(inst[0].addr, "fe80::1".parse::<IpAddr>().unwrap());
        assert_eq!(inst[0].addr_v4, None);
        let p = with(&[("disable_family", "6")]);
        let (inst, _) = run(&ifs, &p).unwrap();
        assert_eq!(names(&inst), ["eth0", "ib0"]);
        assert_eq!((inst[0].addr, inst[0].addr_v6), (V4(10, 1, 2, 3), None));
        // Include of an interface left without an enabled family.
        let p = with(&[("disable_family", "4"), ("if_include", "eth0,ib0")]);
        let (inst, warnings) = run(&ifs, &p).unwrap();
        assert_eq!(names(&inst), ["eth0"]);
        assert_eq!(
            warnings,
            [Warning::NotUsable {
                name: "ib0",
                reason: NotUsable::FamilyDisabled
            }]
        );
    }

    #[test]
    fn links_and_overrides() {
        let ifs = fixture();
        let p = with(&[("links", "3"), ("if_include", "eth0")]);
        let (inst, _) = run(&ifs, &p).unwrap();
        let bw: Vec<_> = inst
            .iter()
            .map(|i| (i.link, i.bandwidth, i.latency))
            .collect();
        assert_eq!(bw, [(0, 100, 100), (1, 50, 200), (2, 25, 400)]);

        let p = with(&[
            ("links", "2"),
            ("bandwidth_ETH0", "1000"),
            ("latency_ib0", "7"),
            ("bandwidth_eth0:1", "42"),
            ("latency_ib0:0", "3"),
            ("bandwidth_eth9", "1"),
            ("latency_eth0:2", "1"),
        ]);
        let (inst, warnings) = run(&ifs, &p).unwrap();
        let got: Vec<_> = inst
            .iter()
            .map(|i| (i.if_name, i.link, i.bandwidth, i.latency))
            .collect();
        assert_eq!(
            got,
            [
                ("eth0", 0, 1000, 100),
                ("eth0", 1, 42, 200),
                ("ib0", 0, 100, 3),
                ("ib0", 1, 50, 14),
            ]
        );
        assert_eq!(warnings.len(), 2);
        assert_eq!(
            warnings[0].to_string(),
            "BTL_TCP_BANDWIDTH_ETH9: no network interface is named `eth9`; ignoring it"
        );
        assert!(matches!(
            warnings[1],
            Warning::UnusedOverride {
                reason: UnusedReason::NoSuchLink { links: 2 },
                ..
            }
        ));
        assert_eq!(shl_saturating(1 << 31, 1), u32::MAX);
        assert_eq!(shl_saturating(1, 31), 1 << 31);

        let mut out = [Instance::EMPTY; 3];
        assert_eq!(
            select(&ifs, &p, &mut out, |_| {}),
            Err(SelectError::OutputFull {
                needed: 4,
                capacity: 3
            })
        );
    }

    #[test]
    fn unresolvable_and_malformed() {
        let ifs = fixture();
        let p = with(&[("if_include", "10.1.2.0/24,192.0.2.0/24,eth9")]);
        let (inst, warnings) = run(&ifs, &p).unwrap();
        assert_eq!(names(&inst), ["eth0"]);
        assert_eq!(warnings.len(), 2);
        assert_eq!(
            warnings[0].to_string(),
            "BTL_TCP_IF_INCLUDE: no network interface matches `192.0.2.0/24`; ignoring it"
        );
        let p = with(&[("if_include", "192.0.2.0/24")]);
        let e = run(&ifs, &p).unwrap_err();
        assert_eq!(
            e,
            SelectError::NothingSelected {
                param: Some(TextParamId::IfInclude)
            }
        );
        assert!(e
            .to_string()
            .starts_with("BTL_TCP_IF_INCLUDE selects no usable"));

        let p = with(&[("if_include", "eth0,10.0.0.0/33")]);
        let e = run(&ifs, &p).unwrap_err();
        assert!(matches!(
            e,
            SelectError::Param(ParamError::BadListEntry {
                name: "if_include",
                reason,
                ..
            }) if reason == SpecError::PrefixTooLong { max: 32 }.message()
        ));
        assert!(e
            .to_string()
            .starts_with("BTL_TCP_IF_INCLUDE: malformed entry `10.0.0.0/33`"));

        // Unfound exclude entries: reported only with
        // warn_all_unfound_interfaces.
        let p = TcpParams::new();
        assert!(run(&ifs, &p).unwrap().1.is_empty());
        let p = with(&[("warn_all_unfound_interfaces", "1")]);
        assert_eq!(
            run(&ifs, &p).unwrap().1,
            [Warning::Unresolvable {
                param: TextParamId::IfExclude,
                entry: "sppp"
            }]
        );
    }

    #[test]
    fn dedup_by_kernel_index() {
        let ifs = [
            iface("eth0", 2, V4(10, 1, 2, 3), 24, true),
            iface("eth0:1", 2, V4(10, 9, 9, 9), 24, true),
            iface("eth0", 2, "2001:db8::5".parse().unwrap(), 64, true),
            iface("eth0", 2, "fe80::1".parse().unwrap(), 64, true),
            iface("wlan", 0, V4(192, 168, 1, 2), 24, true),
            iface("wlan", 0, V4(192, 168, 1, 3), 24, true),
        ];
        let p = TcpParams::new();
        let (inst, _) = run(&ifs, &p).unwrap();
        assert_eq!(names(&inst), ["eth0", "wlan"]);
        assert_eq!(inst[0].addr_v6, Some("2001:db8::5".parse().unwrap()));
        assert_eq!(addresses(&ifs, &p, &inst[0]).count(), 4);
        assert_eq!(addresses(&ifs, &p, &inst[1]).count(), 2);
        // An alias name or an alias address selects the whole interface.
        for inc in ["eth0:1", "10.9.9.0/24"] {
            let p = with(&[("if_include", inc)]);
            assert_eq!(names(&run(&ifs, &p).unwrap().0), ["eth0"], "{inc}");
        }
    }

    #[test]
    fn nothing_selected_messages_exact() {
        let e = |param| SelectError::NothingSelected { param }.to_string();
        assert_eq!(
            e(Some(TextParamId::IfInclude)),
            "BTL_TCP_IF_INCLUDE selects no usable network interface (up, with an address of \
             an enabled family)"
        );
        assert_eq!(
            e(Some(TextParamId::IfExclude)),
            "BTL_TCP_IF_EXCLUDE excludes every usable network interface"
        );
        assert_eq!(
            e(None),
            "no usable network interface (none is up with an address of an enabled family)"
        );
        let bad = ParamError::Argument { reason: "why" };
        assert_eq!(SelectError::Param(bad).to_string(), "why");
        assert!(core::error::Error::source(&SelectError::Param(bad)).is_none());
    }
}
