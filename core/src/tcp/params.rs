//! The `tcp` component's parameters: the seed's names, defaults, help texts
//! and validation rules, without an allocator, in the style of
//! [`crate::sm::params`] (whose [`ParamDef`], [`ParamKind`], [`ParamSource`],
//! [`ParamName`] and [`env_name`] are reused here).
//!
//! - [`TCP_PARAMS`] is the static table of the numeric parameters, indexed
//!   by [`TcpParamId`]; [`TCP_TEXT_PARAMS`] holds the two string parameters
//!   (`if_include`, `if_exclude`), indexed by [`TextParamId`]. [`TcpParam`]
//!   names either kind and lists all of them in the seed's registration
//!   order ([`TcpParam::ALL`]).
//! - [`TcpParams`] holds one typed field per numeric parameter, the two
//!   strings in fixed 256-byte storage ([`TEXT_CAP`]), a fixed list of
//!   per-interface `bandwidth_<if>` / `latency_<if>` overrides
//!   ([`IfOverride`], at most [`OVERRIDE_CAP`]), and where every value came
//!   from. Values are set from code (assign a field, [`TcpParams::set`],
//!   [`TcpParams::set_text`], [`TcpParams::set_override`]) or from the
//!   environment ([`TcpParams::set_from_env_var`], which understands
//!   `BTL_TCP_IF_INCLUDE`, `BTL_TCP_BANDWIDTH_ETH0`, and Open MPI's
//!   `OMPI_MCA_btl_tcp_if_include` / `OMPI_MCA_btl_tcp_bandwidth_eth0:1`).
//! - [`TcpParams::verify`] applies the seed's register/verify/open rules and
//!   Open MPI's base BTL checks: it either fails without changing anything,
//!   or adjusts values and returns what it adjusted ([`TcpVerified`]).
//! - [`TcpParams::iter`] lists every parameter with its value, default and
//!   source for `btl info` ([`TcpParamInfo`], whose [`TcpValue`] is a number
//!   or a string).
//!
//! Every error ([`TcpParamError`]) names the parameter as the user types it
//! in the environment (`BTL_TCP_LINKS`) and says what it accepts.
//!
//! Two parameters have a default computed from another one: `port_range_v4`
//! / `port_range_v6` default to `65536 - port_min - 1` (the seed's formula,
//! from the current, valid `port_min`), and `max_frame` defaults to
//! `max_send_size`. Their fields are `Option`s: `None` follows the other
//! parameter, `Some` is a value someone set.
//!
//! BTL base values: the seed's `tcp` values where it sets them
//! (`rdma_pipeline_send_length` 128 KiB, `rdma_pipeline_frag_size`
//! `INT_MAX`, `min_rdma_pipeline_size` 0, which verify raises to
//! `eager_limit` plus `rdma_pipeline_send_length` by Open MPI's base rule,
//! as for `sm`). `flags` defaults to send | put | get, the operations btl's
//! TCP transport provides (the seed's other flag bits — send-in-place,
//! checksum, ack, heterogeneous RDMA — describe Open MPI's PML interplay
//! and have no meaning here).

use core::fmt;
use core::ops::RangeInclusive;

use super::ifsel::{self, SpecError};
use crate::sm::params::{
    env_name, EnvName, ParamDef, ParamKind, ParamName, ParamSource, FLAG_GET, FLAG_PUT, FLAG_SEND,
};

/// Name of the component, the middle part of `BTL_TCP_LINKS`.
pub const COMPONENT: &str = "tcp";

/// Number of numeric parameters (the length of [`TCP_PARAMS`]).
pub const TCP_NUM_PARAM_COUNT: usize = 26;

/// Number of string parameters (the length of [`TCP_TEXT_PARAMS`]).
pub const TCP_TEXT_PARAM_COUNT: usize = 2;

/// Number of parameters of the `tcp` component (the length of
/// [`TcpParam::ALL`]).
pub const TCP_PARAM_COUNT: usize = TCP_NUM_PARAM_COUNT + TCP_TEXT_PARAM_COUNT;

/// Capacity in bytes of a string parameter's value (`if_include`,
/// `if_exclude`); a longer value is [`TcpParamError::TooLong`].
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

/// Identifies one numeric `tcp` parameter; its discriminant indexes
/// [`TCP_PARAMS`].
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
    ];

    /// Index into [`TCP_PARAMS`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The parameter's definition.
    pub fn def(self) -> &'static ParamDef {
        &TCP_PARAMS[self.index()]
    }

    /// Looks a numeric parameter up by name (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<TcpParamId> {
        TcpParamId::ALL
            .into_iter()
            .find(|id| id.def().name.eq_ignore_ascii_case(name))
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

const I32_MAX: i64 = i32::MAX as i64;
const I32_MIN: i64 = i32::MIN as i64;
const U32_MAX: i64 = u32::MAX as i64;
const PORT_MAX: i64 = u16::MAX as i64;

const ACCEPTS_U32: &str = "an integer between 0 and 4294967295";
const ACCEPTS_SIZE: &str = "a size in bytes between 0 and 4294967295 (k, M, G suffixes allowed)";
const ACCEPTS_BOOL: &str = "0, 1, true, false, yes or no";
const ACCEPTS_PORT_MIN: &str =
    "a port number between 1 and 65535 (an invalid one is reset to 1024 with a warning)";
const HELP_PORT_MIN: &str = "The minimum port where the TCP BTL will try to bind (default 1024)";

const fn pdef(
    name: &'static str,
    kind: ParamKind,
    default: i64,
    (min, max): (i64, i64),
    level: u8,
    accepts: &'static str,
    help: &'static str,
) -> ParamDef {
    ParamDef {
        component: COMPONENT,
        name,
        kind,
        default,
        min,
        max,
        help,
        accepts,
        level,
    }
}

/// The `tcp` component's numeric parameters (component parameters in the
/// seed's registration order, then the BTL base parameters, then
/// `disable_family`, then btl's own `max_frame` and `handshake_timeout`),
/// indexed by [`TcpParamId`]. The string parameters are in
/// [`TCP_TEXT_PARAMS`].
///
/// The `default` of `port_range_v4` / `port_range_v6` (64511) and of
/// `max_frame` (131072) is the one for the default `port_min` and
/// `max_send_size`; the actual default follows those parameters
/// ([`TcpParamInfo::default`] shows it).
pub static TCP_PARAMS: [ParamDef; TCP_NUM_PARAM_COUNT] = [
    pdef(
        "links",
        ParamKind::UInt,
        1,
        (1, U32_MAX),
        4,
        "an integer >= 1",
        "Number of TCP links (BTL instances) to create for each selected interface; each further \
         link gets half the bandwidth and twice the latency of the previous one.",
    ),
    pdef(
        "free_list_num",
        ParamKind::Int,
        8,
        (0, I32_MAX),
        5,
        "an integer >= 0",
        "Number of fragments of each kind each process allocates up front.",
    ),
    pdef(
        "free_list_max",
        ParamKind::Int,
        -1,
        (-1, I32_MAX),
        5,
        "-1 (unlimited) or an integer >= free_list_num",
        "Maximum number of fragments in each free list (-1 = unlimited).",
    ),
    pdef(
        "free_list_inc",
        ParamKind::Int,
        32,
        (1, I32_MAX),
        5,
        "an integer >= 1",
        "Number of fragments a free list grows by when it runs empty.",
    ),
    pdef(
        "sndbuf",
        ParamKind::Size,
        128 * 1024,
        (0, I32_MAX),
        4,
        "a size in bytes between 0 and 2147483647 (0 = the kernel default; k, M, G suffixes \
         allowed)",
        "Size (in bytes) of the kernel send buffer of each TCP socket (0 = leave the kernel \
         default).",
    ),
    pdef(
        "rcvbuf",
        ParamKind::Size,
        128 * 1024,
        (0, I32_MAX),
        4,
        "a size in bytes between 0 and 2147483647 (0 = the kernel default; k, M, G suffixes \
         allowed)",
        "Size (in bytes) of the kernel receive buffer of each TCP socket (0 = leave the kernel \
         default).",
    ),
    pdef(
        "endpoint_cache",
        ParamKind::Size,
        30 * 1024,
        (64, I32_MAX),
        4,
        "a size in bytes between 64 and 2147483647 (k, M, G suffixes allowed)",
        "The size of the internal cache for each TCP connection. This cache is used to reduce \
         the number of syscalls, by replacing them with memcpy. Every read will read the \
         expected data plus the amount of the endpoint_cache",
    ),
    pdef(
        "use_nagle",
        ParamKind::Bool,
        0,
        (0, 1),
        4,
        ACCEPTS_BOOL,
        "Whether to use Nagle's algorithm or not (using Nagle's algorithm may increase short \
         message latency)",
    ),
    pdef(
        "port_min_v4",
        ParamKind::Int,
        DEFAULT_PORT_MIN as i64,
        (I32_MIN, I32_MAX),
        2,
        ACCEPTS_PORT_MIN,
        HELP_PORT_MIN,
    ),
    pdef(
        "port_range_v4",
        ParamKind::Int,
        65536 - DEFAULT_PORT_MIN as i64 - 1,
        (1, PORT_MAX),
        2,
        "an integer between 1 and 65535 (clamped so that port_min_v4 + port_range_v4 <= 65536)",
        "The number of ports where the TCP BTL will try to bind (default 65536 - port_min_v4 - \
         1). This parameter together with the port min, define a range of ports where Open MPI \
         will open sockets.",
    ),
    pdef(
        "port_min_v6",
        ParamKind::Int,
        DEFAULT_PORT_MIN as i64,
        (I32_MIN, I32_MAX),
        2,
        ACCEPTS_PORT_MIN,
        HELP_PORT_MIN,
    ),
    pdef(
        "port_range_v6",
        ParamKind::Int,
        65536 - DEFAULT_PORT_MIN as i64 - 1,
        (1, PORT_MAX),
        2,
        "an integer between 1 and 65535 (clamped so that port_min_v6 + port_range_v6 <= 65536)",
        "The number of ports where the TCP BTL will try to bind (default 65536 - port_min_v6 - \
         1). This parameter together with the port min, define a range of ports where Open MPI \
         will open sockets.",
    ),
    pdef(
        "warn_all_unfound_interfaces",
        ParamKind::Bool,
        0,
        (0, 1),
        2,
        ACCEPTS_BOOL,
        "Issue a warning for all unfound interfaces included in if_exclude",
    ),
    pdef(
        "exclusivity",
        ParamKind::UInt,
        TCP_EXCLUSIVITY as i64,
        (0, U32_MAX),
        7,
        ACCEPTS_U32,
        "BTL exclusivity (must be >= 0)",
    ),
    pdef(
        "flags",
        ParamKind::UInt,
        (FLAG_SEND | FLAG_PUT | FLAG_GET) as i64,
        (0, (FLAG_SEND | FLAG_PUT | FLAG_GET) as i64),
        5,
        "a bit mask of 1 (send, required), 2 (put) and 4 (get)",
        "BTL bit flags (general flags: send, put, get, in-place, hetero-rdma, atomics, \
         fetching-atomics)",
    ),
    pdef(
        "rndv_eager_limit",
        ParamKind::Size,
        64 * 1024,
        (0, U32_MAX),
        4,
        "a size in bytes between 0 and eager_limit (k, M, G suffixes allowed)",
        "Size (in bytes, including header) of \"phase 1\" fragment sent for all large messages \
         (must be >= 0 and <= eager_limit)",
    ),
    pdef(
        "eager_limit",
        ParamKind::Size,
        64 * 1024,
        (1, U32_MAX),
        4,
        "a size in bytes between 1 and 4294967295 (k, M, G suffixes allowed)",
        "Maximum size (in bytes, including header) of \"short\" messages (must be >= 1).",
    ),
    pdef(
        "max_send_size",
        ParamKind::Size,
        128 * 1024,
        (1, MAX_FRAME_LIMIT as i64),
        4,
        "a size in bytes between eager_limit and 1073741824 (k, M, G suffixes allowed)",
        "Maximum size (in bytes) of a single \"phase 2\" fragment of a long message when using \
         the pipeline protocol (must be >= 1)",
    ),
    pdef(
        "rdma_pipeline_send_length",
        ParamKind::Size,
        128 * 1024,
        (0, U32_MAX),
        4,
        ACCEPTS_SIZE,
        "Length of the \"phase 2\" portion of a large message (in bytes) when using the pipeline \
         protocol.  This part of the message will be split into fragments of size max_send_size \
         and sent using send/receive semantics (must be >= 0; only relevant when the PUT flag is \
         set)",
    ),
    pdef(
        "rdma_pipeline_frag_size",
        ParamKind::Size,
        I32_MAX,
        (1, U32_MAX),
        4,
        "a size in bytes between 1 and 4294967295 (k, M, G suffixes allowed)",
        "Maximum size (in bytes) of a single \"phase 3\" fragment from a long message when using \
         the pipeline protocol.  These fragments will be sent using RDMA semantics (must be >= \
         1; only relevant when the PUT flag is set)",
    ),
    pdef(
        "min_rdma_pipeline_size",
        ParamKind::Size,
        0,
        (0, U32_MAX),
        4,
        ACCEPTS_SIZE,
        "Messages smaller than this size (in bytes) will not use the RDMA pipeline protocol.  \
         Instead, they will be split into fragments of max_send_size and sent using send/receive \
         semantics (must be >=0, and is automatically adjusted up to at least \
         (eager_limit+btl_rdma_pipeline_send_length); only relevant when the PUT flag is set)",
    ),
    pdef(
        "latency",
        ParamKind::UInt,
        100,
        (0, U32_MAX),
        5,
        ACCEPTS_U32,
        "Approximate latency of interconnect (0 = auto-detect value at run-time [not supported \
         in all BTL modules], >= 1 = latency in microseconds)",
    ),
    pdef(
        "bandwidth",
        ParamKind::UInt,
        100,
        (0, U32_MAX),
        5,
        ACCEPTS_U32,
        "Approximate maximum bandwidth of interconnect (0 = auto-detect value at run-time [not \
         supported in all BTL modules], >= 1 = bandwidth in Mbps)",
    ),
    pdef(
        "disable_family",
        ParamKind::Int,
        0,
        (0, 6),
        2,
        "0 (use IPv4 and IPv6), 4 (no IPv4) or 6 (no IPv6)",
        "Disable one IP address family: 0 = use both IPv4 and IPv6, 4 = do not use IPv4, 6 = do \
         not use IPv6.",
    ),
    pdef(
        "max_frame",
        ParamKind::Size,
        DEFAULT_MAX_FRAME as i64,
        (1, MAX_FRAME_LIMIT as i64),
        5,
        "a size in bytes between max_send_size and 1073741824 (k, M, G suffixes allowed)",
        "Largest payload (in bytes) of one TCP frame accepted from a peer; a frame announcing \
         more is a protocol error that closes the connection, and larger messages travel as \
         several frames (default: 64 MiB, at least max_send_size; must be >= max_send_size and \
         <= 1 GiB). Measured on loopback: 4 MiB messages in one frame reach 4.7 GB/s, as 128 KiB \
         frames 3.9 GB/s.",
    ),
    pdef(
        "handshake_timeout",
        ParamKind::UInt,
        10_000,
        (1, U32_MAX),
        5,
        "a number of milliseconds between 1 and 4294967295",
        "Time (in milliseconds) a new TCP connection may take to complete its handshake before \
         it is dropped.",
    ),
];

/// Identifies one string parameter; its discriminant indexes
/// [`TCP_TEXT_PARAMS`].
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

    /// Index into [`TCP_TEXT_PARAMS`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The parameter's definition.
    pub fn def(self) -> &'static TextParamDef {
        &TCP_TEXT_PARAMS[self.index()]
    }

    /// Looks a string parameter up by name (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<TextParamId> {
        TextParamId::ALL
            .into_iter()
            .find(|id| id.def().name.eq_ignore_ascii_case(name))
    }
}

/// The definition of a string parameter ([`ParamDef`] has only integer
/// values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextParamDef {
    /// Owning component (`"tcp"`).
    pub component: &'static str,
    /// Parameter name as the seed registers it (`"if_include"`).
    pub name: &'static str,
    /// Default value.
    pub default: &'static str,
    /// One-line help text.
    pub help: &'static str,
    /// What the parameter accepts, for error messages.
    pub accepts: &'static str,
    /// Open MPI info level (1 = basic user .. 9 = developer).
    pub level: u8,
}

impl TextParamDef {
    /// The environment variable that sets this parameter
    /// (`BTL_TCP_IF_INCLUDE`).
    pub fn env_name(&self) -> EnvName<'static> {
        env_name(self.component, self.name)
    }

    /// Open MPI's environment variable for it
    /// (`OMPI_MCA_btl_tcp_if_include`).
    pub fn ompi_env_name(&self) -> TcpOmpiEnvName<'static> {
        TcpOmpiEnvName { name: self.name }
    }
}

const ACCEPTS_IF_LIST: &str = "a comma-separated list of interface names or name prefixes (eth0, \
                               ib) and CIDR networks (10.0.0.0/8, fd00::/8), at most 256 bytes";

/// The `tcp` component's string parameters, indexed by [`TextParamId`].
pub static TCP_TEXT_PARAMS: [TextParamDef; TCP_TEXT_PARAM_COUNT] = [
    TextParamDef {
        component: COMPONENT,
        name: "if_include",
        default: "",
        help: "Comma-delimited list of devices and/or CIDR notation of networks to use for MPI \
               communication (e.g., \"eth0,192.168.0.0/16\").  Mutually exclusive with \
               btl_tcp_if_exclude.",
        accepts: ACCEPTS_IF_LIST,
        level: 1,
    },
    TextParamDef {
        component: COMPONENT,
        name: "if_exclude",
        default: DEFAULT_IF_EXCLUDE,
        help: "Comma-delimited list of devices and/or CIDR notation of networks to NOT use for \
               MPI communication -- all devices not matching these specifications will be used \
               (e.g., \"eth0,192.168.0.0/16\").  If set to a non-default value, it is mutually \
               exclusive with btl_tcp_if_include.",
        accepts: ACCEPTS_IF_LIST,
        level: 1,
    },
];

/// Any `tcp` parameter: numeric or string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TcpParam {
    /// A numeric parameter.
    Num(TcpParamId),
    /// A string parameter.
    Text(TextParamId),
}

impl From<TcpParamId> for TcpParam {
    fn from(id: TcpParamId) -> Self {
        TcpParam::Num(id)
    }
}

impl From<TextParamId> for TcpParam {
    fn from(id: TextParamId) -> Self {
        TcpParam::Text(id)
    }
}

impl TcpParam {
    /// Every parameter in the seed's registration order (`links`,
    /// `if_include`, `if_exclude`, ...), then btl's own.
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

    /// The seed's name (`"links"`, `"if_include"`).
    pub fn name(self) -> &'static str {
        match self {
            TcpParam::Num(id) => id.def().name,
            TcpParam::Text(id) => id.def().name,
        }
    }

    /// The help text.
    pub fn help(self) -> &'static str {
        match self {
            TcpParam::Num(id) => id.def().help,
            TcpParam::Text(id) => id.def().help,
        }
    }

    /// What the parameter accepts.
    pub fn accepts(self) -> &'static str {
        match self {
            TcpParam::Num(id) => id.def().accepts,
            TcpParam::Text(id) => id.def().accepts,
        }
    }

    /// Open MPI info level.
    pub fn level(self) -> u8 {
        match self {
            TcpParam::Num(id) => id.def().level,
            TcpParam::Text(id) => id.def().level,
        }
    }

    /// The environment variable (`BTL_TCP_LINKS`).
    pub fn env_name(self) -> EnvName<'static> {
        env_name(COMPONENT, self.name())
    }

    /// Open MPI's environment variable (`OMPI_MCA_btl_tcp_links`).
    pub fn ompi_env_name(self) -> TcpOmpiEnvName<'static> {
        TcpOmpiEnvName { name: self.name() }
    }

    /// Looks a parameter up by name (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<TcpParam> {
        TcpParamId::from_name(name)
            .map(TcpParam::Num)
            .or_else(|| TextParamId::from_name(name).map(TcpParam::Text))
    }
}

/// Displays Open MPI's environment variable of a `tcp` parameter:
/// `OMPI_MCA_btl_tcp_if_include`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpOmpiEnvName<'a> {
    name: &'a str,
}

impl fmt::Display for TcpOmpiEnvName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OMPI_MCA_btl_{COMPONENT}_{}", self.name)
    }
}

/// A parameter's value as `btl info` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpValue<'a> {
    /// A number (booleans as 0/1).
    Int(i64),
    /// A string.
    Text(&'a str),
}

impl fmt::Display for TcpValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpValue::Int(v) => write!(f, "{v}"),
            TcpValue::Text(s) => f.write_str(s),
        }
    }
}

/// One parameter as `btl info` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpParamInfo<'a> {
    /// The parameter (its name, help, level and environment variables).
    pub param: TcpParam,
    /// The current value.
    pub value: TcpValue<'a>,
    /// The default value; for `port_range_*` and `max_frame` the one
    /// computed from the current `port_min_*` / `max_send_size`.
    pub default: TcpValue<'a>,
    /// Where the current value came from.
    pub source: ParamSource,
    /// Whether [`TcpParams::verify`] changed the value since it was last
    /// set.
    pub adjusted: bool,
}

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

/// A string of at most `N` bytes stored inline.
#[derive(Clone, Copy)]
struct FixedStr<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> FixedStr<N> {
    /// `s` if it fits, else `None`; in a `const` context, `s` must fit.
    const fn from_str(s: &str) -> Option<Self> {
        let bytes = s.as_bytes();
        if bytes.len() > N {
            return None;
        }
        let mut buf = [0; N];
        let mut i = 0;
        while i < bytes.len() {
            buf[i] = bytes[i];
            i += 1;
        }
        Some(FixedStr {
            buf,
            len: bytes.len(),
        })
    }

    const fn empty() -> Self {
        FixedStr {
            buf: [0; N],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        let bytes = self.buf.get(..self.len).unwrap_or(&[]);
        // Always valid: only whole `&str`s are copied in.
        core::str::from_utf8(bytes).unwrap_or("")
    }
}

impl<const N: usize> PartialEq for FixedStr<N> {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl<const N: usize> Eq for FixedStr<N> {}

impl<const N: usize> fmt::Debug for FixedStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
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
        if_name: FixedStr::empty(),
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
            write!(f, "{}", env_name(COMPONENT, self.kind.name()))?;
            f.write_str("_")?;
            write_upper(f, self.if_name)?;
        } else {
            write!(f, "{}_{}", self.kind.name(), self.if_name)?;
        }
        if let Some(link) = self.link {
            write!(f, ":{link}")?;
        }
        Ok(())
    }
}

fn write_upper(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    use fmt::Write;
    s.chars()
        .try_for_each(|c| f.write_char(c.to_ascii_uppercase()))
}

/// Displays the environment variable of an override given by the user
/// (target possibly truncated): `BTL_TCP_BANDWIDTH_ETH0:X`.
struct UserOverrideEnv<'a>(OverrideKind, &'a ParamName);

impl fmt::Display for UserOverrideEnv<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_", env_name(COMPONENT, self.0.name()))?;
        write_upper(f, self.1.as_str())?;
        if self.1.is_truncated() {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// Why a `tcp` parameter could not be set or verified. `name` fields hold
/// the seed's parameter name; `Display` shows the environment variable
/// (`BTL_TCP_LINKS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TcpParamError {
    /// No `tcp` parameter has this name (as given: a parameter name or a
    /// whole environment variable, truncated).
    UnknownParam {
        /// The name as given.
        name: ParamName,
    },
    /// The value is not a number (or boolean) in an accepted syntax.
    Malformed {
        /// The parameter.
        name: &'static str,
        /// What it accepts.
        accepts: &'static str,
    },
    /// The value is a number outside the accepted range (numbers beyond the
    /// 64-bit range are saturated to `i64::MIN`/`i64::MAX`).
    OutOfRange {
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: i64,
        /// What it accepts.
        accepts: &'static str,
    },
    /// A string value longer than its fixed storage.
    TooLong {
        /// The parameter.
        name: &'static str,
        /// The length given, in bytes.
        len: usize,
        /// The capacity, in bytes ([`TEXT_CAP`]).
        cap: usize,
    },
    /// Two parameters contradict each other.
    Conflict {
        /// The parameter at fault.
        name: &'static str,
        /// The parameter it contradicts.
        other: &'static str,
        /// The rule that is broken.
        rule: &'static str,
    },
    /// An entry of `if_include` / `if_exclude` is neither an interface name
    /// nor a valid CIDR.
    BadListEntry {
        /// The parameter (`"if_include"` or `"if_exclude"`).
        name: &'static str,
        /// The entry (truncated).
        entry: ParamName,
        /// What is wrong with it.
        reason: SpecError,
    },
    /// A per-interface override (`bandwidth_<if>[:<link>]`,
    /// `latency_<if>[:<link>]`) is malformed.
    BadOverride {
        /// Bandwidth or latency.
        kind: OverrideKind,
        /// What follows `bandwidth_` / `latency_` as given (`eth0:x`;
        /// truncated).
        target: ParamName,
        /// What is wrong.
        reason: &'static str,
    },
    /// More distinct per-interface overrides than [`OVERRIDE_CAP`].
    TooManyOverrides {
        /// Bandwidth or latency.
        kind: OverrideKind,
        /// What follows `bandwidth_` / `latency_` as given (truncated).
        target: ParamName,
    },
}

impl fmt::Display for TcpParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env = |name| env_name(COMPONENT, name);
        match self {
            TcpParamError::UnknownParam { name } => {
                write!(f, "unknown {COMPONENT} parameter `{name}` (see `btl info`)")
            }
            TcpParamError::Malformed { name, accepts } => {
                write!(f, "{}: malformed value; it accepts {accepts}", env(name))
            }
            TcpParamError::OutOfRange {
                name,
                value,
                accepts,
            } => write!(
                f,
                "{}={value} is out of range; it accepts {accepts}",
                env(name)
            ),
            TcpParamError::TooLong { name, len, cap } => write!(
                f,
                "{}: the value is {len} bytes long; it accepts at most {cap} bytes",
                env(name)
            ),
            TcpParamError::Conflict { name, other, rule } => {
                write!(f, "{} conflicts with {}: {rule}", env(name), env(other))
            }
            TcpParamError::BadListEntry {
                name,
                entry,
                reason,
            } => write!(
                f,
                "{}: malformed entry `{entry}` ({reason}); it accepts {ACCEPTS_IF_LIST}",
                env(name)
            ),
            TcpParamError::BadOverride {
                kind,
                target,
                reason,
            } => write!(f, "{}: {reason}", UserOverrideEnv(*kind, target)),
            TcpParamError::TooManyOverrides { kind, target } => write!(
                f,
                "{}: too many per-interface bandwidth/latency settings (at most {OVERRIDE_CAP})",
                UserOverrideEnv(*kind, target)
            ),
        }
    }
}

impl core::error::Error for TcpParamError {}

/// One change [`TcpParams::verify`] made to a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpAdjustment {
    /// The parameter changed.
    pub param: TcpParamId,
    /// The value before.
    pub from: i64,
    /// The value after.
    pub to: i64,
    /// Why.
    pub reason: &'static str,
}

impl fmt::Display for TcpAdjustment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} adjusted from {} to {}: {}",
            self.param.def().env_name(),
            self.from,
            self.to,
            self.reason
        )
    }
}

/// What [`TcpParams::verify`] adjusted (at most one entry per parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpVerified {
    entries: [TcpAdjustment; TCP_NUM_PARAM_COUNT],
    len: usize,
}

impl TcpVerified {
    const fn new() -> Self {
        const EMPTY: TcpAdjustment = TcpAdjustment {
            param: TcpParamId::Links,
            from: 0,
            to: 0,
            reason: "",
        };
        TcpVerified {
            entries: [EMPTY; TCP_NUM_PARAM_COUNT],
            len: 0,
        }
    }

    /// The adjustments, in the order they were made.
    pub fn adjustments(&self) -> &[TcpAdjustment] {
        self.entries.get(..self.len).unwrap_or(&[])
    }

    /// The adjustment of `param`, if verify changed it.
    pub fn get(&self, param: TcpParamId) -> Option<&TcpAdjustment> {
        self.adjustments().iter().find(|a| a.param == param)
    }

    /// True when verify changed nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push(&mut self, adj: TcpAdjustment) {
        let len = self.len;
        if let Some(prev) = self
            .entries
            .get_mut(..len)
            .and_then(|e| e.iter_mut().find(|a| a.param == adj.param))
        {
            prev.to = adj.to;
            prev.reason = adj.reason;
        } else if let Some(slot) = self.entries.get_mut(len) {
            *slot = adj;
            self.len += 1;
        }
    }
}

/// The `tcp` component's parameter values, with the seed's types and
/// defaults, and where each value came from.
///
/// Numeric fields may be assigned directly from code; call
/// [`TcpParams::verify`] afterwards. A field that differs from its default
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
    /// `SO_SNDBUF` in bytes (0 = kernel default).
    pub sndbuf: i32,
    /// `SO_RCVBUF` in bytes (0 = kernel default).
    pub rcvbuf: i32,
    /// Read-ahead cache per connection, in bytes.
    pub endpoint_cache: i32,
    /// Whether Nagle's algorithm stays on (no `TCP_NODELAY`).
    pub use_nagle: bool,
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
    /// BTL flags (`FLAG_SEND`, `FLAG_PUT`, `FLAG_GET` of
    /// [`crate::sm::params`]).
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
    /// Largest frame payload accepted from a peer; `None` = `max_send_size`.
    pub max_frame: Option<u32>,
    /// Milliseconds a connection may take to complete its handshake.
    pub handshake_timeout: u32,
    if_include: FixedStr<TEXT_CAP>,
    if_exclude: FixedStr<TEXT_CAP>,
    overrides: [IfOverride; OVERRIDE_CAP],
    n_overrides: usize,
    sources: [ParamSource; TCP_NUM_PARAM_COUNT],
    text_sources: [ParamSource; TCP_TEXT_PARAM_COUNT],
    adjusted: u32,
}

impl Default for TcpParams {
    fn default() -> Self {
        Self::new()
    }
}

fn to_i32(id: TcpParamId, v: i64) -> Result<i32, TcpParamError> {
    i32::try_from(v).map_err(|_| out_of_range(id, v))
}

fn to_u32(id: TcpParamId, v: i64) -> Result<u32, TcpParamError> {
    u32::try_from(v).map_err(|_| out_of_range(id, v))
}

fn out_of_range(id: TcpParamId, value: i64) -> TcpParamError {
    let def = id.def();
    TcpParamError::OutOfRange {
        name: def.name,
        value,
        accepts: def.accepts,
    }
}

/// Checks `v` against the parameter's own range (not against other
/// parameters).
fn check_domain(id: TcpParamId, v: i64) -> Result<(), TcpParamError> {
    let def = id.def();
    if v < def.min || v > def.max || (id == TcpParamId::DisableFamily && !matches!(v, 0 | 4 | 6)) {
        return Err(out_of_range(id, v));
    }
    Ok(())
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
    /// The seed's defaults, all with source [`ParamSource::Default`].
    pub const fn new() -> Self {
        let if_exclude = match FixedStr::from_str(DEFAULT_IF_EXCLUDE) {
            Some(s) => s,
            None => FixedStr::empty(),
        };
        TcpParams {
            links: 1,
            free_list_num: 8,
            free_list_max: -1,
            free_list_inc: 32,
            sndbuf: 128 * 1024,
            rcvbuf: 128 * 1024,
            endpoint_cache: 30 * 1024,
            use_nagle: false,
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
            if_include: FixedStr::empty(),
            if_exclude,
            overrides: [IfOverride::EMPTY; OVERRIDE_CAP],
            n_overrides: 0,
            sources: [ParamSource::Default; TCP_NUM_PARAM_COUNT],
            text_sources: [ParamSource::Default; TCP_TEXT_PARAM_COUNT],
            adjusted: 0,
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
        }
    }

    /// The default of `id` given the other current values (`port_range_*`
    /// and `max_frame` follow `port_min_*` / `max_send_size`).
    pub fn default_of(&self, id: TcpParamId) -> i64 {
        match id {
            TcpParamId::PortRangeV4 => i64::from(default_port_range(self.port_min_v4)),
            TcpParamId::PortRangeV6 => i64::from(default_port_range(self.port_min_v6)),
            TcpParamId::MaxFrame => i64::from(DEFAULT_MAX_FRAME.max(self.max_send_size)),
            _ => id.def().default,
        }
    }

    /// Stores `v` into the field of `id`; fails only if `v` does not fit the
    /// field's type.
    fn store(&mut self, id: TcpParamId, v: i64) -> Result<(), TcpParamError> {
        match id {
            TcpParamId::Links => self.links = to_u32(id, v)?,
            TcpParamId::FreeListNum => self.free_list_num = to_i32(id, v)?,
            TcpParamId::FreeListMax => self.free_list_max = to_i32(id, v)?,
            TcpParamId::FreeListInc => self.free_list_inc = to_i32(id, v)?,
            TcpParamId::Sndbuf => self.sndbuf = to_i32(id, v)?,
            TcpParamId::Rcvbuf => self.rcvbuf = to_i32(id, v)?,
            TcpParamId::EndpointCache => self.endpoint_cache = to_i32(id, v)?,
            TcpParamId::UseNagle => self.use_nagle = to_u32(id, v)? != 0,
            TcpParamId::PortMinV4 => self.port_min_v4 = to_i32(id, v)?,
            TcpParamId::PortRangeV4 => self.port_range_v4 = Some(to_i32(id, v)?),
            TcpParamId::PortMinV6 => self.port_min_v6 = to_i32(id, v)?,
            TcpParamId::PortRangeV6 => self.port_range_v6 = Some(to_i32(id, v)?),
            TcpParamId::WarnAllUnfoundInterfaces => {
                self.warn_all_unfound_interfaces = to_u32(id, v)? != 0
            }
            TcpParamId::Exclusivity => self.exclusivity = to_u32(id, v)?,
            TcpParamId::Flags => self.flags = to_u32(id, v)?,
            TcpParamId::RndvEagerLimit => self.rndv_eager_limit = to_u32(id, v)?,
            TcpParamId::EagerLimit => self.eager_limit = to_u32(id, v)?,
            TcpParamId::MaxSendSize => self.max_send_size = to_u32(id, v)?,
            TcpParamId::RdmaPipelineSendLength => self.rdma_pipeline_send_length = to_u32(id, v)?,
            TcpParamId::RdmaPipelineFragSize => self.rdma_pipeline_frag_size = to_u32(id, v)?,
            TcpParamId::MinRdmaPipelineSize => self.min_rdma_pipeline_size = to_u32(id, v)?,
            TcpParamId::Latency => self.latency = to_u32(id, v)?,
            TcpParamId::Bandwidth => self.bandwidth = to_u32(id, v)?,
            TcpParamId::DisableFamily => self.disable_family = to_u32(id, v)?,
            TcpParamId::MaxFrame => self.max_frame = Some(to_u32(id, v)?),
            TcpParamId::HandshakeTimeout => self.handshake_timeout = to_u32(id, v)?,
        }
        Ok(())
    }

    /// The raw field value of `id` for domain checks: `None` for a computed
    /// default (always valid).
    fn raw(&self, id: TcpParamId) -> Option<i64> {
        match id {
            TcpParamId::PortRangeV4 => self.port_range_v4.map(i64::from),
            TcpParamId::PortRangeV6 => self.port_range_v6.map(i64::from),
            TcpParamId::MaxFrame => self.max_frame.map(i64::from),
            _ => Some(self.get(id)),
        }
    }

    /// Where the value of `id` came from: the recorded source, except that a
    /// value set by assigning a field (different from the default, or any
    /// `Some` of an `Option` field) while recorded as
    /// [`ParamSource::Default`] counts as [`ParamSource::Code`] unless
    /// verify produced it.
    pub fn source(&self, param: impl Into<TcpParam>) -> ParamSource {
        match param.into() {
            TcpParam::Text(id) => self
                .text_sources
                .get(id.index())
                .copied()
                .unwrap_or(ParamSource::Default),
            TcpParam::Num(id) => {
                let recorded = self
                    .sources
                    .get(id.index())
                    .copied()
                    .unwrap_or(ParamSource::Default);
                let differs = match id {
                    TcpParamId::PortRangeV4 => self.port_range_v4.is_some(),
                    TcpParamId::PortRangeV6 => self.port_range_v6.is_some(),
                    TcpParamId::MaxFrame => self.max_frame.is_some(),
                    _ => self.get(id) != id.def().default,
                };
                if recorded == ParamSource::Default && differs && !self.is_adjusted(id) {
                    ParamSource::Code
                } else {
                    recorded
                }
            }
        }
    }

    /// Whether [`TcpParams::verify`] changed `id` since it was last set.
    pub fn is_adjusted(&self, id: TcpParamId) -> bool {
        self.adjusted & id.bit() != 0
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

    /// The effective largest frame payload: `max_frame`, or `max_send_size`
    /// when it is left to follow it.
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

    /// Sets parameter `name` (the seed's name, ASCII case-insensitive) from
    /// its textual `value`, recording `source`. `name` may also be a
    /// per-interface override: `bandwidth_<if>`, `latency_<if>`,
    /// `bandwidth_<if>:<link>`, `latency_<if>:<link>`.
    ///
    /// Numbers are decimal or `0x` hexadecimal, optionally signed, with an
    /// optional binary suffix `k`/`K` (KiB), `m`/`M` (MiB) or `g`/`G` (GiB);
    /// booleans are `0`/`1`/`true`/`false`/`yes`/`no`; strings are stored as
    /// given (at most [`TEXT_CAP`] bytes). The value must lie in the
    /// parameter's own range; rules between parameters, and the syntax of
    /// the interface lists, are checked by [`TcpParams::verify`]. On error
    /// nothing changes.
    pub fn set(
        &mut self,
        name: &str,
        value: &str,
        source: ParamSource,
    ) -> Result<(), TcpParamError> {
        self.set_named(name, name, value, source)
    }

    /// [`TcpParams::set`], with `shown` the name an unknown-parameter error
    /// reports (the whole environment variable when set from one).
    fn set_named(
        &mut self,
        name: &str,
        shown: &str,
        value: &str,
        source: ParamSource,
    ) -> Result<(), TcpParamError> {
        match TcpParam::from_name(name) {
            Some(TcpParam::Num(id)) => self.set_id(id, value, source),
            Some(TcpParam::Text(id)) => self.set_text(id, value, source),
            None => match split_override(name) {
                Some((kind, rest)) => self.set_override_str(kind, rest, value, source),
                None => Err(TcpParamError::UnknownParam {
                    name: ParamName::new(shown),
                }),
            },
        }
    }

    /// [`TcpParams::set`] for a known numeric parameter.
    pub fn set_id(
        &mut self,
        id: TcpParamId,
        value: &str,
        source: ParamSource,
    ) -> Result<(), TcpParamError> {
        let def = id.def();
        let v = match def.kind {
            ParamKind::Bool => parse_bool(value),
            ParamKind::Int | ParamKind::UInt | ParamKind::Size => parse_number(value),
        };
        let v = match v {
            Ok(v) => v,
            Err(NumError::Malformed) => {
                return Err(TcpParamError::Malformed {
                    name: def.name,
                    accepts: def.accepts,
                })
            }
            Err(NumError::Overflow { negative }) => {
                return Err(out_of_range(id, if negative { i64::MIN } else { i64::MAX }))
            }
        };
        self.set_value(id, v, source)
    }

    /// Sets `id` to the number `v`, recording `source`; `v` must lie in the
    /// parameter's own range. On error nothing changes.
    pub fn set_value(
        &mut self,
        id: TcpParamId,
        v: i64,
        source: ParamSource,
    ) -> Result<(), TcpParamError> {
        check_domain(id, v)?;
        self.store(id, v)?;
        if let Some(s) = self.sources.get_mut(id.index()) {
            *s = source;
        }
        self.adjusted &= !id.bit();
        Ok(())
    }

    /// Sets a string parameter to `value` (stored as given), recording
    /// `source`. A value longer than [`TEXT_CAP`] bytes is
    /// [`TcpParamError::TooLong`]; the entries are checked by
    /// [`TcpParams::verify`] and by interface selection. On error nothing
    /// changes.
    pub fn set_text(
        &mut self,
        id: TextParamId,
        value: &str,
        source: ParamSource,
    ) -> Result<(), TcpParamError> {
        let text = FixedStr::from_str(value).ok_or(TcpParamError::TooLong {
            name: id.def().name,
            len: value.len(),
            cap: TEXT_CAP,
        })?;
        match id {
            TextParamId::IfInclude => self.if_include = text,
            TextParamId::IfExclude => self.if_exclude = text,
        }
        if let Some(s) = self.text_sources.get_mut(id.index()) {
            *s = source;
        }
        Ok(())
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
    ) -> Result<(), TcpParamError> {
        let bad = |reason| TcpParamError::BadOverride {
            kind,
            target: ParamName::new(if_name),
            reason,
        };
        if if_name.is_empty() {
            return Err(bad("the interface name is empty"));
        }
        if if_name.contains(':') {
            return Err(bad("the interface name contains `:`"));
        }
        let name =
            FixedStr::from_str(if_name).ok_or(bad("the interface name is longer than 16 bytes"))?;
        let entry = IfOverride {
            kind,
            if_name: name,
            link,
            value,
            source,
        };
        let n = self.n_overrides;
        if let Some(prev) = self.overrides.get_mut(..n).and_then(|o| {
            o.iter_mut().find(|o| {
                o.kind == kind && o.link == link && o.if_name().eq_ignore_ascii_case(if_name)
            })
        }) {
            *prev = entry;
            return Ok(());
        }
        let slot = self
            .overrides
            .get_mut(n)
            .ok_or(TcpParamError::TooManyOverrides {
                kind,
                target: ParamName::new(if_name),
            })?;
        *slot = entry;
        self.n_overrides += 1;
        Ok(())
    }

    /// Parses `rest` (`<if>` or `<if>:<link>`, what follows `bandwidth_` /
    /// `latency_`) and `value` of an override of `kind`.
    fn set_override_str(
        &mut self,
        kind: OverrideKind,
        rest: &str,
        value: &str,
        source: ParamSource,
    ) -> Result<(), TcpParamError> {
        let target = ParamName::new(rest);
        let bad = |reason| TcpParamError::BadOverride {
            kind,
            target,
            reason,
        };
        let (if_name, link) = match rest.rsplit_once(':') {
            Some((if_name, link)) => {
                let link = link
                    .parse::<u32>()
                    .map_err(|_| bad("the link after `:` must be a number >= 0"))?;
                (if_name, Some(link))
            }
            None => (rest, None),
        };
        let value = match parse_number(value) {
            Ok(v) => u32::try_from(v)
                .map_err(|_| bad("out of range; it accepts an integer between 0 and 4294967295"))?,
            Err(NumError::Overflow { .. }) => {
                return Err(bad(
                    "out of range; it accepts an integer between 0 and 4294967295",
                ))
            }
            Err(NumError::Malformed) => {
                return Err(bad(
                    "malformed value; it accepts an integer between 0 and 4294967295",
                ))
            }
        };
        self.set_override(kind, if_name, link, value, source)
            .map_err(|e| match e {
                TcpParamError::BadOverride { reason, .. } => bad(reason),
                TcpParamError::TooManyOverrides { .. } => {
                    TcpParamError::TooManyOverrides { kind, target }
                }
                other => other,
            })
    }

    /// Applies one environment variable: `Ok(false)` if `var` is not a `tcp`
    /// variable (neither `BTL_TCP_*` nor `OMPI_MCA_btl_tcp_*`), `Ok(true)`
    /// once set. Per-interface overrides are `BTL_TCP_BANDWIDTH_ETH0`,
    /// `BTL_TCP_LATENCY_ETH0:1`, `OMPI_MCA_btl_tcp_bandwidth_eth0`, .... A
    /// `tcp` variable naming no parameter is [`TcpParamError::UnknownParam`]
    /// holding the whole variable name.
    pub fn set_from_env_var(&mut self, var: &str, value: &str) -> Result<bool, TcpParamError> {
        let Some(param) = env_param_part(var) else {
            return Ok(false);
        };
        self.set_named(param, var, value, ParamSource::Environment)?;
        Ok(true)
    }

    /// Every parameter with its current value, default and source, in the
    /// order of [`TcpParam::ALL`] (for `btl info`; the per-interface
    /// overrides are in [`TcpParams::overrides`]).
    pub fn iter(&self) -> impl Iterator<Item = TcpParamInfo<'_>> + '_ {
        TcpParam::ALL.into_iter().map(move |param| match param {
            TcpParam::Num(id) => TcpParamInfo {
                param,
                value: TcpValue::Int(self.get(id)),
                default: TcpValue::Int(self.default_of(id)),
                source: self.source(id),
                adjusted: self.is_adjusted(id),
            },
            TcpParam::Text(id) => TcpParamInfo {
                param,
                value: TcpValue::Text(self.text(id)),
                default: TcpValue::Text(id.def().default),
                source: self.source(id),
                adjusted: false,
            },
        })
    }

    /// The seed's open-time rule: `if_include` and `if_exclude` are mutually
    /// exclusive — an error when `if_include` has at least one entry and
    /// `if_exclude` is not its default ([`DEFAULT_IF_EXCLUDE`]).
    pub fn check_exclusive(&self) -> Result<(), TcpParamError> {
        let include_given = ifsel::entries(self.if_include()).next().is_some();
        if include_given && self.if_exclude() != DEFAULT_IF_EXCLUDE {
            return Err(TcpParamError::Conflict {
                name: TextParamId::IfInclude.def().name,
                other: TextParamId::IfExclude.def().name,
                rule: "if_include and if_exclude are mutually exclusive; set only one of them",
            });
        }
        Ok(())
    }

    /// Applies the seed's register/verify/open rules and Open MPI's base BTL
    /// parameter checks.
    ///
    /// Errors (nothing is changed then): a value outside its own range
    /// (`links` < 1, `endpoint_cache` < 64, `disable_family` not 0, 4 or 6,
    /// `max_frame` > 1 GiB, ...); `flags` without send; `max_send_size` <
    /// `eager_limit`; `free_list_max` not -1 and < `free_list_num`; a set
    /// `max_frame` < `max_send_size`; `if_include` together with a
    /// non-default `if_exclude`; a malformed entry in either list.
    ///
    /// Adjustments (each logged — as a warning when the user set one of the
    /// parameters involved —, recorded in the result and in
    /// [`TcpParamInfo::adjusted`]): an invalid `port_min_v4` / `port_min_v6`
    /// (0, negative or > 65535) is reset to 1024, as the seed does; a set
    /// `port_range_*` is clamped so that `port_min + port_range <= 65536`;
    /// `rndv_eager_limit` is clamped to `eager_limit`;
    /// `min_rdma_pipeline_size` is raised to at least `eager_limit +
    /// rdma_pipeline_send_length` (saturating at `u32::MAX`).
    ///
    /// Verify is idempotent: a second call adjusts nothing.
    pub fn verify(&mut self) -> Result<TcpVerified, TcpParamError> {
        // Errors first, so that a failing verify leaves everything as it was.
        for id in TcpParamId::ALL {
            if let Some(v) = self.raw(id) {
                check_domain(id, v)?;
            }
        }
        if self.flags & FLAG_SEND == 0 {
            return Err(out_of_range(TcpParamId::Flags, i64::from(self.flags)));
        }
        if self.max_send_size < self.eager_limit {
            return Err(TcpParamError::Conflict {
                name: TcpParamId::MaxSendSize.def().name,
                other: TcpParamId::EagerLimit.def().name,
                rule: "max_send_size must be >= eager_limit",
            });
        }
        if self.free_list_max != -1 && self.free_list_max < self.free_list_num {
            return Err(TcpParamError::Conflict {
                name: TcpParamId::FreeListMax.def().name,
                other: TcpParamId::FreeListNum.def().name,
                rule: "free_list_max must be -1 (unlimited) or >= free_list_num",
            });
        }
        if self.max_frame.is_some_and(|m| m < self.max_send_size) {
            return Err(TcpParamError::Conflict {
                name: TcpParamId::MaxFrame.def().name,
                other: TcpParamId::MaxSendSize.def().name,
                rule: "max_frame must be >= max_send_size (a peer sends frames of up to \
                       max_send_size)",
            });
        }
        self.check_exclusive()?;
        for id in TextParamId::ALL {
            ifsel::validate_list(id, self.text(id))?;
        }

        let mut out = TcpVerified::new();

        // Seed verify: an invalid minimum port is reset to 1024, with a
        // warning, not refused.
        for (min, range) in [
            (TcpParamId::PortMinV4, TcpParamId::PortRangeV4),
            (TcpParamId::PortMinV6, TcpParamId::PortRangeV6),
        ] {
            let port_min = self.get(min);
            if !(1..=PORT_MAX).contains(&port_min) {
                self.adjust(
                    &mut out,
                    min,
                    i64::from(DEFAULT_PORT_MIN),
                    "not a valid port (1 to 65535); reset to 1024",
                    &[],
                )?;
            }
            // A set range must end by port 65535 (a range left to follow
            // port_min always does).
            if self.raw(range).is_some() {
                let port_min = self.get(min);
                let limit = 65536 - port_min;
                if self.get(range) > limit {
                    self.adjust(
                        &mut out,
                        range,
                        limit,
                        "clamped so that port_min + port_range <= 65536",
                        &[min],
                    )?;
                }
            }
        }
        // Base: the first fragment of a large message is an eager fragment.
        if self.rndv_eager_limit > self.eager_limit {
            self.adjust(
                &mut out,
                TcpParamId::RndvEagerLimit,
                i64::from(self.eager_limit),
                "clamped to eager_limit",
                &[TcpParamId::EagerLimit],
            )?;
        }
        // Base verify: min_rdma_pipeline_size >= eager_limit + send length.
        let floor = u64::from(self.eager_limit)
            .saturating_add(u64::from(self.rdma_pipeline_send_length))
            .min(u64::from(u32::MAX));
        if u64::from(self.min_rdma_pipeline_size) < floor {
            self.adjust(
                &mut out,
                TcpParamId::MinRdmaPipelineSize,
                i64::try_from(floor).unwrap_or(U32_MAX),
                "raised to eager_limit + rdma_pipeline_send_length",
                &[TcpParamId::EagerLimit, TcpParamId::RdmaPipelineSendLength],
            )?;
        }
        Ok(out)
    }

    /// Changes `id` to `to` on behalf of verify: records it, and warns if the
    /// user set `id` or one of the parameters `causes` (an adjustment of
    /// defaults alone is only a debug message).
    fn adjust(
        &mut self,
        out: &mut TcpVerified,
        id: TcpParamId,
        to: i64,
        reason: &'static str,
        causes: &[TcpParamId],
    ) -> Result<(), TcpParamError> {
        let from = self.get(id);
        let user_set = core::iter::once(&id)
            .chain(causes)
            .any(|&p| self.source(p) != ParamSource::Default);
        self.store(id, to)?;
        self.adjusted |= id.bit();
        out.push(TcpAdjustment {
            param: id,
            from,
            to,
            reason,
        });
        let name = id.def().name;
        if user_set {
            warn!(
                "btl tcp: parameter {} adjusted from {} to {}: {}",
                name, from, to, reason
            );
        } else {
            debug!(
                "btl tcp: parameter {} adjusted from {} to {}: {}",
                name, from, to, reason
            );
        }
        Ok(())
    }
}

const ENV_PREFIX: &str = "BTL_TCP_";
const OMPI_ENV_PREFIX: &str = "OMPI_MCA_btl_tcp_";

/// The parameter part of a `tcp` environment variable, if `var` is one.
fn env_param_part(var: &str) -> Option<&str> {
    var.strip_prefix(ENV_PREFIX)
        .or_else(|| var.strip_prefix(OMPI_ENV_PREFIX))
}

/// The parameter a `tcp` environment variable sets (`BTL_TCP_<PARAM>` in
/// any case, or Open MPI's `OMPI_MCA_btl_tcp_<param>`), if it names one of
/// the table's parameters (not an override).
pub fn from_env_name(var: &str) -> Option<TcpParam> {
    env_param_part(var).and_then(TcpParam::from_name)
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

enum NumError {
    Malformed,
    Overflow { negative: bool },
}

fn parse_bool(s: &str) -> Result<i64, NumError> {
    let t = s.trim();
    for (word, v) in [("true", 1), ("yes", 1), ("false", 0), ("no", 0)] {
        if t.eq_ignore_ascii_case(word) {
            return Ok(v);
        }
    }
    parse_number(t)
}

/// Parses `[+-](decimal | 0x hex)[kKmMgG]`, surrounding whitespace allowed.
fn parse_number(s: &str) -> Result<i64, NumError> {
    let s = s.trim();
    let (negative, rest) = if let Some(r) = s.strip_prefix('-') {
        (true, r)
    } else {
        (false, s.strip_prefix('+').unwrap_or(s))
    };
    let (shift, digits) = match rest.char_indices().last() {
        Some((i, 'k' | 'K')) => (10u32, rest.get(..i).unwrap_or("")),
        Some((i, 'm' | 'M')) => (20, rest.get(..i).unwrap_or("")),
        Some((i, 'g' | 'G')) => (30, rest.get(..i).unwrap_or("")),
        _ => (0, rest),
    };
    let (radix, digits) = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => (16, hex),
        None => (10, digits),
    };
    if digits.is_empty() {
        return Err(NumError::Malformed);
    }
    let mut magnitude: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix).ok_or(NumError::Malformed)?;
        magnitude = magnitude
            .checked_mul(u64::from(radix))
            .and_then(|m| m.checked_add(u64::from(d)))
            .ok_or(NumError::Overflow { negative })?;
    }
    // u64 * 2^30 < 2^94: exact in i128.
    let value = i128::from(magnitude) << shift;
    let value = if negative { -value } else { value };
    i64::try_from(value).map_err(|_| NumError::Overflow { negative })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn table_matches_ids_and_defaults() {
        let p = TcpParams::new();
        for (i, id) in TcpParamId::ALL.into_iter().enumerate() {
            assert_eq!(id.index(), i);
            let def = id.def();
            assert_eq!(def.component, "tcp");
            assert_eq!(p.get(id), def.default, "{}", def.name);
            assert_eq!(p.default_of(id), def.default, "{}", def.name);
            assert!(
                def.min <= def.default && def.default <= def.max,
                "{}",
                def.name
            );
            assert!(!def.help.is_empty() && !def.accepts.is_empty());
            assert_eq!(TcpParamId::from_name(def.name), Some(id));
            assert_eq!(p.source(id), ParamSource::Default, "{}", def.name);
        }
        assert_eq!(TcpParams::default(), p);
        let names: std::vec::Vec<_> = TcpParam::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names[..4],
            ["links", "if_include", "if_exclude", "free_list_num"]
        );
        assert_eq!(names.last(), Some(&"handshake_timeout"));
        for (i, a) in TcpParam::ALL.iter().enumerate() {
            assert!(TcpParam::ALL[..i].iter().all(|b| b != a), "{}", a.name());
            assert_eq!(TcpParam::from_name(a.name()), Some(*a));
        }
        assert_eq!(
            (p.links, p.free_list_num, p.free_list_max, p.free_list_inc),
            (1, 8, -1, 32)
        );
        assert_eq!(
            (p.sndbuf, p.rcvbuf, p.endpoint_cache),
            (131072, 131072, 30720)
        );
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
            from_env_name("BTL_TCP_if_Include"),
            Some(TcpParam::Text(TextParamId::IfInclude))
        );
        assert!(from_env_name("BTL_SM_LINKS").is_none());
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
        assert_eq!(info[1].value, TcpValue::Text("eth0,10.0.0.0/8"));
        assert_eq!(info[2].default.to_string(), "127.0.0.1/8,sppp");
        assert_eq!(info[0].value, TcpValue::Int(2));
    }

    #[test]
    fn parsing_and_domains() {
        let mut p = TcpParams::new();
        p.set("sndbuf", "1M", ParamSource::Code).unwrap();
        p.set("RCVBUF", "0", ParamSource::Code).unwrap();
        p.set("use_nagle", "yes", ParamSource::Code).unwrap();
        p.set("endpoint_cache", "0x40", ParamSource::Code).unwrap();
        assert_eq!(
            (p.sndbuf, p.rcvbuf, p.use_nagle, p.endpoint_cache),
            (1 << 20, 0, true, 64)
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
            Err(TcpParamError::OutOfRange {
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
        assert_eq!(v.adjustments().len(), 1);
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
                    Err(TcpParamError::UnknownParam { .. })
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
