//! The `tcp` component's parameters: the seed's names, defaults, help texts
//! and validation rules, as a table and rules over the shared registry
//! ([`crate::params`]).
//!
//! - [`TCP_PARAMS`] is the static table of every parameter in the seed's
//!   registration order (named by [`TCP`]); [`TcpParam`] indexes it and
//!   names either a numeric parameter ([`TcpParamId`]) or one of the two
//!   string parameters (`if_include`, `if_exclude`: [`TextParamId`]).
//! - [`TcpParams`] holds one typed field per numeric parameter, the two
//!   strings in fixed 256-byte storage ([`TEXT_CAP`]), a fixed list of
//!   per-interface `bandwidth_<if>` / `latency_<if>` overrides
//!   ([`IfOverride`], at most [`OVERRIDE_CAP`]), and where every value came
//!   from. Values are set from code (assign a field, [`Params::set`],
//!   [`TcpParams::set_override`]) or from the environment
//!   ([`Params::set_from_env_var`], which understands
//!   `BTL_TCP_IF_INCLUDE`, `BTL_TCP_BANDWIDTH_ETH0`, and Open MPI's
//!   `OMPI_MCA_btl_tcp_if_include` / `OMPI_MCA_btl_tcp_bandwidth_eth0:1`).
//! - [`Params::verify`] applies the seed's register/verify/open rules and
//!   Open MPI's base BTL checks: it either fails without changing anything,
//!   or adjusts values and returns what it adjusted.
//! - [`Params::iter`] lists every parameter with its value, default and
//!   source for `btl info`.
//!
//! Every error ([`ParamError`]) names the parameter as the user types it
//! in the environment (`BTL_TCP_LINKS`) and says what it accepts. The
//! syntax of the interface lists is [`super::iflist`]'s.
//!
//! Two parameters have a default computed from another one: `port_range_v4`
//! / `port_range_v6` default to `65536 - port_min - 1` (the seed's formula,
//! from the current, valid `port_min`), and `max_frame` defaults to
//! 64 MiB or `max_send_size` if larger. Their fields are `Option`s: `None`
//! follows the other parameter, `Some` is a value someone set.
//!
//! BTL base values: the seed's `tcp` values where it sets them
//! (`rdma_pipeline_send_length` 128 KiB, `rdma_pipeline_frag_size`
//! `INT_MAX`, `min_rdma_pipeline_size` 0, which verify raises to
//! `eager_limit` plus `rdma_pipeline_send_length` by Open MPI's base rule,
//! as for `sm`). `flags` defaults to send | put | get, the operations btl's
//! TCP transport provides (the seed's other flag bits — send-in-place,
//! checksum, ack, heterogeneous RDMA — describe Open MPI's PML interplay
//! and have no meaning here).
//!
//! One default differs from the seed's: `sndbuf` and `rcvbuf` are 0 (the
//! kernel's autotuning) instead of 128 KiB. On Linux a fixed `SO_SNDBUF` /
//! `SO_RCVBUF` turns autotuning off for that socket, and 128 KiB caps the
//! window well below what a loopback or data-centre link needs; Open MPI
//! (and MPICH) changed their defaults to 0 later for the same reason.

use core::fmt;
use core::ops::RangeInclusive;

use super::iflist;
use crate::params::base::{self, BaseKeys, ACCEPTS_BOOL, FLAG_GET, FLAG_PUT, FLAG_SEND};
use crate::params::{
    env_name, parse_int, table, Assign, Component, FixedStr, NumberError, ParamDef, ParamError,
    ParamKey, ParamKind, ParamName, ParamSource, ParamState, Params, Precedence, Setting, Value,
    Verified,
};

/// Name of the component, the middle part of `BTL_TCP_LINKS`.
pub const COMPONENT: &str = "tcp";

/// Number of numeric parameters (the length of [`TcpParamId::ALL`]).
pub const TCP_NUM_PARAM_COUNT: usize = 34;

/// Number of string parameters (the length of [`TextParamId::ALL`]).
pub const TCP_TEXT_PARAM_COUNT: usize = 2;

/// Number of parameters of the `tcp` component (the length of
/// [`TCP_PARAMS`] and [`TcpParam::ALL`]).
pub const TCP_PARAM_COUNT: usize = TCP_NUM_PARAM_COUNT + TCP_TEXT_PARAM_COUNT;

/// Capacity in bytes of a string parameter's value (`if_include`,
/// `if_exclude`); a longer value is [`ParamError::TooLong`].
pub const TEXT_CAP: usize = 256;

/// Capacity of the per-interface override list ([`TcpParams::overrides`]).
pub const OVERRIDE_CAP: usize = 16;

/// Longest interface name an override may name, in bytes (Linux's
/// `IF_NAMESIZE`, 16, including room for a terminating NUL there).
pub const IF_NAME_CAP: usize = 16;

/// The seed's default `if_exclude`: the IPv4 loopback network and PPP
/// interfaces.
pub const DEFAULT_IF_EXCLUDE: &str = "127.0.0.1/8,sppp";

/// The port an invalid `port_min_v4` / `port_min_v6` is reset to (and their
/// default).
pub const DEFAULT_PORT_MIN: i32 = 1024;

/// Default `max_frame`: 64 MiB (messages up to that size travel in one
/// frame; see its help text).
pub const DEFAULT_MAX_FRAME: u32 = 64 << 20;

/// Upper bound of `max_frame` and `max_send_size`: 1 GiB.
pub const MAX_FRAME_LIMIT: u32 = 1 << 30;

/// Open MPI's `MCA_BTL_EXCLUSIVITY_LOW`.
pub const EXCLUSIVITY_LOW: u32 = 0;

/// `recv_lowat`'s default: large payloads are read 128 KiB or more at a
/// time.
pub const RECV_LOWAT_DEFAULT: u32 = 128 * 1024;

/// `recv_lowat`'s largest value.
pub const RECV_LOWAT_MAX: u32 = 16 * 1024 * 1024;

/// The `tcp` component's exclusivity: `MCA_BTL_EXCLUSIVITY_LOW + 100`.
pub const TCP_EXCLUSIVITY: u32 = EXCLUSIVITY_LOW + 100;

/// An IP address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IpFamily {
    /// IPv4 (`disable_family` 4 drops it).
    V4,
    /// IPv6 (`disable_family` 6 drops it).
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(addr: &core::net::IpAddr) -> IpFamily {
        match addr {
            core::net::IpAddr::V4(_) => IpFamily::V4,
            core::net::IpAddr::V6(_) => IpFamily::V6,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// Identifies one numeric `tcp` parameter; its discriminant is its position
/// in [`TcpParamId::ALL`] ([`TcpParam::index`] is its place in the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum TcpParamId {
    /// `links`
    Links,
    /// `free_list_num`
    FreeListNum,
    /// `free_list_max`
    FreeListMax,
    /// `free_list_inc`
    FreeListInc,
    /// `sndbuf`
    Sndbuf,
    /// `rcvbuf`
    Rcvbuf,
    /// `endpoint_cache`
    EndpointCache,
    /// `use_nagle`
    UseNagle,
    /// `write_combine`
    WriteCombine,
    /// `port_min_v4`
    PortMinV4,
    /// `port_range_v4`
    PortRangeV4,
    /// `port_min_v6`
    PortMinV6,
    /// `port_range_v6`
    PortRangeV6,
    /// `warn_all_unfound_interfaces`
    WarnAllUnfoundInterfaces,
    /// `exclusivity`
    Exclusivity,
    /// `flags`
    Flags,
    /// `rndv_eager_limit`
    RndvEagerLimit,
    /// `eager_limit`
    EagerLimit,
    /// `max_send_size`
    MaxSendSize,
    /// `rdma_pipeline_send_length`
    RdmaPipelineSendLength,
    /// `rdma_pipeline_frag_size`
    RdmaPipelineFragSize,
    /// `min_rdma_pipeline_size`
    MinRdmaPipelineSize,
    /// `latency`
    Latency,
    /// `bandwidth`
    Bandwidth,
    /// `disable_family`
    DisableFamily,
    /// `max_frame` (btl's own)
    MaxFrame,
    /// `handshake_timeout` (btl's own)
    HandshakeTimeout,
    /// `keepalive_time` (btl's own)
    KeepaliveTime,
    /// `keepalive_intvl` (btl's own)
    KeepaliveIntvl,
    /// `keepalive_probes` (btl's own)
    KeepaliveProbes,
    /// `user_timeout` (btl's own)
    UserTimeout,
    /// `queue_bytes` (btl's own)
    QueueBytes,
    /// `queue_messages` (btl's own)
    QueueMessages,
    /// `recv_lowat` (btl's own)
    RecvLowat,
}

impl TcpParamId {
    /// Every numeric parameter, in table order.
    pub const ALL: [TcpParamId; TCP_NUM_PARAM_COUNT] = [
        TcpParamId::Links,
        TcpParamId::FreeListNum,
        TcpParamId::FreeListMax,
        TcpParamId::FreeListInc,
        TcpParamId::Sndbuf,
        TcpParamId::Rcvbuf,
        TcpParamId::EndpointCache,
        TcpParamId::UseNagle,
        TcpParamId::WriteCombine,
        TcpParamId::PortMinV4,
        TcpParamId::PortRangeV4,
        TcpParamId::PortMinV6,
        TcpParamId::PortRangeV6,
        TcpParamId::WarnAllUnfoundInterfaces,
        TcpParamId::Exclusivity,
        TcpParamId::Flags,
        TcpParamId::RndvEagerLimit,
        TcpParamId::EagerLimit,
        TcpParamId::MaxSendSize,
        TcpParamId::RdmaPipelineSendLength,
        TcpParamId::RdmaPipelineFragSize,
        TcpParamId::MinRdmaPipelineSize,
        TcpParamId::Latency,
        TcpParamId::Bandwidth,
        TcpParamId::DisableFamily,
        TcpParamId::MaxFrame,
        TcpParamId::HandshakeTimeout,
        TcpParamId::KeepaliveTime,
        TcpParamId::KeepaliveIntvl,
        TcpParamId::KeepaliveProbes,
        TcpParamId::UserTimeout,
        TcpParamId::QueueBytes,
        TcpParamId::QueueMessages,
        TcpParamId::RecvLowat,
    ];

    /// Position in [`TcpParamId::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The parameter's definition.
    pub fn def(self) -> &'static ParamDef {
        TcpParam::Num(self).def()
    }

    /// Looks a numeric parameter up by name (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<TcpParamId> {
        match TcpParam::from_name(name)? {
            TcpParam::Num(id) => Some(id),
            TcpParam::Text(_) => None,
        }
    }
}

/// Identifies one string parameter; its discriminant is its position in
/// [`TextParamId::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum TextParamId {
    /// `if_include`
    IfInclude,
    /// `if_exclude`
    IfExclude,
}

impl TextParamId {
    /// Both string parameters, in table order.
    pub const ALL: [TextParamId; TCP_TEXT_PARAM_COUNT] =
        [TextParamId::IfInclude, TextParamId::IfExclude];

    /// Position in [`TextParamId::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The parameter's definition.
    pub fn def(self) -> &'static ParamDef {
        TcpParam::Text(self).def()
    }

    /// Looks a string parameter up by name (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<TextParamId> {
        match TcpParam::from_name(name)? {
            TcpParam::Text(id) => Some(id),
            TcpParam::Num(_) => None,
        }
    }
}

/// Any `tcp` parameter: numeric or string; the key of [`TCP_PARAMS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TcpParam {
    /// A numeric parameter.
    Num(TcpParamId),
    /// A string parameter.
    Text(TextParamId),
}

wrap_from!(TcpParam { Num(TcpParamId), Text(TextParamId) });

impl TcpParam {
    /// Every parameter in the seed's registration order (`links`,
    /// `if_include`, `if_exclude`, ...), then btl's own: the order of
    /// [`TCP_PARAMS`].
    pub const ALL: [TcpParam; TCP_PARAM_COUNT] = {
        let mut all = [TcpParam::Num(TcpParamId::Links); TCP_PARAM_COUNT];
        all[1] = TcpParam::Text(TextParamId::IfInclude);
        all[2] = TcpParam::Text(TextParamId::IfExclude);
        let mut i = 1;
        while i < TCP_NUM_PARAM_COUNT {
            all[i + 2] = TcpParam::Num(TcpParamId::ALL[i]);
            i += 1;
        }
        all
    };

    /// Index into [`TCP_PARAMS`] (and [`TcpParam::ALL`]): `links`, then the
    /// two strings, then the other numeric parameters.
    pub const fn index(self) -> usize {
        match self {
            TcpParam::Num(TcpParamId::Links) => 0,
            TcpParam::Text(id) => 1 + id as usize,
            TcpParam::Num(id) => TCP_TEXT_PARAM_COUNT + id as usize,
        }
    }
}

impl ParamKey for TcpParam {
    const ALL: &'static [TcpParam] = &TcpParam::ALL;

    fn component() -> &'static Component {
        &TCP
    }

    fn index(self) -> usize {
        TcpParam::index(self)
    }

    fn def(self) -> &'static ParamDef {
        &TCP_PARAMS[TcpParam::index(self)]
    }
}

const I32_MAX: i64 = i32::MAX as i64;
const I32_MIN: i64 = i32::MIN as i64;
const U32_MAX: i64 = u32::MAX as i64;
const PORT_MAX: i64 = u16::MAX as i64;
const PORT_MIN: i64 = DEFAULT_PORT_MIN as i64;
/// The seed's `65536 - port_min - 1` for the default `port_min`.
const PORT_RANGE: i64 = 65536 - PORT_MIN - 1;

const ACCEPTS_PORT_MIN: &str =
    "a port number between 1 and 65535 (an invalid one is reset to 1024 with a warning)";
const HELP_PORT_MIN: &str = "The minimum port where the TCP BTL will try to bind (default 1024)";
const ACCEPTS_IF_LIST: &str = "a comma-separated list of interface names or name prefixes (eth0, \
                               ib) and CIDR networks (10.0.0.0/8, fd00::/8), at most 256 bytes";

/// The `tcp` component's parameters in the seed's registration order
/// (component parameters, then the BTL base parameters, then
/// `disable_family`, then btl's own `max_frame`, `handshake_timeout`, dead-link
/// detection (`keepalive_*`, `user_timeout`) and the per-peer queue bounds
/// (`queue_bytes`, `queue_messages`), and the large-read gate
/// `recv_lowat`),
/// indexed by [`TcpParam`].
///
/// The `default` of `port_range_v4` / `port_range_v6` (64511) and of
/// `max_frame` (64 MiB) is the one for the default `port_min` and
/// `max_send_size`; the actual default follows those parameters
/// ([`TcpParams::default_of`]).
pub static TCP_PARAMS: [ParamDef; TCP_PARAM_COUNT] = table(
    COMPONENT,
    [
        ParamDef::number("links", ParamKind::UInt, 1, (1, U32_MAX)).doc(
            4,
            "an integer >= 1",
            "Number of TCP links (BTL instances) to create for each selected interface; each \
             further link gets half the bandwidth and twice the latency of the previous one.",
        ),
        ParamDef::text("if_include", "", TEXT_CAP).doc(
            1,
            ACCEPTS_IF_LIST,
            "Comma-delimited list of devices and/or CIDR notation of networks to use for MPI \
             communication (e.g., \"eth0,192.168.0.0/16\").  Mutually exclusive with \
             btl_tcp_if_exclude.",
        ),
        ParamDef::text("if_exclude", DEFAULT_IF_EXCLUDE, TEXT_CAP).doc(
            1,
            ACCEPTS_IF_LIST,
            "Comma-delimited list of devices and/or CIDR notation of networks to NOT use for MPI \
             communication -- all devices not matching these specifications will be used (e.g., \
             \"eth0,192.168.0.0/16\").  If set to a non-default value, it is mutually exclusive \
             with btl_tcp_if_include.",
        ),
        base::free_list_num("Number of fragments of each kind each process allocates up front."),
        base::free_list_max(),
        base::free_list_inc(32),
        ParamDef::number("sndbuf", ParamKind::Size, 0, (0, I32_MAX)).doc(
            4,
            "a size in bytes between 0 and 2147483647 (0 = the kernel's autotuning; k, M, G \
             suffixes allowed)",
            "Size (in bytes) of the kernel send buffer of each TCP socket. 0 (the default) \
             leaves it to the kernel, which grows it with the connection's window up to \
             net.ipv4.tcp_wmem's maximum; a fixed size turns that autotuning off and caps the \
             bytes in flight, and with them the bandwidth (the seed's 128 KiB gave about half \
             the 4 MiB bandwidth on loopback; Open MPI and MPICH moved to 0 for this reason).",
        ),
        ParamDef::number("rcvbuf", ParamKind::Size, 0, (0, I32_MAX)).doc(
            4,
            "a size in bytes between 0 and 2147483647 (0 = the kernel's autotuning; k, M, G \
             suffixes allowed)",
            "Size (in bytes) of the kernel receive buffer of each TCP socket. 0 (the default) \
             leaves it to the kernel, which grows it (and the advertised window) up to \
             net.ipv4.tcp_rmem's maximum; a fixed size turns that autotuning off and caps the \
             TCP window, and with it the bandwidth (the seed's 128 KiB gave about half the \
             4 MiB bandwidth on loopback; Open MPI and MPICH moved to 0 for this reason).",
        ),
        ParamDef::number("endpoint_cache", ParamKind::Size, 30 * 1024, (64, I32_MAX)).doc(
            4,
            "a size in bytes between 64 and 2147483647 (k, M, G suffixes allowed)",
            "The size of the internal cache for each TCP connection. This cache is used to \
             reduce the number of syscalls, by replacing them with memcpy. Every read will read \
             the expected data plus the amount of the endpoint_cache",
        ),
        ParamDef::number("use_nagle", ParamKind::Bool, 0, (0, 1)).doc(
            4,
            ACCEPTS_BOOL,
            "Whether to use Nagle's algorithm or not (using Nagle's algorithm may increase short \
             message latency)",
        ),
        ParamDef::number(
            "write_combine",
            ParamKind::Size,
            64 * 1024,
            (0, 16 * 1024 * 1024),
        )
        .doc(
            4,
            "a size in bytes between 0 and 16777216 (0 = off; k, M, G suffixes allowed)",
            "Write combining: a send to a peer that an earlier send of the same progress pass \
             wrote to already is written corked (MSG_MORE: appended to the socket's last \
             unsent segment), and the next progress call sends what is corked, as does any \
             other write, at the latest once this many bytes are corked (frames of up to 32 \
             KiB only). The first message of a burst leaves at once (a ping-pong never waits); \
             a window of small messages costs one segment per batch instead of one per \
             message (4 KiB messages: about twice the bandwidth on loopback). A sender that \
             stops calling progress still sends: the kernel sends a corked segment with the \
             next ACK or after about 200 ms.",
        ),
        ParamDef::number("port_min_v4", ParamKind::Int, PORT_MIN, (I32_MIN, I32_MAX)).doc(
            2,
            ACCEPTS_PORT_MIN,
            HELP_PORT_MIN,
        ),
        ParamDef::number("port_range_v4", ParamKind::Int, PORT_RANGE, (1, PORT_MAX)).doc(
            2,
            "an integer between 1 and 65535 (clamped so that port_min_v4 + port_range_v4 <= \
             65536)",
            "The number of ports where the TCP BTL will try to bind (default 65536 - port_min_v4 \
             - 1). This parameter together with the port min, define a range of ports where Open \
             MPI will open sockets.",
        ),
        ParamDef::number("port_min_v6", ParamKind::Int, PORT_MIN, (I32_MIN, I32_MAX)).doc(
            2,
            ACCEPTS_PORT_MIN,
            HELP_PORT_MIN,
        ),
        ParamDef::number("port_range_v6", ParamKind::Int, PORT_RANGE, (1, PORT_MAX)).doc(
            2,
            "an integer between 1 and 65535 (clamped so that port_min_v6 + port_range_v6 <= \
             65536)",
            "The number of ports where the TCP BTL will try to bind (default 65536 - port_min_v6 \
             - 1). This parameter together with the port min, define a range of ports where Open \
             MPI will open sockets.",
        ),
        ParamDef::number("warn_all_unfound_interfaces", ParamKind::Bool, 0, (0, 1)).doc(
            2,
            ACCEPTS_BOOL,
            "Issue a warning for all unfound interfaces included in if_exclude",
        ),
        base::exclusivity(TCP_EXCLUSIVITY),
        base::flags(
            FLAG_SEND | FLAG_PUT | FLAG_GET,
            "a bit mask of 1 (send, required), 2 (put) and 4 (get)",
        ),
        base::rndv_eager_limit(64 * 1024),
        base::eager_limit(
            64 * 1024,
            1,
            "a size in bytes between 1 and 4294967295 (k, M, G suffixes allowed)",
        ),
        base::max_send_size(
            128 * 1024,
            MAX_FRAME_LIMIT,
            "a size in bytes between eager_limit and 1073741824 (k, M, G suffixes allowed)",
        ),
        base::rdma_pipeline_send_length(128 * 1024),
        base::rdma_pipeline_frag_size(i32::MAX as u32),
        base::min_rdma_pipeline_size(0),
        base::latency(100),
        base::bandwidth(100),
        ParamDef::number("disable_family", ParamKind::Int, 0, (0, 6))
            .one_of(&[0, 4, 6])
            .doc(
                2,
                "0 (use IPv4 and IPv6), 4 (no IPv4) or 6 (no IPv6)",
                "Disable one IP address family: 0 = use both IPv4 and IPv6, 4 = do not use IPv4, \
                 6 = do not use IPv6.",
            ),
        ParamDef::number(
            "max_frame",
            ParamKind::Size,
            DEFAULT_MAX_FRAME as i64,
            (1, MAX_FRAME_LIMIT as i64),
        )
        .doc(
            5,
            "a size in bytes between max_send_size and 1073741824 (k, M, G suffixes allowed)",
            "Largest payload (in bytes) of one TCP frame accepted from a peer; a frame announcing \
             more is a protocol error that closes the connection, and larger messages travel as \
             several frames (default: 64 MiB, at least max_send_size; must be >= max_send_size \
             and <= 1 GiB). Measured on loopback: 4 MiB messages in one frame reach 4.7 GB/s, as \
             128 KiB frames 3.9 GB/s.",
        ),
        ParamDef::number("handshake_timeout", ParamKind::UInt, 10_000, (1, U32_MAX)).doc(
            5,
            "a number of milliseconds between 1 and 4294967295",
            "Time (in milliseconds) a new TCP connection may take to complete its handshake \
             before it is dropped.",
        ),
        ParamDef::number("keepalive_time", ParamKind::UInt, 20, (0, 86_400)).doc(
            5,
            "a number of seconds between 0 (keep-alive off) and 86400",
            "Seconds a connection may be idle before TCP keep-alive probes start (0: no \
             keep-alive). With keepalive_intvl and keepalive_probes it bounds how long a peer \
             that vanished without FIN or RST (a network partition, a dead host) goes unnoticed \
             on an idle connection: about keepalive_time + keepalive_intvl * keepalive_probes.",
        ),
        ParamDef::number("keepalive_intvl", ParamKind::UInt, 5, (1, 3_600)).doc(
            5,
            "a number of seconds between 1 and 3600",
            "Seconds between TCP keep-alive probes.",
        ),
        ParamDef::number("keepalive_probes", ParamKind::UInt, 4, (1, 127)).doc(
            5,
            "a number between 1 and 127",
            "Unanswered TCP keep-alive probes after which the connection (and its peer) fails.",
        ),
        ParamDef::number("user_timeout", ParamKind::UInt, 40_000, (0, U32_MAX)).doc(
            5,
            "a number of milliseconds (0: the kernel's default, about 15 minutes)",
            "TCP_USER_TIMEOUT: milliseconds data may stay unacknowledged before the connection \
             (and its peer) fails. Bounds how long a peer that vanished without FIN or RST goes \
             unnoticed while we send to it.",
        ),
        ParamDef::number(
            "queue_bytes",
            ParamKind::Size,
            8 << 20,
            (1, MAX_FRAME_LIMIT as i64),
        )
        .doc(
            5,
            "a size in bytes (k, M, G suffixes allowed)",
            "Bytes of messages that may wait in user space for one peer whose socket does not \
                 drain (a slow or stopped receiver, a broken link); beyond it a send waits \
                 (progressing everything, up to BTL_TIMEOUT) or, non-blocking, reports that it \
                 would block. One message always fits however large. Default 8 MiB: a 64-rank job \
                 holds at most about 0.5 GiB per rank in send queues.",
        ),
        ParamDef::number("queue_messages", ParamKind::UInt, 16_384, (1, U32_MAX)).doc(
            5,
            "a number between 1 and 4294967295",
            "Messages (frames) that may wait in user space for one peer; see queue_bytes.",
        ),
        ParamDef::number(
            "recv_lowat",
            ParamKind::Size,
            RECV_LOWAT_DEFAULT as i64,
            (0, RECV_LOWAT_MAX as i64),
        )
        .doc(
            5,
            "a size in bytes between 0 and 16777216 (0 = off; below 4096 counts as 4096; k, \
             M, G suffixes allowed)",
            "Large reads in large pieces: while more than this many bytes of a frame's payload \
             are still to come (a get's answer or a large message, read straight into place), \
             its connection is read only once this many bytes wait in the socket (SO_RCVLOWAT, \
             asked with poll); the last ones are read as they arrive. Payloads of 2 MiB and more \
             are read so always, smaller ones when they follow each other (a stream). Fewer, \
             larger reads leave the sending side fewer acknowledgements to process: on loopback, \
             with Open MPI's ob1 over rtcp, 128 KiB (the default) gave about 1.25 times the \
             windowed 1 MiB bandwidth of reading as data arrives (0) and 1.3 times at 4 MiB. \
             64 KiB (one loopback segment) was slower than 0.",
        ),
    ],
);

/// The `tcp` component: its name and [`TCP_PARAMS`].
pub static TCP: Component = Component {
    name: COMPONENT,
    params: &TCP_PARAMS,
};

/// Where `tcp` keeps the parameters of Open MPI's base rules.
const BASE: BaseKeys<TcpParam> = BaseKeys {
    flags: TcpParam::Num(TcpParamId::Flags),
    eager_limit: TcpParam::Num(TcpParamId::EagerLimit),
    max_send_size: TcpParam::Num(TcpParamId::MaxSendSize),
    rndv_eager_limit: TcpParam::Num(TcpParamId::RndvEagerLimit),
    rdma_pipeline_send_length: TcpParam::Num(TcpParamId::RdmaPipelineSendLength),
    min_rdma_pipeline_size: TcpParam::Num(TcpParamId::MinRdmaPipelineSize),
    free_lists: Some((
        TcpParam::Num(TcpParamId::FreeListNum),
        TcpParam::Num(TcpParamId::FreeListMax),
    )),
};

/// Which per-interface value an override sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum OverrideKind {
    /// `bandwidth_<if>[:<link>]`, Mbps.
    Bandwidth,
    /// `latency_<if>[:<link>]`, microseconds.
    Latency,
}

impl OverrideKind {
    /// The name prefix without the `_`: `"bandwidth"` or `"latency"`.
    pub fn name(self) -> &'static str {
        match self {
            OverrideKind::Bandwidth => "bandwidth",
            OverrideKind::Latency => "latency",
        }
    }
}

/// One per-interface override: `bandwidth_eth0=1000` (every link of `eth0`
/// starts from 1000 Mbps) or `latency_eth0:1=50` (link 1 of `eth0` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfOverride {
    kind: OverrideKind,
    if_name: FixedStr<IF_NAME_CAP>,
    link: Option<u32>,
    value: u32,
    source: ParamSource,
}

impl IfOverride {
    const EMPTY: IfOverride = IfOverride {
        kind: OverrideKind::Bandwidth,
        if_name: FixedStr::EMPTY,
        link: None,
        value: 0,
        source: ParamSource::Default,
    };

    /// Bandwidth or latency.
    pub fn kind(&self) -> OverrideKind {
        self.kind
    }

    /// The interface name as given (matched ASCII case-insensitively, since
    /// `BTL_TCP_BANDWIDTH_ETH0` spells it in upper case).
    pub fn if_name(&self) -> &str {
        self.if_name.as_str()
    }

    /// The link it applies to (`bandwidth_eth0:1`), or `None` for the
    /// interface's base value (`bandwidth_eth0`).
    pub fn link(&self) -> Option<u32> {
        self.link
    }

    /// The value (Mbps or microseconds).
    pub fn value(&self) -> u32 {
        self.value
    }

    /// Where it came from.
    pub fn source(&self) -> ParamSource {
        self.source
    }

    /// The parameter name: displays as `bandwidth_eth0` or `latency_eth0:1`.
    pub fn name(&self) -> OverrideName<'_> {
        OverrideName {
            kind: self.kind,
            if_name: self.if_name(),
            link: self.link,
            env: false,
        }
    }

    /// The environment variable: displays as `BTL_TCP_BANDWIDTH_ETH0` or
    /// `BTL_TCP_LATENCY_ETH0:1`.
    pub fn env_name(&self) -> OverrideName<'_> {
        OverrideName {
            env: true,
            ..self.name()
        }
    }

    fn same_slot(&self, other: &IfOverride) -> bool {
        self.kind == other.kind
            && self.link == other.link
            && self.if_name().eq_ignore_ascii_case(other.if_name())
    }
}

/// Displays the name of an override parameter, as a parameter name
/// (`bandwidth_eth0:1`) or as an environment variable
/// (`BTL_TCP_BANDWIDTH_ETH0:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverrideName<'a> {
    kind: OverrideKind,
    if_name: &'a str,
    link: Option<u32>,
    env: bool,
}

impl fmt::Display for OverrideName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.env {
            let env = env_name(COMPONENT, self.kind.name());
            write!(f, "{}", env.with_suffix(self.if_name))?;
        } else {
            write!(f, "{}_{}", self.kind.name(), self.if_name)?;
        }
        if let Some(link) = self.link {
            write!(f, ":{link}")?;
        }
        Ok(())
    }
}

/// The `tcp` component's parameter values, with the seed's types and
/// defaults, and where every value came from.
///
/// Numeric fields may be assigned directly from code; call
/// [`Params::verify`] afterwards. A field that differs from its default
/// while its recorded source is [`ParamSource::Default`] is reported as set
/// by [`ParamSource::Code`] (for the `Option` fields: any `Some`). The
/// string parameters and the per-interface overrides are set through
/// methods, which record their source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpParams {
    /// Links (BTL instances) per selected interface.
    pub links: u32,
    /// Fragments allocated up front.
    pub free_list_num: i32,
    /// Maximum fragments per free list (-1 = unlimited).
    pub free_list_max: i32,
    /// Free-list growth increment.
    pub free_list_inc: i32,
    /// `SO_SNDBUF` in bytes (0, the default: the kernel autotunes it).
    pub sndbuf: i32,
    /// `SO_RCVBUF` in bytes (0, the default: the kernel autotunes it).
    pub rcvbuf: i32,
    /// Read-ahead cache per connection, in bytes.
    pub endpoint_cache: i32,
    /// Whether Nagle's algorithm stays on (no `TCP_NODELAY`).
    pub use_nagle: bool,
    /// Most bytes of small frames corked per connection for write
    /// combining (0: every post is sent at once).
    pub write_combine: i32,
    /// First port tried for the IPv4 listener (invalid values are reset to
    /// 1024 by verify).
    pub port_min_v4: i32,
    /// Number of IPv4 ports tried; `None` = `65536 - port_min_v4 - 1`.
    pub port_range_v4: Option<i32>,
    /// First port tried for the IPv6 listener (invalid values are reset to
    /// 1024 by verify).
    pub port_min_v6: i32,
    /// Number of IPv6 ports tried; `None` = `65536 - port_min_v6 - 1`.
    pub port_range_v6: Option<i32>,
    /// Whether every unfound `if_exclude` entry is warned about.
    pub warn_all_unfound_interfaces: bool,
    /// BTL exclusivity.
    pub exclusivity: u32,
    /// BTL flags ([`FLAG_SEND`], [`FLAG_PUT`], [`FLAG_GET`]).
    pub flags: u32,
    /// Size of the first fragment of a large message.
    pub rndv_eager_limit: u32,
    /// Largest "short" message, in bytes.
    pub eager_limit: u32,
    /// Largest fragment of a long message, in bytes.
    pub max_send_size: u32,
    /// Length of the send/receive portion of a pipelined message.
    pub rdma_pipeline_send_length: u32,
    /// Largest RDMA fragment of a pipelined message.
    pub rdma_pipeline_frag_size: u32,
    /// Smallest message that uses the RDMA pipeline.
    pub min_rdma_pipeline_size: u32,
    /// Latency in microseconds (of link 0 of an interface without a
    /// `latency_<if>` override).
    pub latency: u32,
    /// Bandwidth in Mbps (of link 0 of an interface without a
    /// `bandwidth_<if>` override).
    pub bandwidth: u32,
    /// IP family not to use: 0 (none), 4 or 6.
    pub disable_family: u32,
    /// Largest frame payload accepted from a peer; `None` = 64 MiB, or
    /// `max_send_size` if larger.
    pub max_frame: Option<u32>,
    /// Milliseconds a connection may take to complete its handshake.
    pub handshake_timeout: u32,
    /// Idle seconds before keep-alive probes (0: off).
    pub keepalive_time: u32,
    /// Seconds between keep-alive probes.
    pub keepalive_intvl: u32,
    /// Unanswered probes before the connection fails.
    pub keepalive_probes: u32,
    /// `TCP_USER_TIMEOUT` in milliseconds (0: the kernel's default).
    pub user_timeout: u32,
    /// Bytes that may wait in user space for one peer.
    pub queue_bytes: u32,
    /// Messages that may wait in user space for one peer.
    pub queue_messages: u32,
    /// Bytes that must wait in the socket before a large payload is read
    /// on (0: read as data arrives).
    pub recv_lowat: u32,
    if_include: FixedStr<TEXT_CAP>,
    if_exclude: FixedStr<TEXT_CAP>,
    overrides: [IfOverride; OVERRIDE_CAP],
    n_overrides: usize,
    state: ParamState,
}

impl Default for TcpParams {
    fn default() -> Self {
        Self::new()
    }
}

/// `port_min` if it is a valid port (1..=65535), else [`DEFAULT_PORT_MIN`]
/// (what verify resets it to).
fn valid_port_min(port_min: i32) -> i32 {
    if (1..=i32::from(u16::MAX)).contains(&port_min) {
        port_min
    } else {
        DEFAULT_PORT_MIN
    }
}

/// The seed's default port range for `port_min`: `65536 - port_min - 1`, at
/// least 1 (a range of 0 would leave no port to try).
fn default_port_range(port_min: i32) -> i32 {
    (65535 - valid_port_min(port_min)).max(1)
}

impl TcpParams {
    /// The defaults (the seed's, but `sndbuf`/`rcvbuf`: see the module
    /// documentation), all with source [`ParamSource::Default`].
    pub const fn new() -> Self {
        let if_exclude = match FixedStr::new(DEFAULT_IF_EXCLUDE) {
            Some(s) => s,
            None => FixedStr::EMPTY,
        };
        TcpParams {
            links: 1,
            free_list_num: 8,
            free_list_max: -1,
            free_list_inc: 32,
            sndbuf: 0,
            rcvbuf: 0,
            endpoint_cache: 30 * 1024,
            use_nagle: false,
            write_combine: 64 * 1024,
            port_min_v4: DEFAULT_PORT_MIN,
            port_range_v4: None,
            port_min_v6: DEFAULT_PORT_MIN,
            port_range_v6: None,
            warn_all_unfound_interfaces: false,
            exclusivity: TCP_EXCLUSIVITY,
            flags: FLAG_SEND | FLAG_PUT | FLAG_GET,
            rndv_eager_limit: 64 * 1024,
            eager_limit: 64 * 1024,
            max_send_size: 128 * 1024,
            rdma_pipeline_send_length: 128 * 1024,
            rdma_pipeline_frag_size: i32::MAX as u32,
            min_rdma_pipeline_size: 0,
            latency: 100,
            bandwidth: 100,
            disable_family: 0,
            max_frame: None,
            handshake_timeout: 10_000,
            keepalive_time: 20,
            keepalive_intvl: 5,
            keepalive_probes: 4,
            user_timeout: 40_000,
            queue_bytes: 8 << 20,
            queue_messages: 16_384,
            recv_lowat: RECV_LOWAT_DEFAULT,
            if_include: FixedStr::EMPTY,
            if_exclude,
            overrides: [IfOverride::EMPTY; OVERRIDE_CAP],
            n_overrides: 0,
            state: ParamState::new(),
        }
    }

    /// The current value of `id` as an `i64` (booleans as 0/1;
    /// `port_range_*` and `max_frame` as computed when left to follow
    /// `port_min_*` / `max_send_size`).
    pub fn get(&self, id: TcpParamId) -> i64 {
        match id {
            TcpParamId::Links => i64::from(self.links),
            TcpParamId::FreeListNum => i64::from(self.free_list_num),
            TcpParamId::FreeListMax => i64::from(self.free_list_max),
            TcpParamId::FreeListInc => i64::from(self.free_list_inc),
            TcpParamId::Sndbuf => i64::from(self.sndbuf),
            TcpParamId::Rcvbuf => i64::from(self.rcvbuf),
            TcpParamId::EndpointCache => i64::from(self.endpoint_cache),
            TcpParamId::UseNagle => i64::from(self.use_nagle),
            TcpParamId::WriteCombine => i64::from(self.write_combine),
            TcpParamId::PortMinV4 => i64::from(self.port_min_v4),
            TcpParamId::PortRangeV4 => i64::from(self.port_range(IpFamily::V4)),
            TcpParamId::PortMinV6 => i64::from(self.port_min_v6),
            TcpParamId::PortRangeV6 => i64::from(self.port_range(IpFamily::V6)),
            TcpParamId::WarnAllUnfoundInterfaces => i64::from(self.warn_all_unfound_interfaces),
            TcpParamId::Exclusivity => i64::from(self.exclusivity),
            TcpParamId::Flags => i64::from(self.flags),
            TcpParamId::RndvEagerLimit => i64::from(self.rndv_eager_limit),
            TcpParamId::EagerLimit => i64::from(self.eager_limit),
            TcpParamId::MaxSendSize => i64::from(self.max_send_size),
            TcpParamId::RdmaPipelineSendLength => i64::from(self.rdma_pipeline_send_length),
            TcpParamId::RdmaPipelineFragSize => i64::from(self.rdma_pipeline_frag_size),
            TcpParamId::MinRdmaPipelineSize => i64::from(self.min_rdma_pipeline_size),
            TcpParamId::Latency => i64::from(self.latency),
            TcpParamId::Bandwidth => i64::from(self.bandwidth),
            TcpParamId::DisableFamily => i64::from(self.disable_family),
            TcpParamId::MaxFrame => i64::from(self.max_frame()),
            TcpParamId::HandshakeTimeout => i64::from(self.handshake_timeout),
            TcpParamId::KeepaliveTime => i64::from(self.keepalive_time),
            TcpParamId::KeepaliveIntvl => i64::from(self.keepalive_intvl),
            TcpParamId::KeepaliveProbes => i64::from(self.keepalive_probes),
            TcpParamId::UserTimeout => i64::from(self.user_timeout),
            TcpParamId::QueueBytes => i64::from(self.queue_bytes),
            TcpParamId::QueueMessages => i64::from(self.queue_messages),
            TcpParamId::RecvLowat => i64::from(self.recv_lowat),
        }
    }

    /// The default of `id` given the other current values (`port_range_*`
    /// and `max_frame` follow `port_min_*` / `max_send_size`).
    pub fn default_of(&self, id: TcpParamId) -> i64 {
        match id {
            TcpParamId::PortRangeV4 => i64::from(default_port_range(self.port_min_v4)),
            TcpParamId::PortRangeV6 => i64::from(default_port_range(self.port_min_v6)),
            TcpParamId::MaxFrame => i64::from(DEFAULT_MAX_FRAME.max(self.max_send_size)),
            _ => id.def().default.as_int().unwrap_or(0),
        }
    }

    /// The value of a string parameter.
    pub fn text(&self, id: TextParamId) -> &str {
        match id {
            TextParamId::IfInclude => self.if_include.as_str(),
            TextParamId::IfExclude => self.if_exclude.as_str(),
        }
    }

    /// `if_include`: interfaces (name prefixes or CIDRs) to use exclusively.
    pub fn if_include(&self) -> &str {
        self.if_include.as_str()
    }

    /// `if_exclude`: interfaces (name prefixes or CIDRs) not to use.
    pub fn if_exclude(&self) -> &str {
        self.if_exclude.as_str()
    }

    /// The effective largest frame payload: `max_frame`, or (left to follow
    /// `max_send_size`) 64 MiB or `max_send_size` if larger.
    pub fn max_frame(&self) -> u32 {
        self.max_frame
            .unwrap_or(DEFAULT_MAX_FRAME.max(self.max_send_size))
    }

    /// The effective number of ports tried for `family`: the set value, or
    /// `65536 - port_min - 1` (from the valid `port_min`).
    pub fn port_range(&self, family: IpFamily) -> i32 {
        let (min, range) = match family {
            IpFamily::V4 => (self.port_min_v4, self.port_range_v4),
            IpFamily::V6 => (self.port_min_v6, self.port_range_v6),
        };
        range.unwrap_or_else(|| default_port_range(min))
    }

    /// The ports the listener of `family` tries, `port_min ..= port_min +
    /// port_range - 1`: with an invalid `port_min` as verify resets it
    /// (1024), and the range clamped to `[1, 65536 - port_min]` as verify
    /// clamps it, so the result is never empty and never passes 65535.
    pub fn listen_ports(&self, family: IpFamily) -> RangeInclusive<u16> {
        let min = match family {
            IpFamily::V4 => self.port_min_v4,
            IpFamily::V6 => self.port_min_v6,
        };
        let min = valid_port_min(min);
        let range = self.port_range(family).clamp(1, 65536 - min);
        let first = u16::try_from(min).unwrap_or(u16::MAX);
        let last = u16::try_from(min + range - 1).unwrap_or(u16::MAX);
        first..=last
    }

    /// The family `disable_family` turns off, if any.
    pub fn disabled_family(&self) -> Option<IpFamily> {
        match self.disable_family {
            4 => Some(IpFamily::V4),
            6 => Some(IpFamily::V6),
            _ => None,
        }
    }

    /// Whether addresses of `family` may be used.
    pub fn family_enabled(&self, family: IpFamily) -> bool {
        self.disabled_family() != Some(family)
    }

    /// The per-interface overrides, in the order they were first set.
    pub fn overrides(&self) -> &[IfOverride] {
        self.overrides.get(..self.n_overrides).unwrap_or(&[])
    }

    /// The override of `kind` for interface `if_name` (ASCII
    /// case-insensitive) and `link` (`None`: the interface's base value,
    /// `bandwidth_<if>`; `Some(n)`: link `n` only, `bandwidth_<if>:<n>`).
    pub fn override_value(
        &self,
        kind: OverrideKind,
        if_name: &str,
        link: Option<u32>,
    ) -> Option<u32> {
        self.overrides()
            .iter()
            .find(|o| o.kind == kind && o.link == link && o.if_name().eq_ignore_ascii_case(if_name))
            .map(|o| o.value)
    }

    /// Sets the per-interface override of `kind` for `if_name` (1 to
    /// [`IF_NAME_CAP`] bytes, no `:`) and `link` (see
    /// [`TcpParams::override_value`]); an existing one for the same kind,
    /// interface (ASCII case-insensitive) and link is replaced. At most
    /// [`OVERRIDE_CAP`] distinct overrides. On error nothing changes.
    pub fn set_override(
        &mut self,
        kind: OverrideKind,
        if_name: &str,
        link: Option<u32>,
        value: u32,
        source: ParamSource,
    ) -> Result<(), ParamError> {
        let entry = IfOverride::new(kind, if_name, link, value, source, if_name)?;
        self.put_override(entry, if_name, Precedence::Replace)
            .map(|_| ())
    }

    /// Stores `entry` (replacing the one of the same kind, interface and
    /// link unless `precedence` keeps it); `target` is what errors quote.
    fn put_override(
        &mut self,
        entry: IfOverride,
        target: &str,
        precedence: Precedence,
    ) -> Result<bool, ParamError> {
        let n = self.n_overrides;
        let existing = self.overrides.get_mut(..n).unwrap_or(&mut []);
        if let Some(prev) = existing.iter_mut().find(|o| o.same_slot(&entry)) {
            if precedence == Precedence::KeepCode && prev.source == ParamSource::Code {
                return Ok(false);
            }
            *prev = entry;
            return Ok(true);
        }
        let slot = self
            .overrides
            .get_mut(n)
            .ok_or(ParamError::TooManyOverrides {
                component: COMPONENT,
                param: entry.kind.name(),
                target: ParamName::new(target),
                what: "per-interface bandwidth/latency settings",
                cap: OVERRIDE_CAP,
            })?;
        *slot = entry;
        self.n_overrides += 1;
        Ok(true)
    }

    /// Sets the override named by `rest` (`<if>` or `<if>:<link>`, what
    /// follows `bandwidth_` / `latency_`) to `value` (a number, or text
    /// parsed as a number).
    fn set_override_from(
        &mut self,
        kind: OverrideKind,
        rest: &str,
        setting: Setting<'_>,
    ) -> Result<bool, ParamError> {
        let bad = |reason| bad_override(kind, rest, reason);
        let (if_name, link) = match rest.rsplit_once(':') {
            Some((if_name, link)) => {
                let link = link
                    .parse::<u32>()
                    .map_err(|_| bad("the link after `:` must be a number >= 0"))?;
                (if_name, Some(link))
            }
            None => (rest, None),
        };
        const OUT_OF_RANGE: &str = "out of range; it accepts an integer between 0 and 4294967295";
        let value = match setting.value {
            Value::Int(v) => v,
            Value::Text(text) => parse_int(text).map_err(|e| match e {
                NumberError::Overflow { .. } => bad(OUT_OF_RANGE),
                NumberError::Malformed => {
                    bad("malformed value; it accepts an integer between 0 and 4294967295")
                }
            })?,
        };
        let value = u32::try_from(value).map_err(|_| bad(OUT_OF_RANGE))?;
        let entry = IfOverride::new(kind, if_name, link, value, setting.source, rest)?;
        self.put_override(entry, rest, setting.precedence)
    }

    /// The seed's open-time rule: `if_include` and `if_exclude` are mutually
    /// exclusive — an error when `if_include` has at least one entry and
    /// `if_exclude` is not its default ([`DEFAULT_IF_EXCLUDE`]).
    pub fn check_exclusive(&self) -> Result<(), ParamError> {
        let include_given = iflist::entries(self.if_include()).next().is_some();
        if include_given && self.if_exclude() != DEFAULT_IF_EXCLUDE {
            return Err(ParamError::Conflict {
                component: COMPONENT,
                name: TextParamId::IfInclude.def().name,
                other: TextParamId::IfExclude.def().name,
                rule: "if_include and if_exclude are mutually exclusive; set only one of them",
            });
        }
        Ok(())
    }
}

/// [`ParamError::BadOverride`] for `<kind>_<target>`.
fn bad_override(kind: OverrideKind, target: &str, reason: &'static str) -> ParamError {
    ParamError::BadOverride {
        component: COMPONENT,
        param: kind.name(),
        target: ParamName::new(target),
        reason,
    }
}

impl IfOverride {
    /// An override, checking the interface name; `target` is what errors
    /// quote.
    fn new(
        kind: OverrideKind,
        if_name: &str,
        link: Option<u32>,
        value: u32,
        source: ParamSource,
        target: &str,
    ) -> Result<IfOverride, ParamError> {
        let bad = |reason| bad_override(kind, target, reason);
        if if_name.is_empty() {
            return Err(bad("the interface name is empty"));
        }
        if if_name.contains(':') {
            return Err(bad("the interface name contains `:`"));
        }
        let if_name =
            FixedStr::new(if_name).ok_or(bad("the interface name is longer than 16 bytes"))?;
        Ok(IfOverride {
            kind,
            if_name,
            link,
            value,
            source,
        })
    }
}

/// `bandwidth_<rest>` / `latency_<rest>` (prefix ASCII case-insensitive) →
/// the kind and `<rest>`.
fn split_override(name: &str) -> Option<(OverrideKind, &str)> {
    [OverrideKind::Bandwidth, OverrideKind::Latency]
        .into_iter()
        .find_map(|kind| {
            // Compared as bytes: `name` may hold any characters, and the
            // prefix's length need not fall on one of their boundaries.
            let prefix = kind.name().as_bytes();
            let bytes = name.as_bytes();
            let word = bytes.get(..prefix.len())?;
            let sep = bytes.get(prefix.len())?;
            if !word.eq_ignore_ascii_case(prefix) || *sep != b'_' {
                return None;
            }
            // An ASCII prefix and `_` end on a character boundary.
            Some((kind, name.get(prefix.len() + 1..)?))
        })
}

/// The registry's view of [`TcpParams`], and the seed's verify and open
/// rules.
///
/// [`Params::set`] also takes the per-interface overrides
/// (`bandwidth_<if>`, `latency_<if>`, `bandwidth_<if>:<link>`,
/// `latency_<if>:<link>`; environment `BTL_TCP_BANDWIDTH_ETH0`,
/// `BTL_TCP_LATENCY_ETH0:1`, `OMPI_MCA_btl_tcp_bandwidth_eth0`, ...); the
/// interface lists are stored as given (at most [`TEXT_CAP`] bytes) and
/// their syntax is checked by verify and by interface selection.
///
/// [`Params::verify`] errors (nothing is changed then): a value outside its
/// own range (`links` < 1, `endpoint_cache` < 64, `disable_family` not 0, 4
/// or 6, `max_frame` > 1 GiB, ...); `flags` without send; `max_send_size` <
/// `eager_limit`; `free_list_max` not -1 and < `free_list_num`; a set
/// `max_frame` < `max_send_size`; `if_include` together with a non-default
/// `if_exclude`; a malformed entry in either list.
///
/// Adjustments (each logged — as a warning when the user set one of the
/// parameters involved —, recorded in the result and in
/// [`crate::params::ParamInfo::adjusted`]): an invalid `port_min_v4` /
/// `port_min_v6` (0, negative or > 65535) is reset to 1024, as the seed
/// does; a set `port_range_*` is clamped so that `port_min + port_range <=
/// 65536`; `rndv_eager_limit` is clamped to `eager_limit`;
/// `min_rdma_pipeline_size` is raised to at least `eager_limit +
/// rdma_pipeline_send_length` (saturating at `u32::MAX`).
///
/// Verify is idempotent: a second call adjusts nothing.
impl Params for TcpParams {
    type Key = TcpParam;

    fn value(&self, key: TcpParam) -> Value<'_> {
        match key {
            TcpParam::Num(id) => Value::Int(self.get(id)),
            TcpParam::Text(id) => Value::Text(self.text(id)),
        }
    }

    fn store(&mut self, key: TcpParam, v: Assign<'_>) -> Result<(), ParamError> {
        let id = match key {
            TcpParam::Text(TextParamId::IfInclude) => {
                self.if_include = v.to_text()?;
                return Ok(());
            }
            TcpParam::Text(TextParamId::IfExclude) => {
                self.if_exclude = v.to_text()?;
                return Ok(());
            }
            TcpParam::Num(id) => id,
        };
        match id {
            TcpParamId::Links => self.links = v.to_u32()?,
            TcpParamId::FreeListNum => self.free_list_num = v.to_i32()?,
            TcpParamId::FreeListMax => self.free_list_max = v.to_i32()?,
            TcpParamId::FreeListInc => self.free_list_inc = v.to_i32()?,
            TcpParamId::Sndbuf => self.sndbuf = v.to_i32()?,
            TcpParamId::Rcvbuf => self.rcvbuf = v.to_i32()?,
            TcpParamId::EndpointCache => self.endpoint_cache = v.to_i32()?,
            TcpParamId::UseNagle => self.use_nagle = v.to_bool()?,
            TcpParamId::WriteCombine => self.write_combine = v.to_i32()?,
            TcpParamId::PortMinV4 => self.port_min_v4 = v.to_i32()?,
            TcpParamId::PortRangeV4 => self.port_range_v4 = Some(v.to_i32()?),
            TcpParamId::PortMinV6 => self.port_min_v6 = v.to_i32()?,
            TcpParamId::PortRangeV6 => self.port_range_v6 = Some(v.to_i32()?),
            TcpParamId::WarnAllUnfoundInterfaces => {
                self.warn_all_unfound_interfaces = v.to_bool()?
            }
            TcpParamId::Exclusivity => self.exclusivity = v.to_u32()?,
            TcpParamId::Flags => self.flags = v.to_u32()?,
            TcpParamId::RndvEagerLimit => self.rndv_eager_limit = v.to_u32()?,
            TcpParamId::EagerLimit => self.eager_limit = v.to_u32()?,
            TcpParamId::MaxSendSize => self.max_send_size = v.to_u32()?,
            TcpParamId::RdmaPipelineSendLength => self.rdma_pipeline_send_length = v.to_u32()?,
            TcpParamId::RdmaPipelineFragSize => self.rdma_pipeline_frag_size = v.to_u32()?,
            TcpParamId::MinRdmaPipelineSize => self.min_rdma_pipeline_size = v.to_u32()?,
            TcpParamId::Latency => self.latency = v.to_u32()?,
            TcpParamId::Bandwidth => self.bandwidth = v.to_u32()?,
            TcpParamId::DisableFamily => self.disable_family = v.to_u32()?,
            TcpParamId::MaxFrame => self.max_frame = Some(v.to_u32()?),
            TcpParamId::HandshakeTimeout => self.handshake_timeout = v.to_u32()?,
            TcpParamId::KeepaliveTime => self.keepalive_time = v.to_u32()?,
            TcpParamId::KeepaliveIntvl => self.keepalive_intvl = v.to_u32()?,
            TcpParamId::KeepaliveProbes => self.keepalive_probes = v.to_u32()?,
            TcpParamId::UserTimeout => self.user_timeout = v.to_u32()?,
            TcpParamId::QueueBytes => self.queue_bytes = v.to_u32()?,
            TcpParamId::QueueMessages => self.queue_messages = v.to_u32()?,
            TcpParamId::RecvLowat => self.recv_lowat = v.to_u32()?,
        }
        Ok(())
    }

    fn state(&self) -> &ParamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut ParamState {
        &mut self.state
    }

    fn default_value(&self, key: TcpParam) -> Value<'_> {
        match key {
            TcpParam::Num(id) => Value::Int(self.default_of(id)),
            TcpParam::Text(_) => key.def().default,
        }
    }

    fn is_set(&self, key: TcpParam) -> Option<bool> {
        match key {
            TcpParam::Num(TcpParamId::PortRangeV4) => Some(self.port_range_v4.is_some()),
            TcpParam::Num(TcpParamId::PortRangeV6) => Some(self.port_range_v6.is_some()),
            TcpParam::Num(TcpParamId::MaxFrame) => Some(self.max_frame.is_some()),
            _ => None,
        }
    }

    fn set_other(&mut self, name: &str, setting: Setting<'_>) -> Option<Result<bool, ParamError>> {
        let (kind, rest) = split_override(name)?;
        Some(self.set_override_from(kind, rest, setting))
    }

    fn check_rules(&self) -> Result<(), ParamError> {
        base::check(self, &BASE)?;
        if self.max_frame.is_some_and(|m| m < self.max_send_size) {
            return Err(ParamError::Conflict {
                component: COMPONENT,
                name: TcpParamId::MaxFrame.def().name,
                other: TcpParamId::MaxSendSize.def().name,
                rule: "max_frame must be >= max_send_size (a peer sends frames of up to \
                       max_send_size)",
            });
        }
        self.check_exclusive()?;
        for id in TextParamId::ALL {
            iflist::validate_list(id.def(), self.text(id))?;
        }
        Ok(())
    }

    fn apply_rules(&mut self, out: &mut Verified<TcpParam>) -> Result<(), ParamError> {
        // Seed verify: an invalid minimum port is reset to 1024, with a
        // warning, not refused.
        for (min, range) in [
            (TcpParamId::PortMinV4, TcpParamId::PortRangeV4),
            (TcpParamId::PortMinV6, TcpParamId::PortRangeV6),
        ] {
            let port_min = self.get(min);
            if !(1..=PORT_MAX).contains(&port_min) {
                self.adjust(
                    out,
                    min,
                    i64::from(DEFAULT_PORT_MIN),
                    "not a valid port (1 to 65535); reset to 1024",
                    &[],
                )?;
            }
            // A set range must end by port 65535 (a range left to follow
            // port_min always does).
            if self.is_set(range.into()) == Some(true) {
                let port_min = self.get(min);
                let limit = 65536 - port_min;
                if self.get(range) > limit {
                    self.adjust(
                        out,
                        range,
                        limit,
                        "clamped so that port_min + port_range <= 65536",
                        &[min],
                    )?;
                }
            }
        }
        // Base: rndv_eager_limit <= eager_limit, min_rdma_pipeline_size >=
        // eager_limit + rdma_pipeline_send_length.
        base::adjust(self, out, &BASE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::tests::check_table;
    use std::string::ToString;

    #[test]
    fn table_matches_ids_and_defaults() {
        check_table::<TcpParams>();
        let p = TcpParams::new();
        for (i, id) in TcpParamId::ALL.into_iter().enumerate() {
            assert_eq!(id.index(), i);
            let def = id.def();
            assert_eq!(def.component, "tcp");
            assert_eq!(Value::Int(p.get(id)), def.default, "{}", def.name);
            assert_eq!(Value::Int(p.default_of(id)), def.default, "{}", def.name);
            assert_eq!(TcpParamId::from_name(def.name), Some(id));
            assert_eq!(p.source(id), ParamSource::Default, "{}", def.name);
        }
        assert_eq!(TcpParams::default(), p);
        let names: std::vec::Vec<_> = TcpParam::ALL.iter().map(|p| p.def().name).collect();
        assert_eq!(
            names[..4],
            ["links", "if_include", "if_exclude", "free_list_num"]
        );
        assert_eq!(names.last(), Some(&"recv_lowat"));
        for (i, a) in TcpParam::ALL.iter().enumerate() {
            assert!(
                TcpParam::ALL[..i].iter().all(|b| b != a),
                "{}",
                a.def().name
            );
            assert_eq!(TcpParam::from_name(a.def().name), Some(*a));
            assert_eq!(a.index(), i);
            assert_eq!(TCP_PARAMS[i].name, a.def().name);
        }
        for id in TextParamId::ALL {
            assert_eq!(TextParamId::from_name(id.def().name), Some(id));
            assert_eq!(TcpParamId::from_name(id.def().name), None);
            assert_eq!(p.source(id), ParamSource::Default);
        }
        assert_eq!(
            (p.links, p.free_list_num, p.free_list_max, p.free_list_inc),
            (1, 8, -1, 32)
        );
        assert_eq!((p.sndbuf, p.rcvbuf, p.endpoint_cache), (0, 0, 30720));
        assert_eq!(
            (p.exclusivity, p.flags),
            (100, FLAG_SEND | FLAG_PUT | FLAG_GET)
        );
        assert_eq!(
            (p.eager_limit, p.rndv_eager_limit, p.max_send_size),
            (65536, 65536, 131072)
        );
        assert_eq!(
            (p.bandwidth, p.latency, p.handshake_timeout),
            (100, 100, 10_000)
        );
        assert_eq!((p.if_include(), p.if_exclude()), ("", "127.0.0.1/8,sppp"));
        assert_eq!(p.max_frame(), DEFAULT_MAX_FRAME);
        assert_eq!(p.port_range(IpFamily::V4), 64511);
        assert_eq!(p.listen_ports(IpFamily::V6), 1024..=65534);
        assert!(p.family_enabled(IpFamily::V4) && p.family_enabled(IpFamily::V6));
    }

    #[test]
    fn env_names_and_sources() {
        let mut p = TcpParams::new();
        assert_eq!(
            TcpParam::Text(TextParamId::IfInclude)
                .def()
                .env_name()
                .to_string(),
            "BTL_TCP_IF_INCLUDE"
        );
        assert_eq!(
            TcpParamId::PortMinV6.def().ompi_env_name().to_string(),
            "OMPI_MCA_btl_tcp_port_min_v6"
        );
        assert_eq!(
            TextParamId::IfExclude.def().ompi_env_name().to_string(),
            "OMPI_MCA_btl_tcp_if_exclude"
        );
        assert_eq!(
            TcpParam::from_env_name("BTL_TCP_if_Include"),
            Some(TcpParam::Text(TextParamId::IfInclude))
        );
        assert!(TcpParam::from_env_name("BTL_SM_LINKS").is_none());
        assert_eq!(p.set_from_env_var("BTL_SM_FIFO_SIZE", "1"), Ok(false));
        assert_eq!(p.set_from_env_var("BTL_TCP_LINKS", "2"), Ok(true));
        assert_eq!(
            p.set_from_env_var("OMPI_MCA_btl_tcp_if_include", "eth0,10.0.0.0/8"),
            Ok(true)
        );
        assert_eq!((p.links, p.if_include()), (2, "eth0,10.0.0.0/8"));
        assert_eq!(p.source(TcpParamId::Links), ParamSource::Environment);
        assert_eq!(p.source(TextParamId::IfInclude), ParamSource::Environment);
        p.bandwidth = 7;
        p.max_frame = Some(1 << 20);
        assert_eq!(p.source(TcpParamId::Bandwidth), ParamSource::Code);
        assert_eq!(p.source(TcpParamId::MaxFrame), ParamSource::Code);
        assert_eq!(p.source(TcpParamId::Latency), ParamSource::Default);
        let e = p.set_from_env_var("BTL_TCP_LINK", "1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown tcp parameter `BTL_TCP_LINK` (see `btl info`)"
        );
        let info: std::vec::Vec<_> = p.iter().collect();
        assert_eq!(info.len(), TCP_PARAM_COUNT);
        assert_eq!(info[1].value, Value::Text("eth0,10.0.0.0/8"));
        assert_eq!(info[2].default.to_string(), "127.0.0.1/8,sppp");
        assert_eq!(info[0].value, Value::Int(2));
    }

    #[test]
    fn parsing_and_domains() {
        let mut p = TcpParams::new();
        p.set("sndbuf", "1M", ParamSource::Code).unwrap();
        p.set("RCVBUF", "128k", ParamSource::Code).unwrap();
        p.set("use_nagle", "yes", ParamSource::Code).unwrap();
        p.set("endpoint_cache", "0x40", ParamSource::Code).unwrap();
        assert_eq!(
            (p.sndbuf, p.rcvbuf, p.use_nagle, p.endpoint_cache),
            (1 << 20, 128 << 10, true, 64)
        );
        let cases: [(&str, &str, &str); 8] = [
            (
                "links",
                "0",
                "BTL_TCP_LINKS=0 is out of range; it accepts an integer >= 1",
            ),
            (
                "endpoint_cache",
                "63",
                "BTL_TCP_ENDPOINT_CACHE=63 is out of range",
            ),
            (
                "disable_family",
                "5",
                "BTL_TCP_DISABLE_FAMILY=5 is out of range",
            ),
            (
                "max_frame",
                "2g",
                "BTL_TCP_MAX_FRAME=2147483648 is out of range",
            ),
            (
                "handshake_timeout",
                "0",
                "BTL_TCP_HANDSHAKE_TIMEOUT=0 is out of range",
            ),
            ("sndbuf", "-1", "BTL_TCP_SNDBUF=-1 is out of range"),
            (
                "port_range_v4",
                "0",
                "BTL_TCP_PORT_RANGE_V4=0 is out of range",
            ),
            (
                "links",
                "two",
                "BTL_TCP_LINKS: malformed value; it accepts an integer >= 1",
            ),
        ];
        for (name, value, msg) in cases {
            let e = p.set(name, value, ParamSource::Code).unwrap_err();
            assert!(e.to_string().starts_with(msg), "{e}");
        }
        for ok in ["0", "4", "6"] {
            p.set("disable_family", ok, ParamSource::Code).unwrap();
        }
        assert_eq!(p.disabled_family(), Some(IpFamily::V6));
        assert!(matches!(
            p.set("links", "99999999999999999999999", ParamSource::Code),
            Err(ParamError::OutOfRange {
                value: i64::MAX,
                ..
            })
        ));
        // Invalid ports are accepted here; verify resets them.
        p.set("port_min_v4", "70000", ParamSource::Code).unwrap();
        let long = "x".repeat(TEXT_CAP + 1);
        let e = p.set("if_exclude", &long, ParamSource::Code).unwrap_err();
        assert_eq!(
            e.to_string(),
            "BTL_TCP_IF_EXCLUDE: the value is 257 bytes long; it accepts at most 256 bytes"
        );
        assert_eq!(
            p.if_exclude(),
            DEFAULT_IF_EXCLUDE,
            "failed sets change nothing"
        );
        p.set("if_exclude", &long[1..], ParamSource::Code).unwrap();
        assert_eq!(p.if_exclude().len(), TEXT_CAP);
    }

    #[test]
    fn verify_defaults_and_errors() {
        let mut p = TcpParams::new();
        let v = p.verify().unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(p.min_rdma_pipeline_size, 64 * 1024 + 128 * 1024);
        assert_eq!(
            p.source(TcpParamId::MinRdmaPipelineSize),
            ParamSource::Default
        );
        assert!(p.verify().unwrap().is_empty(), "idempotent");

        type Case = (fn(&mut TcpParams), &'static str);
        let cases: [Case; 7] = [
            (|p| p.links = 0, "BTL_TCP_LINKS=0 is out of range"),
            (|p| p.flags = FLAG_GET, "BTL_TCP_FLAGS=4 is out of range"),
            (
                |p| p.max_send_size = 1000,
                "BTL_TCP_MAX_SEND_SIZE conflicts with BTL_TCP_EAGER_LIMIT",
            ),
            (
                |p| p.free_list_max = 4,
                "BTL_TCP_FREE_LIST_MAX conflicts with BTL_TCP_FREE_LIST_NUM",
            ),
            (
                |p| p.max_frame = Some(65536),
                "BTL_TCP_MAX_FRAME conflicts with BTL_TCP_MAX_SEND_SIZE",
            ),
            (|p| p.disable_family = 5, "BTL_TCP_DISABLE_FAMILY=5"),
            (
                |p| {
                    p.set("if_exclude", "10.0.0.0/40", ParamSource::Code)
                        .unwrap()
                },
                "BTL_TCP_IF_EXCLUDE: malformed entry `10.0.0.0/40`",
            ),
        ];
        for (f, msg) in cases {
            let mut p = TcpParams::new();
            f(&mut p);
            p.rndv_eager_limit = u32::MAX;
            let before = p.clone();
            let e = p.verify().unwrap_err();
            assert!(e.to_string().starts_with(msg), "{e}");
            assert_eq!(p, before);
        }
        // max_frame is at least max_send_size unless set.
        let mut p = TcpParams::new();
        p.max_send_size = 1 << 27;
        p.verify().unwrap();
        assert_eq!(p.max_frame(), 1 << 27);
        p.max_frame = Some(1 << 30);
        p.verify().unwrap();
        assert_eq!(p.max_frame(), 1 << 30);
    }

    #[test]
    fn include_exclude_conflict() {
        let mut p = TcpParams::new();
        p.set("if_include", "eth0", ParamSource::Environment)
            .unwrap();
        p.verify().unwrap();
        p.set("if_exclude", DEFAULT_IF_EXCLUDE, ParamSource::Environment)
            .unwrap();
        p.verify().unwrap();
        p.set("if_exclude", "eth1", ParamSource::Environment)
            .unwrap();
        let e = p.verify().unwrap_err();
        assert_eq!(
            e.to_string(),
            "BTL_TCP_IF_INCLUDE conflicts with BTL_TCP_IF_EXCLUDE: if_include and if_exclude \
             are mutually exclusive; set only one of them"
        );
        assert_eq!(p.check_exclusive(), Err(e));
    }

    #[test]
    fn port_reset_with_warning() {
        for bad in ["0", "70000", "-5"] {
            let mut p = TcpParams::new();
            p.set("port_min_v4", bad, ParamSource::Environment).unwrap();
            p.set("port_min_v6", "2000", ParamSource::Environment)
                .unwrap();
            assert_eq!(p.listen_ports(IpFamily::V4), 1024..=65534);
            let v = p.verify().unwrap();
            let a = v.get(TcpParamId::PortMinV4).unwrap();
            assert_eq!((a.to, p.port_min_v4), (1024, 1024));
            assert!(a.to_string().starts_with(&std::format!(
                "BTL_TCP_PORT_MIN_V4 adjusted from {bad} to 1024"
            )));
            assert!(p.is_adjusted(TcpParamId::PortMinV4));
            assert_eq!(p.port_range(IpFamily::V4), 64511);
            // The range follows the (valid) port_min.
            assert_eq!(p.port_range(IpFamily::V6), 63535);
            assert_eq!(p.default_of(TcpParamId::PortRangeV6), 63535);
            assert_eq!(p.listen_ports(IpFamily::V6), 2000..=65534);
            assert!(v.get(TcpParamId::PortMinV6).is_none());
        }
        // A set range is clamped to end by port 65535.
        let mut p = TcpParams::new();
        p.set("port_min_v4", "65000", ParamSource::Code).unwrap();
        p.set("port_range_v4", "1000", ParamSource::Code).unwrap();
        assert_eq!(p.listen_ports(IpFamily::V4), 65000..=65535);
        let v = p.verify().unwrap();
        assert_eq!(v.get(TcpParamId::PortRangeV4).map(|a| a.to), Some(536));
        assert_eq!(p.source(TcpParamId::PortRangeV4), ParamSource::Code);
        assert!(p.verify().unwrap().is_empty());
        p.port_min_v6 = 65535;
        assert_eq!(p.listen_ports(IpFamily::V6), 65535..=65535);
    }

    /// Found by the `params` fuzz target: a variable name with a
    /// multi-byte character where the `bandwidth_` prefix would end
    /// panicked (`split_at` inside a character) instead of being parsed.
    #[test]
    fn override_names_with_multibyte_characters() {
        let mut p = TcpParams::new();
        // "LATENCY_" + U+074D: byte 9 is inside the character.
        assert_eq!(
            p.set_from_env_var("BTL_TCP_LATENCY_\u{74d}L", "0"),
            Ok(true)
        );
        assert_eq!(
            p.override_value(OverrideKind::Latency, "\u{74d}L", None),
            Some(0)
        );
        for var in [
            "BTL_TCP_\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}",
            "BTL_TCP_BANDWIDT\u{e9}_eth0",
            "OMPI_MCA_btl_tcp_bandwidth\u{e9}",
        ] {
            assert!(
                matches!(
                    p.set_from_env_var(var, "1"),
                    Err(ParamError::UnknownParam { .. })
                ),
                "{var}"
            );
        }
    }

    #[test]
    fn per_interface_overrides() {
        let mut p = TcpParams::new();
        assert_eq!(
            p.set_from_env_var("BTL_TCP_BANDWIDTH_ETH0", "1000"),
            Ok(true)
        );
        assert_eq!(
            p.set_from_env_var("OMPI_MCA_btl_tcp_latency_eth0:1", "50"),
            Ok(true)
        );
        p.set("bandwidth_ib0", "2k", ParamSource::Code).unwrap();
        p.set("BANDWIDTH_eth0", "900", ParamSource::Code).unwrap();
        assert_eq!(p.overrides().len(), 3, "same interface and link replaced");
        assert_eq!(
            p.override_value(OverrideKind::Bandwidth, "eth0", None),
            Some(900)
        );
        assert_eq!(
            p.override_value(OverrideKind::Bandwidth, "eth0", Some(0)),
            None
        );
        assert_eq!(
            p.override_value(OverrideKind::Latency, "ETH0", Some(1)),
            Some(50)
        );
        assert_eq!(
            p.override_value(OverrideKind::Bandwidth, "ib0", None),
            Some(2048)
        );
        let o = &p.overrides()[1];
        assert_eq!(o.name().to_string(), "latency_eth0:1");
        assert_eq!(o.env_name().to_string(), "BTL_TCP_LATENCY_ETH0:1");
        assert_eq!(o.source(), ParamSource::Environment);
        assert_eq!(p.bandwidth, 100, "the base parameter is untouched");

        let errs = [
            (
                "BTL_TCP_BANDWIDTH_ETH0:x",
                "1",
                "BTL_TCP_BANDWIDTH_ETH0:X: the link after",
            ),
            (
                "BTL_TCP_BANDWIDTH_",
                "1",
                "BTL_TCP_BANDWIDTH_: the interface name is empty",
            ),
            (
                "BTL_TCP_LATENCY_ETH0",
                "-1",
                "BTL_TCP_LATENCY_ETH0: out of range",
            ),
            (
                "BTL_TCP_LATENCY_ETH0",
                "fast",
                "BTL_TCP_LATENCY_ETH0: malformed value",
            ),
            (
                "BTL_TCP_LATENCY_A_VERY_LONG_IFNAME",
                "1",
                "BTL_TCP_LATENCY_A_VERY_LONG_IFNAME: the interface name is longer",
            ),
        ];
        for (var, value, msg) in errs {
            let e = p.set_from_env_var(var, value).unwrap_err();
            assert!(e.to_string().starts_with(msg), "{e}");
        }
        for i in 3..OVERRIDE_CAP {
            p.set_override(
                OverrideKind::Latency,
                "eth1",
                Some(i as u32),
                1,
                ParamSource::Code,
            )
            .unwrap();
        }
        let e = p
            .set_from_env_var("BTL_TCP_BANDWIDTH_ETH9", "1")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "BTL_TCP_BANDWIDTH_ETH9: too many per-interface bandwidth/latency settings (at most \
             16)"
        );
        let e = p
            .set_override(OverrideKind::Latency, "", None, 1, ParamSource::Code)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "BTL_TCP_LATENCY_: the interface name is empty"
        );
        // Replacing an existing one still works when full.
        p.set_from_env_var("BTL_TCP_BANDWIDTH_ETH0", "1").unwrap();
        assert_eq!(p.overrides().len(), OVERRIDE_CAP);
    }
}
