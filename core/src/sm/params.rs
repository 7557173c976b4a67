//! The `sm` component's parameters: the seed's names, defaults, help texts
//! and validation rules, without an allocator.
//!
//! - [`SM_PARAMS`] is the static table of definitions (name, kind, default,
//!   accepted range, help text, Open MPI info level), indexed by [`ParamId`].
//! - [`SmParams`] holds one typed field per parameter plus where each value
//!   came from ([`ParamSource`]). Values are set from code (assign a field, or
//!   [`SmParams::set`]) or from the environment ([`SmParams::set_from_env_var`],
//!   which understands both `BTL_SM_FIFO_SIZE` and Open MPI's
//!   `OMPI_MCA_btl_sm_fifo_size`).
//! - [`SmParams::verify`] applies the seed's register/verify/open rules and
//!   Open MPI's base BTL parameter checks: it either fails without touching
//!   anything, or adjusts (rounds, clamps) and returns the list of
//!   adjustments it made ([`Verified`]).
//! - [`SmParams::iter`] lists every parameter with its value, default and
//!   source, for `btl info`.
//!
//! Every error names the parameter as the user types it in the environment
//! (`BTL_SM_FIFO_SIZE`) and says what it accepts.

use core::fmt;

/// Name of the component, the middle part of `BTL_SM_FIFO_SIZE`.
pub const COMPONENT: &str = "sm";

/// Smallest accepted `eager_limit`: an eager fragment must carry a fragment
/// header and still have room for payload.
pub const MIN_EAGER_LIMIT: u32 = 64;

/// Largest accepted `fifo_size` (slots per ring), as the seed's
/// `sm_fifo_init` allows.
pub const MAX_FIFO_SIZE: u32 = 1 << 30;

/// `flags` bit: the BTL sends fragments (Open MPI's `MCA_BTL_FLAGS_SEND`).
pub const FLAG_SEND: u32 = 0x1;
/// `flags` bit: remote put (`MCA_BTL_FLAGS_PUT`); `sm` has no put, so
/// [`SmParams::verify`] clears it.
pub const FLAG_PUT: u32 = 0x2;
/// `flags` bit: remote get (`MCA_BTL_FLAGS_GET`); [`SmParams::verify`] sets
/// it exactly when single copy (`use_cma`) is enabled.
pub const FLAG_GET: u32 = 0x4;

/// Number of parameters of the `sm` component (the length of [`SM_PARAMS`]).
pub const SM_PARAM_COUNT: usize = 22;

/// How a parameter's value is typed and parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// Signed integer (the seed's `int`).
    Int,
    /// Unsigned integer (the seed's `unsigned int`).
    UInt,
    /// A size in bytes (an unsigned integer; Open MPI's `size_t`).
    Size,
    /// A boolean stored as an integer: 0 or 1, also `true`/`false`/`yes`/`no`.
    Bool,
}

/// Where a parameter's current value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ParamSource {
    /// The built-in default.
    Default,
    /// An environment variable (`BTL_SM_*` or `OMPI_MCA_btl_sm_*`).
    Environment,
    /// Program code (a field assignment or [`SmParams::set`]).
    Code,
}

impl fmt::Display for ParamSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParamSource::Default => "default",
            ParamSource::Environment => "environment",
            ParamSource::Code => "code",
        })
    }
}

/// The definition of one parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamDef {
    /// Owning component (`"sm"`).
    pub component: &'static str,
    /// Parameter name as the seed registers it (`"fifo_size"`).
    pub name: &'static str,
    /// Type and parsing rules.
    pub kind: ParamKind,
    /// Default value.
    pub default: i64,
    /// Smallest value accepted when setting it.
    pub min: i64,
    /// Largest value accepted when setting it.
    pub max: i64,
    /// One-line help text.
    pub help: &'static str,
    /// What the parameter accepts, for error messages ("an integer >= 1").
    pub accepts: &'static str,
    /// Open MPI info level (`OPAL_INFO_LVL_*`, 1 = basic user .. 9 = developer).
    pub level: u8,
}

impl ParamDef {
    /// The environment variable that sets this parameter (`BTL_SM_FIFO_SIZE`).
    pub fn env_name(&self) -> EnvName<'static> {
        env_name(self.component, self.name)
    }

    /// Open MPI's environment variable for it (`OMPI_MCA_btl_sm_fifo_size`).
    pub fn ompi_env_name(&self) -> OmpiEnvName<'static> {
        OmpiEnvName {
            component: self.component,
            name: self.name,
        }
    }
}

/// Identifies one `sm` parameter; its discriminant indexes [`SM_PARAMS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum ParamId {
    /// `use_knem`
    UseKnem,
    /// `knem_dma_min`
    KnemDmaMin,
    /// `knem_max_simultaneous`
    KnemMaxSimultaneous,
    /// `use_cma`
    UseCma,
    /// `free_list_num`
    FreeListNum,
    /// `free_list_max`
    FreeListMax,
    /// `free_list_inc`
    FreeListInc,
    /// `max_procs`
    MaxProcs,
    /// `fifo_size`
    FifoSize,
    /// `num_fifos`
    NumFifos,
    /// `fifo_lazy_free`
    FifoLazyFree,
    /// `sm_extra_procs`
    SmExtraProcs,
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
}

impl ParamId {
    /// Every parameter, in table order.
    pub const ALL: [ParamId; SM_PARAM_COUNT] = [
        ParamId::UseKnem,
        ParamId::KnemDmaMin,
        ParamId::KnemMaxSimultaneous,
        ParamId::UseCma,
        ParamId::FreeListNum,
        ParamId::FreeListMax,
        ParamId::FreeListInc,
        ParamId::MaxProcs,
        ParamId::FifoSize,
        ParamId::NumFifos,
        ParamId::FifoLazyFree,
        ParamId::SmExtraProcs,
        ParamId::Exclusivity,
        ParamId::Flags,
        ParamId::RndvEagerLimit,
        ParamId::EagerLimit,
        ParamId::MaxSendSize,
        ParamId::RdmaPipelineSendLength,
        ParamId::RdmaPipelineFragSize,
        ParamId::MinRdmaPipelineSize,
        ParamId::Latency,
        ParamId::Bandwidth,
    ];

    /// Index into [`SM_PARAMS`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The parameter's definition.
    pub fn def(self) -> &'static ParamDef {
        &SM_PARAMS[self.index()]
    }

    /// Looks a parameter up by name (ASCII case-insensitive).
    pub fn from_name(name: &str) -> Option<ParamId> {
        ParamId::ALL
            .into_iter()
            .find(|id| id.def().name.eq_ignore_ascii_case(name))
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

const I32_MIN: i64 = i32::MIN as i64;
const I32_MAX: i64 = i32::MAX as i64;
const U32_MAX: i64 = u32::MAX as i64;

const ACCEPTS_U32: &str = "an integer between 0 and 4294967295";
const ACCEPTS_SIZE: &str = "a size in bytes between 0 and 4294967295 (k, M, G suffixes allowed)";

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

/// The `sm` component's parameters, in the seed's registration order
/// (component parameters, then the BTL base parameters), indexed by
/// [`ParamId`].
pub static SM_PARAMS: [ParamDef; SM_PARAM_COUNT] = [
    pdef(
        "use_knem",
        ParamKind::Int,
        0,
        (I32_MIN, I32_MAX),
        9,
        "0 (knem is not available in this build; a negative value means 0)",
        "Whether knem support is desired or not (negative = try to enable knem support, but \
         continue even if it is not available, 0 = do not enable knem support, positive = try to \
         enable knem support and fail if it is not available). This build has no knem support: \
         the default is 0, a negative value is treated as 0 and a positive value is an error.",
    ),
    pdef(
        "knem_dma_min",
        ParamKind::Size,
        0,
        (0, U32_MAX),
        9,
        ACCEPTS_SIZE,
        "Minimum message size (in bytes) to use the knem DMA mode; ignored if knem does not \
         support DMA mode (0 = do not use the knem DMA mode)",
    ),
    pdef(
        "knem_max_simultaneous",
        ParamKind::UInt,
        0,
        (0, U32_MAX),
        9,
        ACCEPTS_U32,
        "Max number of simultaneous ongoing knem operations to support (0 = do everything \
         synchronously, which probably gives the best large message latency; >0 means to do all \
         operations asynchronously, which supports better overlap for simultaneous large message \
         sends)",
    ),
    pdef(
        "use_cma",
        ParamKind::Bool,
        1,
        (0, 1),
        9,
        "0, 1, true, false, yes or no",
        "Whether or not to enable CMA (btl: on by default, unlike the seed's 0, which \
         reflected an optional build feature; btl always has CMA, probes it against every \
         peer at start and falls back to the pipelined copy where the kernel refuses it)",
    ),
    pdef(
        "free_list_num",
        ParamKind::Int,
        8,
        (0, I32_MAX),
        5,
        "an integer >= 0",
        "Number of max-size fragments each process allocates up front.",
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
        64,
        (1, I32_MAX),
        5,
        "an integer >= 1",
        "Number of fragments a free list grows by when it runs empty.",
    ),
    pdef(
        "max_procs",
        ParamKind::Int,
        -1,
        (-1, I32_MAX),
        5,
        "-1 (automatic) or an integer >= the number of processes on the node",
        "Maximum number of processes on the node the shared segment is sized for (-1 = the local \
         processes plus sm_extra_procs).",
    ),
    pdef(
        "fifo_size",
        ParamKind::UInt,
        4096,
        (2, MAX_FIFO_SIZE as i64),
        4,
        "an integer between 2 and 2^30 (rounded up to a power of two)",
        "Number of slots in each receive ring (rounded up to a power of two).",
    ),
    pdef(
        "num_fifos",
        ParamKind::Int,
        1,
        (1, 1 << 30),
        4,
        "an integer between 1 and 2^30 (rounded up to a power of two)",
        "Number of receive rings per process; senders are spread over them (rounded up to a \
         power of two).",
    ),
    pdef(
        "fifo_lazy_free",
        ParamKind::UInt,
        120,
        (0, U32_MAX),
        5,
        "an integer >= 0 (clamped to between 1 and fifo_size/2)",
        "Number of slots a receiver reads before returning them to the writers (clamped to \
         between 1 and fifo_size/2).",
    ),
    pdef(
        "sm_extra_procs",
        ParamKind::Int,
        0,
        (I32_MIN, I32_MAX),
        9,
        "an integer (negative = as many extra processes as local ones)",
        "Number of extra processes to size the shared segment for when max_procs is -1 \
         (negative = as many as there are local processes).",
    ),
    pdef(
        "exclusivity",
        ParamKind::UInt,
        65535,
        (0, U32_MAX),
        7,
        ACCEPTS_U32,
        "BTL exclusivity (must be >= 0)",
    ),
    pdef(
        "flags",
        ParamKind::UInt,
        (FLAG_SEND | FLAG_GET) as i64,
        (0, (FLAG_SEND | FLAG_PUT | FLAG_GET) as i64),
        5,
        "a bit mask that includes 1 (send); 2 (put) is not supported, 4 (get) follows use_cma",
        "BTL bit flags (general flags: send, put, get, in-place, hetero-rdma, atomics, \
         fetching-atomics)",
    ),
    pdef(
        "rndv_eager_limit",
        ParamKind::Size,
        4096,
        (0, U32_MAX),
        4,
        "a size in bytes between 0 and eager_limit (k, M, G suffixes allowed)",
        "Size (in bytes, including header) of \"phase 1\" fragment sent for all large messages \
         (must be >= 0 and <= eager_limit)",
    ),
    pdef(
        "eager_limit",
        ParamKind::Size,
        4096,
        (MIN_EAGER_LIMIT as i64, U32_MAX),
        4,
        "a size in bytes between 64 and 4294967295 (k, M, G suffixes allowed)",
        "Maximum size (in bytes, including header) of \"short\" messages (must be >= 1).",
    ),
    pdef(
        "max_send_size",
        ParamKind::Size,
        32768,
        (1, U32_MAX),
        4,
        "a size in bytes >= eager_limit (k, M, G suffixes allowed)",
        "Maximum size (in bytes) of a single \"phase 2\" fragment of a long message when using \
         the pipeline protocol (must be >= 1)",
    ),
    pdef(
        "rdma_pipeline_send_length",
        ParamKind::Size,
        65536,
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
        65536,
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
        65536,
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
        1,
        (0, U32_MAX),
        5,
        ACCEPTS_U32,
        "Approximate latency of interconnect (0 = auto-detect value at run-time [not supported \
         in all BTL modules], >= 1 = latency in microseconds)",
    ),
    pdef(
        "bandwidth",
        ParamKind::UInt,
        9000,
        (0, U32_MAX),
        5,
        ACCEPTS_U32,
        "Approximate maximum bandwidth of interconnect (0 = auto-detect value at run-time [not \
         supported in all BTL modules], >= 1 = bandwidth in Mbps)",
    ),
];

/// Displays the environment variable of a parameter: `BTL_SM_FIFO_SIZE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvName<'a> {
    component: &'a str,
    name: &'a str,
}

impl fmt::Display for EnvName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BTL_")?;
        write_upper(f, self.component)?;
        f.write_str("_")?;
        write_upper(f, self.name)
    }
}

fn write_upper(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    use fmt::Write;
    s.chars()
        .try_for_each(|c| f.write_char(c.to_ascii_uppercase()))
}

/// Displays Open MPI's environment variable of a parameter:
/// `OMPI_MCA_btl_sm_fifo_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OmpiEnvName<'a> {
    component: &'a str,
    name: &'a str,
}

impl fmt::Display for OmpiEnvName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OMPI_MCA_btl_{}_{}", self.component, self.name)
    }
}

/// The environment variable for parameter `name` of `component`:
/// `env_name("sm", "fifo_size")` displays as `BTL_SM_FIFO_SIZE`.
pub fn env_name<'a>(component: &'a str, name: &'a str) -> EnvName<'a> {
    EnvName { component, name }
}

const ENV_PREFIX: &str = "BTL_SM_";
const OMPI_ENV_PREFIX: &str = "OMPI_MCA_btl_sm_";

/// The parameter part of an `sm` environment variable, if `var` is one.
fn env_param_part(var: &str) -> Option<&str> {
    var.strip_prefix(ENV_PREFIX)
        .or_else(|| var.strip_prefix(OMPI_ENV_PREFIX))
}

/// The parameter an environment variable sets: `BTL_SM_<PARAM>` (the
/// parameter part in any case) or Open MPI's `OMPI_MCA_btl_sm_<param>`.
pub fn from_env_name(var: &str) -> Option<&'static ParamDef> {
    env_param_part(var)
        .and_then(ParamId::from_name)
        .map(ParamId::def)
}

/// Capacity of [`ParamName`] in bytes.
pub const PARAM_NAME_CAP: usize = 32;

/// A copy of a name the user gave, truncated to [`PARAM_NAME_CAP`] bytes (at
/// a character boundary), so that an error can hold it without borrowing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ParamName {
    bytes: [u8; PARAM_NAME_CAP],
    len: u8,
    truncated: bool,
}

impl ParamName {
    /// Copies `s`, truncating it if it is longer than [`PARAM_NAME_CAP`].
    pub fn new(s: &str) -> Self {
        let mut end = s.len().min(PARAM_NAME_CAP);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; PARAM_NAME_CAP];
        bytes[..end].copy_from_slice(&s.as_bytes()[..end]);
        ParamName {
            bytes,
            // `end <= PARAM_NAME_CAP`, which fits in a u8.
            len: end as u8,
            truncated: end < s.len(),
        }
    }

    /// The (possibly truncated) name.
    pub fn as_str(&self) -> &str {
        let bytes = self.bytes.get(..usize::from(self.len)).unwrap_or(&[]);
        // Always valid: `new` cuts at a character boundary.
        core::str::from_utf8(bytes).unwrap_or("")
    }

    /// Whether the name was longer than [`PARAM_NAME_CAP`] bytes.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

impl fmt::Debug for ParamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)?;
        if self.truncated {
            f.write_str("...")?;
        }
        Ok(())
    }
}

impl fmt::Display for ParamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        if self.truncated {
            f.write_str("...")?;
        }
        Ok(())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for ParamName {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.as_str());
    }
}

/// Why a parameter could not be set or verified. `name` fields hold the
/// seed's parameter name; `Display` shows the environment variable
/// (`BTL_SM_FIFO_SIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ParamError {
    /// No `sm` parameter has this name (as given: a parameter name or a
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
    /// Two parameters contradict each other.
    Conflict {
        /// The parameter at fault.
        name: &'static str,
        /// The parameter it contradicts.
        other: &'static str,
        /// The rule that is broken.
        rule: &'static str,
    },
    /// The value asks for something this build cannot do.
    Unsupported {
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: i64,
        /// Why it cannot be done.
        reason: &'static str,
    },
    /// `max_procs` is smaller than the number of processes on the node (or
    /// that number is 0: it counts the calling process, so it is >= 1).
    LocalProcs {
        /// The configured `max_procs`.
        max_procs: u32,
        /// The number of processes on the node.
        n_local: u32,
    },
    /// A value derived from this parameter does not fit in 32 bits.
    Overflow {
        /// The parameter.
        name: &'static str,
    },
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env = |name| env_name(COMPONENT, name);
        match *self {
            ParamError::UnknownParam { name } => {
                write!(f, "unknown {COMPONENT} parameter `{name}` (see `btl info`)")
            }
            ParamError::Malformed { name, accepts } => {
                write!(f, "{}: malformed value; it accepts {accepts}", env(name))
            }
            ParamError::OutOfRange {
                name,
                value,
                accepts,
            } => write!(
                f,
                "{}={value} is out of range; it accepts {accepts}",
                env(name)
            ),
            ParamError::Conflict { name, other, rule } => {
                write!(f, "{} conflicts with {}: {rule}", env(name), env(other))
            }
            ParamError::Unsupported {
                name,
                value,
                reason,
            } => write!(f, "{}={value} is not supported: {reason}", env(name)),
            ParamError::LocalProcs {
                n_local: 0,
                max_procs: _,
            } => f.write_str(
                "the number of local processes must be >= 1 (it counts the calling process)",
            ),
            ParamError::LocalProcs { max_procs, n_local } => write!(
                f,
                "{}={max_procs} is less than the {n_local} processes on this node; it accepts {}",
                env("max_procs"),
                ParamId::MaxProcs.def().accepts
            ),
            ParamError::Overflow { name } => write!(
                f,
                "{}: the number of processes derived from it does not fit in 32 bits",
                env(name)
            ),
        }
    }
}

impl core::error::Error for ParamError {}

/// One parameter as `btl info` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    /// The definition.
    pub def: &'static ParamDef,
    /// The current value (booleans as 0/1).
    pub value: i64,
    /// The default value.
    pub default: i64,
    /// Where the current value came from.
    pub source: ParamSource,
    /// Whether [`SmParams::verify`] changed the value since it was last set.
    pub adjusted: bool,
}

/// One change [`SmParams::verify`] made to a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adjustment {
    /// The parameter changed.
    pub param: ParamId,
    /// The value before.
    pub from: i64,
    /// The value after.
    pub to: i64,
    /// Why.
    pub reason: &'static str,
}

impl fmt::Display for Adjustment {
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

/// What [`SmParams::verify`] adjusted (at most one entry per parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    entries: [Adjustment; SM_PARAM_COUNT],
    len: usize,
}

impl Verified {
    const fn new() -> Self {
        const EMPTY: Adjustment = Adjustment {
            param: ParamId::UseKnem,
            from: 0,
            to: 0,
            reason: "",
        };
        Verified {
            entries: [EMPTY; SM_PARAM_COUNT],
            len: 0,
        }
    }

    /// The adjustments, in the order they were made.
    pub fn adjustments(&self) -> &[Adjustment] {
        self.entries.get(..self.len).unwrap_or(&[])
    }

    /// The adjustment of `param`, if verify changed it.
    pub fn get(&self, param: ParamId) -> Option<&Adjustment> {
        self.adjustments().iter().find(|a| a.param == param)
    }

    /// True when verify changed nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records a change; a second change of the same parameter merges into
    /// the first (original `from`, latest `to` and reason).
    fn push(&mut self, adj: Adjustment) {
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

/// The `sm` component's parameter values, with the seed's types and
/// defaults, and where each value came from.
///
/// Fields may be assigned directly from code; call [`SmParams::verify`]
/// afterwards. A field that differs from its default while its recorded
/// source is [`ParamSource::Default`] is reported as set by
/// [`ParamSource::Code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmParams {
    /// Whether knem is wanted (negative = if available, 0 = no, positive =
    /// required). Not available in this build.
    pub use_knem: i32,
    /// Minimum message size for knem's DMA mode (0 = never).
    pub knem_dma_min: u32,
    /// Maximum simultaneous knem operations (0 = synchronous).
    pub knem_max_simultaneous: u32,
    /// Whether single copy through CMA (`process_vm_readv`) is enabled.
    pub use_cma: bool,
    /// Max-size fragments allocated up front.
    pub free_list_num: i32,
    /// Maximum fragments per free list (-1 = unlimited).
    pub free_list_max: i32,
    /// Free-list growth increment.
    pub free_list_inc: i32,
    /// Processes the segment is sized for (-1 = automatic).
    pub max_procs: i32,
    /// Slots per receive ring.
    pub fifo_size: u32,
    /// Receive rings per process.
    pub num_fifos: i32,
    /// Reads between returning slots to the writers.
    pub fifo_lazy_free: u32,
    /// Extra processes to size for when `max_procs` is -1.
    pub sm_extra_procs: i32,
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
    /// Latency in microseconds.
    pub latency: u32,
    /// Bandwidth in Mbps.
    pub bandwidth: u32,
    sources: [ParamSource; SM_PARAM_COUNT],
    adjusted: u32,
}

impl Default for SmParams {
    fn default() -> Self {
        Self::new()
    }
}

fn to_i32(id: ParamId, v: i64) -> Result<i32, ParamError> {
    i32::try_from(v).map_err(|_| out_of_range(id, v))
}

fn to_u32(id: ParamId, v: i64) -> Result<u32, ParamError> {
    u32::try_from(v).map_err(|_| out_of_range(id, v))
}

fn out_of_range(id: ParamId, value: i64) -> ParamError {
    let def = id.def();
    ParamError::OutOfRange {
        name: def.name,
        value,
        accepts: def.accepts,
    }
}

/// Checks `v` against the parameter's own range (not against other
/// parameters).
fn check_domain(id: ParamId, v: i64) -> Result<(), ParamError> {
    let def = id.def();
    if v < def.min || v > def.max || (id == ParamId::MaxProcs && v == 0) {
        return Err(out_of_range(id, v));
    }
    Ok(())
}

impl SmParams {
    /// The seed's defaults, all with source [`ParamSource::Default`].
    pub const fn new() -> Self {
        SmParams {
            use_knem: 0,
            knem_dma_min: 0,
            knem_max_simultaneous: 0,
            use_cma: true,
            free_list_num: 8,
            free_list_max: -1,
            free_list_inc: 64,
            max_procs: -1,
            fifo_size: 4096,
            num_fifos: 1,
            fifo_lazy_free: 120,
            sm_extra_procs: 0,
            exclusivity: 65535,
            flags: FLAG_SEND | FLAG_GET,
            rndv_eager_limit: 4096,
            eager_limit: 4096,
            max_send_size: 32 * 1024,
            rdma_pipeline_send_length: 64 * 1024,
            rdma_pipeline_frag_size: 64 * 1024,
            min_rdma_pipeline_size: 64 * 1024,
            latency: 1,
            bandwidth: 9000,
            sources: [ParamSource::Default; SM_PARAM_COUNT],
            adjusted: 0,
        }
    }

    /// The current value of `id` as an `i64` (booleans as 0/1).
    pub fn get(&self, id: ParamId) -> i64 {
        match id {
            ParamId::UseKnem => i64::from(self.use_knem),
            ParamId::KnemDmaMin => i64::from(self.knem_dma_min),
            ParamId::KnemMaxSimultaneous => i64::from(self.knem_max_simultaneous),
            ParamId::UseCma => i64::from(self.use_cma),
            ParamId::FreeListNum => i64::from(self.free_list_num),
            ParamId::FreeListMax => i64::from(self.free_list_max),
            ParamId::FreeListInc => i64::from(self.free_list_inc),
            ParamId::MaxProcs => i64::from(self.max_procs),
            ParamId::FifoSize => i64::from(self.fifo_size),
            ParamId::NumFifos => i64::from(self.num_fifos),
            ParamId::FifoLazyFree => i64::from(self.fifo_lazy_free),
            ParamId::SmExtraProcs => i64::from(self.sm_extra_procs),
            ParamId::Exclusivity => i64::from(self.exclusivity),
            ParamId::Flags => i64::from(self.flags),
            ParamId::RndvEagerLimit => i64::from(self.rndv_eager_limit),
            ParamId::EagerLimit => i64::from(self.eager_limit),
            ParamId::MaxSendSize => i64::from(self.max_send_size),
            ParamId::RdmaPipelineSendLength => i64::from(self.rdma_pipeline_send_length),
            ParamId::RdmaPipelineFragSize => i64::from(self.rdma_pipeline_frag_size),
            ParamId::MinRdmaPipelineSize => i64::from(self.min_rdma_pipeline_size),
            ParamId::Latency => i64::from(self.latency),
            ParamId::Bandwidth => i64::from(self.bandwidth),
        }
    }

    /// Stores `v` into the field of `id`; fails only if `v` does not fit the
    /// field's type.
    fn store(&mut self, id: ParamId, v: i64) -> Result<(), ParamError> {
        match id {
            ParamId::UseKnem => self.use_knem = to_i32(id, v)?,
            ParamId::KnemDmaMin => self.knem_dma_min = to_u32(id, v)?,
            ParamId::KnemMaxSimultaneous => self.knem_max_simultaneous = to_u32(id, v)?,
            ParamId::UseCma => self.use_cma = to_u32(id, v)? != 0,
            ParamId::FreeListNum => self.free_list_num = to_i32(id, v)?,
            ParamId::FreeListMax => self.free_list_max = to_i32(id, v)?,
            ParamId::FreeListInc => self.free_list_inc = to_i32(id, v)?,
            ParamId::MaxProcs => self.max_procs = to_i32(id, v)?,
            ParamId::FifoSize => self.fifo_size = to_u32(id, v)?,
            ParamId::NumFifos => self.num_fifos = to_i32(id, v)?,
            ParamId::FifoLazyFree => self.fifo_lazy_free = to_u32(id, v)?,
            ParamId::SmExtraProcs => self.sm_extra_procs = to_i32(id, v)?,
            ParamId::Exclusivity => self.exclusivity = to_u32(id, v)?,
            ParamId::Flags => self.flags = to_u32(id, v)?,
            ParamId::RndvEagerLimit => self.rndv_eager_limit = to_u32(id, v)?,
            ParamId::EagerLimit => self.eager_limit = to_u32(id, v)?,
            ParamId::MaxSendSize => self.max_send_size = to_u32(id, v)?,
            ParamId::RdmaPipelineSendLength => self.rdma_pipeline_send_length = to_u32(id, v)?,
            ParamId::RdmaPipelineFragSize => self.rdma_pipeline_frag_size = to_u32(id, v)?,
            ParamId::MinRdmaPipelineSize => self.min_rdma_pipeline_size = to_u32(id, v)?,
            ParamId::Latency => self.latency = to_u32(id, v)?,
            ParamId::Bandwidth => self.bandwidth = to_u32(id, v)?,
        }
        Ok(())
    }

    /// Where the value of `id` came from: the recorded source, except that a
    /// value that differs from the default while recorded as
    /// [`ParamSource::Default`] (a field assigned by code) counts as
    /// [`ParamSource::Code`] unless verify produced it.
    pub fn source(&self, id: ParamId) -> ParamSource {
        let recorded = self
            .sources
            .get(id.index())
            .copied()
            .unwrap_or(ParamSource::Default);
        if recorded == ParamSource::Default
            && self.get(id) != id.def().default
            && !self.is_adjusted(id)
        {
            ParamSource::Code
        } else {
            recorded
        }
    }

    /// Whether [`SmParams::verify`] changed `id` since it was last set.
    pub fn is_adjusted(&self, id: ParamId) -> bool {
        self.adjusted & id.bit() != 0
    }

    /// Sets parameter `name` (the seed's name, ASCII case-insensitive) from
    /// its textual `value`, recording `source`.
    ///
    /// Numbers are decimal or `0x` hexadecimal, optionally signed, with an
    /// optional binary suffix `k`/`K` (KiB), `m`/`M` (MiB) or `g`/`G` (GiB);
    /// booleans are `0`/`1`/`true`/`false`/`yes`/`no`. The value must lie in
    /// the parameter's own range; rules between parameters are checked by
    /// [`SmParams::verify`]. On error nothing changes.
    pub fn set(&mut self, name: &str, value: &str, source: ParamSource) -> Result<(), ParamError> {
        let id = ParamId::from_name(name).ok_or(ParamError::UnknownParam {
            name: ParamName::new(name),
        })?;
        self.set_id(id, value, source)
    }

    /// [`SmParams::set`] for a known parameter.
    pub fn set_id(
        &mut self,
        id: ParamId,
        value: &str,
        source: ParamSource,
    ) -> Result<(), ParamError> {
        let def = id.def();
        let malformed = ParamError::Malformed {
            name: def.name,
            accepts: def.accepts,
        };
        let v = match def.kind {
            ParamKind::Bool => parse_bool(value),
            ParamKind::Int | ParamKind::UInt | ParamKind::Size => parse_number(value),
        };
        let v = match v {
            Ok(v) => v,
            Err(NumError::Malformed) => return Err(malformed),
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
        id: ParamId,
        v: i64,
        source: ParamSource,
    ) -> Result<(), ParamError> {
        check_domain(id, v)?;
        self.store(id, v)?;
        if let Some(s) = self.sources.get_mut(id.index()) {
            *s = source;
        }
        self.adjusted &= !id.bit();
        Ok(())
    }

    /// Applies one environment variable: `Ok(false)` if `var` is not an `sm`
    /// variable (neither `BTL_SM_*` nor `OMPI_MCA_btl_sm_*`), `Ok(true)` once
    /// set. An `sm` variable naming no parameter is
    /// [`ParamError::UnknownParam`] holding the whole variable name.
    pub fn set_from_env_var(&mut self, var: &str, value: &str) -> Result<bool, ParamError> {
        let Some(param) = env_param_part(var) else {
            return Ok(false);
        };
        let id = ParamId::from_name(param).ok_or(ParamError::UnknownParam {
            name: ParamName::new(var),
        })?;
        self.set_id(id, value, ParamSource::Environment)?;
        Ok(true)
    }

    /// Every parameter with its current value, default and source, in table
    /// order (for `btl info`).
    pub fn iter(&self) -> impl Iterator<Item = ParamInfo> + '_ {
        ParamId::ALL.into_iter().map(move |id| {
            let def = id.def();
            ParamInfo {
                def,
                value: self.get(id),
                default: def.default,
                source: self.source(id),
                adjusted: self.is_adjusted(id),
            }
        })
    }

    /// Applies the seed's verify and open rules and Open MPI's base BTL
    /// parameter checks.
    ///
    /// Errors (nothing is changed then): a value outside its own range;
    /// `use_knem` > 0 (knem is not available in this build); `flags` without
    /// [`FLAG_SEND`]; `max_send_size` < `eager_limit`; `free_list_max` not -1
    /// and < `free_list_num`.
    ///
    /// Adjustments (each logged, recorded in the result and in
    /// [`ParamInfo::adjusted`]): negative `use_knem` → 0; `use_cma` off if
    /// knem is on; [`FLAG_PUT`] cleared, [`FLAG_GET`] set exactly when
    /// `use_cma`; `num_fifos` and `fifo_size` rounded up to powers of two;
    /// `fifo_lazy_free` clamped to [1, `fifo_size`/2] (of the rounded ring
    /// size); `rndv_eager_limit` clamped to `eager_limit`;
    /// `min_rdma_pipeline_size` raised to at least `eager_limit` +
    /// `rdma_pipeline_send_length` (saturating at `u32::MAX`).
    ///
    /// Verify is idempotent: a second call adjusts nothing.
    pub fn verify(&mut self) -> Result<Verified, ParamError> {
        // Errors first, so that a failing verify leaves everything as it was.
        for id in ParamId::ALL {
            check_domain(id, self.get(id))?;
        }
        if self.use_knem > 0 {
            return Err(ParamError::Unsupported {
                name: ParamId::UseKnem.def().name,
                value: i64::from(self.use_knem),
                reason: "knem support is not available in this build",
            });
        }
        if self.flags & FLAG_SEND == 0 {
            return Err(out_of_range(ParamId::Flags, i64::from(self.flags)));
        }
        if self.max_send_size < self.eager_limit {
            return Err(ParamError::Conflict {
                name: ParamId::MaxSendSize.def().name,
                other: ParamId::EagerLimit.def().name,
                rule: "max_send_size must be >= eager_limit",
            });
        }
        if self.free_list_max != -1 && self.free_list_max < self.free_list_num {
            return Err(ParamError::Conflict {
                name: ParamId::FreeListMax.def().name,
                other: ParamId::FreeListNum.def().name,
                rule: "free_list_max must be -1 (unlimited) or >= free_list_num",
            });
        }

        let mut out = Verified::new();

        // Seed: negative use_knem means "use it if available"; it is not.
        if self.use_knem < 0 {
            self.adjust(
                &mut out,
                ParamId::UseKnem,
                0,
                "knem support is not available in this build",
                &[],
            )?;
        }
        // Seed verify: knem wins over CMA (only reachable with knem support).
        if self.use_knem != 0 && self.use_cma {
            self.adjust(
                &mut out,
                ParamId::UseCma,
                0,
                "CMA disabled because knem is enabled",
                &[ParamId::UseKnem],
            )?;
        }
        // Seed verify: single copy enables GET; base verify drops what the
        // module cannot do (no put at all, no get without single copy).
        let mut flags = self.flags & !FLAG_PUT;
        if self.use_cma || self.use_knem != 0 {
            flags |= FLAG_GET;
        } else {
            flags &= !FLAG_GET;
        }
        if flags != self.flags {
            self.adjust(
                &mut out,
                ParamId::Flags,
                i64::from(flags),
                "put is not supported; get follows use_cma",
                // Derived from use_cma: worth a warning only if the user set
                // flags themselves.
                &[],
            )?;
        }
        // Seed open: the number of rings is a power of two.
        let nfifos = next_pow2(i64::from(self.num_fifos));
        if nfifos != i64::from(self.num_fifos) {
            self.adjust(
                &mut out,
                ParamId::NumFifos,
                nfifos,
                "rounded up to a power of two",
                &[],
            )?;
        }
        // Seed sm_fifo_init: the ring size is a power of two.
        let size = next_pow2(i64::from(self.fifo_size));
        if size != i64::from(self.fifo_size) {
            self.adjust(
                &mut out,
                ParamId::FifoSize,
                size,
                "rounded up to a power of two",
                &[],
            )?;
        }
        // Seed open: 1 <= lazy_free <= fifo_size / 2.
        let half = i64::from(self.fifo_size >> 1);
        let lazy = i64::from(self.fifo_lazy_free);
        let clamped = lazy.min(half).max(1);
        if clamped != lazy {
            self.adjust(
                &mut out,
                ParamId::FifoLazyFree,
                clamped,
                "clamped to between 1 and fifo_size/2",
                &[ParamId::FifoSize],
            )?;
        }
        // Base: the first fragment of a large message is an eager fragment.
        if self.rndv_eager_limit > self.eager_limit {
            self.adjust(
                &mut out,
                ParamId::RndvEagerLimit,
                i64::from(self.eager_limit),
                "clamped to eager_limit",
                &[ParamId::EagerLimit],
            )?;
        }
        // Base verify: min_rdma_pipeline_size >= eager_limit + send length.
        let floor = u64::from(self.eager_limit)
            .saturating_add(u64::from(self.rdma_pipeline_send_length))
            .min(u64::from(u32::MAX));
        if u64::from(self.min_rdma_pipeline_size) < floor {
            self.adjust(
                &mut out,
                ParamId::MinRdmaPipelineSize,
                i64::try_from(floor).unwrap_or(U32_MAX),
                "raised to eager_limit + rdma_pipeline_send_length",
                &[ParamId::EagerLimit, ParamId::RdmaPipelineSendLength],
            )?;
        }
        Ok(out)
    }

    /// Changes `id` to `to` on behalf of verify: records it, and warns if the
    /// user set `id` or one of the parameters `causes` (an adjustment of
    /// defaults alone, such as `min_rdma_pipeline_size`, is only a debug
    /// message).
    fn adjust(
        &mut self,
        out: &mut Verified,
        id: ParamId,
        to: i64,
        reason: &'static str,
        causes: &[ParamId],
    ) -> Result<(), ParamError> {
        let from = self.get(id);
        let user_set = core::iter::once(&id)
            .chain(causes)
            .any(|&p| self.source(p) != ParamSource::Default);
        self.store(id, to)?;
        self.adjusted |= id.bit();
        out.push(Adjustment {
            param: id,
            from,
            to,
            reason,
        });
        let name = id.def().name;
        if user_set {
            warn!(
                "btl sm: parameter {} adjusted from {} to {}: {}",
                name, from, to, reason
            );
        } else {
            debug!(
                "btl sm: parameter {} adjusted from {} to {}: {}",
                name, from, to, reason
            );
        }
        Ok(())
    }
}

/// Smallest power of two >= `v` (for `v` >= 1 within the verified ranges,
/// which are at most 2^30); `v` itself if that would not fit.
fn next_pow2(v: i64) -> i64 {
    u64::try_from(v)
        .ok()
        .and_then(u64::checked_next_power_of_two)
        .and_then(|p| i64::try_from(p).ok())
        .unwrap_or(v)
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
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (shift, rest) = match rest.as_bytes().last() {
        Some(b'k' | b'K') => (10, &rest[..rest.len() - 1]),
        Some(b'm' | b'M') => (20, &rest[..rest.len() - 1]),
        Some(b'g' | b'G') => (30, &rest[..rest.len() - 1]),
        _ => (0, rest),
    };
    let (radix, digits) = match rest.get(..2) {
        Some("0x" | "0X") => (16, &rest[2..]),
        _ => (10, rest),
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

/// The number of processes the shared segment is sized for, given the
/// number of processes on this node (`n_local`, counting the caller): the
/// seed's `calc_sm_max_procs`. With `max_procs` < 0 it is `n_local +
/// sm_extra_procs` if `sm_extra_procs` >= 0, else `2 * n_local`; otherwise
/// `max_procs`, which must then be >= `n_local`.
pub fn calc_sm_max_procs(params: &SmParams, n_local: u32) -> Result<u32, ParamError> {
    let max_procs = params.max_procs;
    if n_local == 0 {
        return Err(ParamError::LocalProcs {
            max_procs: max_procs.max(0).unsigned_abs(),
            n_local,
        });
    }
    if max_procs < 0 {
        let extra = params.sm_extra_procs;
        if extra >= 0 {
            n_local
                .checked_add(extra.unsigned_abs())
                .ok_or(ParamError::Overflow {
                    name: ParamId::SmExtraProcs.def().name,
                })
        } else {
            n_local.checked_mul(2).ok_or(ParamError::Overflow {
                name: ParamId::MaxProcs.def().name,
            })
        }
    } else {
        let max_procs = max_procs.unsigned_abs();
        if max_procs < n_local {
            return Err(ParamError::LocalProcs { max_procs, n_local });
        }
        Ok(max_procs)
    }
}

/// How many receive rings a process owns: `min(num_fifos, nprocs)` (the
/// seed's `FIFO_MAP_NUM`).
pub fn fifo_map_num(num_fifos: u32, nprocs: u32) -> u32 {
    num_fifos.min(nprocs)
}

/// The ring of a receiver that `sender` writes into: `sender & (num_fifos -
/// 1)` (the seed's `FIFO_MAP`). `num_fifos` must be a power of two (verified
/// parameters are).
pub fn fifo_map(sender: u32, num_fifos: u32) -> u32 {
    debug_assert!(
        num_fifos.is_power_of_two(),
        "num_fifos must be a power of two"
    );
    sender & num_fifos.wrapping_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn table_matches_ids_and_defaults() {
        let p = SmParams::new();
        for (i, id) in ParamId::ALL.into_iter().enumerate() {
            assert_eq!(id.index(), i);
            let def = id.def();
            assert_eq!(def.component, "sm");
            assert_eq!(p.get(id), def.default, "{}", def.name);
            assert!(
                def.min <= def.default && def.default <= def.max,
                "{}",
                def.name
            );
            assert!(!def.help.is_empty() && !def.accepts.is_empty());
            assert_eq!(ParamId::from_name(def.name), Some(id));
            assert_eq!(p.source(id), ParamSource::Default);
        }
        assert_eq!(SmParams::default(), p);
        assert_eq!(ParamId::FifoSize.def().default, 4096);
        assert_eq!(ParamId::Exclusivity.def().default, 65535);
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name("sm", "fifo_size").to_string(), "BTL_SM_FIFO_SIZE");
        let def = ParamId::FifoLazyFree.def();
        assert_eq!(
            def.ompi_env_name().to_string(),
            "OMPI_MCA_btl_sm_fifo_lazy_free"
        );
        assert_eq!(
            from_env_name("BTL_SM_FIFO_SIZE").map(|d| d.name),
            Some("fifo_size")
        );
        assert_eq!(
            from_env_name("BTL_SM_fifo_Size").map(|d| d.name),
            Some("fifo_size")
        );
        assert_eq!(
            from_env_name("OMPI_MCA_btl_sm_num_fifos").map(|d| d.name),
            Some("num_fifos")
        );
        assert!(from_env_name("BTL_TCP_FIFO_SIZE").is_none());
        assert!(from_env_name("BTL_SM_NOPE").is_none());
    }

    #[test]
    fn parse_numbers() {
        let mut p = SmParams::new();
        p.set("eager_limit", " 8k ", ParamSource::Code).unwrap();
        assert_eq!(p.eager_limit, 8192);
        p.set("max_send_size", "0x10000", ParamSource::Code)
            .unwrap();
        assert_eq!(p.max_send_size, 65536);
        p.set("max_send_size", "1M", ParamSource::Code).unwrap();
        assert_eq!(p.max_send_size, 1 << 20);
        p.set("rdma_pipeline_frag_size", "2g", ParamSource::Code)
            .unwrap();
        assert_eq!(p.rdma_pipeline_frag_size, 2 << 30);
        p.set("sm_extra_procs", "-3", ParamSource::Code).unwrap();
        assert_eq!(p.sm_extra_procs, -3);
        p.set("FREE_LIST_MAX", "+100", ParamSource::Code).unwrap();
        assert_eq!(p.free_list_max, 100);
        for bad in ["", "abc", "0x", "12q", "--1", "1.5", "k", "0xg"] {
            assert!(
                matches!(
                    p.set("fifo_size", bad, ParamSource::Code),
                    Err(ParamError::Malformed {
                        name: "fifo_size",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            p.set("eager_limit", "4g", ParamSource::Code),
            Err(ParamError::OutOfRange {
                name: "eager_limit",
                value: 4 << 30,
                accepts: ParamId::EagerLimit.def().accepts
            })
        );
        assert!(matches!(
            p.set("fifo_size", "99999999999999999999999", ParamSource::Code),
            Err(ParamError::OutOfRange {
                value: i64::MAX,
                ..
            })
        ));
        assert!(matches!(
            p.set("use_knem", "-9999999999999g", ParamSource::Code),
            Err(ParamError::OutOfRange { .. })
        ));
        assert!(matches!(
            p.set("max_procs", "0", ParamSource::Code),
            Err(ParamError::OutOfRange { value: 0, .. })
        ));
        assert_eq!(p.eager_limit, 8192, "failed sets change nothing");
    }

    #[test]
    fn parse_bools() {
        let mut p = SmParams::new();
        for (s, v) in [
            ("yes", true),
            ("0", false),
            ("TRUE", true),
            ("no", false),
            ("1", true),
        ] {
            p.set("use_cma", s, ParamSource::Environment).unwrap();
            assert_eq!(p.use_cma, v);
        }
        assert!(matches!(
            p.set("use_cma", "2", ParamSource::Code),
            Err(ParamError::OutOfRange { value: 2, .. })
        ));
        assert!(matches!(
            p.set("use_cma", "maybe", ParamSource::Code),
            Err(ParamError::Malformed { .. })
        ));
    }

    #[test]
    fn env_vars_and_sources() {
        let mut p = SmParams::new();
        assert_eq!(p.set_from_env_var("PATH", "/bin"), Ok(false));
        assert_eq!(p.set_from_env_var("BTL_SM_FIFO_SIZE", "8192"), Ok(true));
        assert_eq!(
            p.set_from_env_var("OMPI_MCA_btl_sm_num_fifos", "2"),
            Ok(true)
        );
        assert_eq!((p.fifo_size, p.num_fifos), (8192, 2));
        assert_eq!(p.source(ParamId::FifoSize), ParamSource::Environment);
        let err = p.set_from_env_var("BTL_SM_FIFO_SIZ", "1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown sm parameter `BTL_SM_FIFO_SIZ` (see `btl info`)"
        );
        p.latency = 7;
        assert_eq!(p.source(ParamId::Latency), ParamSource::Code);
        assert_eq!(p.source(ParamId::Bandwidth), ParamSource::Default);
        let info = p.iter().find(|i| i.def.name == "fifo_size").unwrap();
        assert_eq!((info.value, info.default), (8192, 4096));
        assert_eq!(p.iter().count(), SM_PARAM_COUNT);
    }

    #[test]
    fn unknown_names_are_truncated() {
        let long = "BTL_SM_THIS_IS_A_VERY_LONG_NAME_Ü_THAT_GOES_ON";
        let n = ParamName::new(long);
        assert!(n.is_truncated());
        assert!(n.as_str().len() <= PARAM_NAME_CAP);
        assert!(long.starts_with(n.as_str()));
        assert!(n.to_string().ends_with("..."));
        assert_eq!(ParamName::new("x").to_string(), "x");
    }

    #[test]
    fn error_messages_name_env_var() {
        let mut p = SmParams::new();
        let e = p.set("fifo_size", "1", ParamSource::Code).unwrap_err();
        assert_eq!(
            e.to_string(),
            "BTL_SM_FIFO_SIZE=1 is out of range; it accepts an integer between 2 and 2^30 \
             (rounded up to a power of two)"
        );
        let e = p.set("num_fifos", "x", ParamSource::Code).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("BTL_SM_NUM_FIFOS: malformed value; it accepts"));
    }

    #[test]
    fn verify_defaults() {
        let mut p = SmParams::new();
        let v = p.verify().unwrap();
        // Open MPI's base rule raises min_rdma_pipeline_size on defaults.
        assert_eq!(v.adjustments().len(), 1);
        assert_eq!(p.min_rdma_pipeline_size, 4096 + 65536);
        assert!(p.is_adjusted(ParamId::MinRdmaPipelineSize));
        assert_eq!(p.source(ParamId::MinRdmaPipelineSize), ParamSource::Default);
        assert!(p.verify().unwrap().is_empty(), "idempotent");
    }

    #[test]
    fn verify_rounds_and_clamps() {
        let mut p = SmParams::new();
        p.fifo_size = 100;
        p.num_fifos = 3;
        p.fifo_lazy_free = 1000;
        p.rndv_eager_limit = 10_000;
        p.use_knem = -1;
        p.use_cma = true;
        p.flags = FLAG_SEND | FLAG_PUT;
        p.eager_limit = u32::MAX;
        p.max_send_size = u32::MAX;
        let v = p.verify().unwrap();
        assert_eq!(p.fifo_size, 128);
        assert_eq!(p.num_fifos, 4);
        assert_eq!(p.fifo_lazy_free, 64);
        assert_eq!(p.rndv_eager_limit, 10_000);
        assert_eq!(p.use_knem, 0);
        assert_eq!(p.flags, FLAG_SEND | FLAG_GET);
        assert_eq!(p.min_rdma_pipeline_size, u32::MAX);
        assert_eq!(
            v.get(ParamId::FifoLazyFree).map(|a| (a.from, a.to)),
            Some((1000, 64))
        );
        assert!(v.get(ParamId::RndvEagerLimit).is_none());
        assert!(v
            .get(ParamId::FifoSize)
            .unwrap()
            .to_string()
            .starts_with("BTL_SM_FIFO_SIZE adjusted from 100 to 128"));

        let mut p = SmParams::new();
        p.fifo_lazy_free = 0;
        p.rndv_eager_limit = 5000;
        p.verify().unwrap();
        assert_eq!((p.fifo_lazy_free, p.rndv_eager_limit), (1, 4096));
        assert!(p.verify().unwrap().is_empty());
    }

    #[test]
    fn verify_errors_change_nothing() {
        let cases: [fn(&mut SmParams); 8] = [
            |p| p.use_knem = 1,
            |p| p.num_fifos = 0,
            |p| p.fifo_size = 1,
            |p| p.fifo_size = (1 << 30) + 1,
            |p| p.max_send_size = 1000,
            |p| p.free_list_max = 4,
            |p| p.flags = FLAG_GET,
            |p| p.eager_limit = MIN_EAGER_LIMIT - 1,
        ];
        for f in cases {
            let mut p = SmParams::new();
            f(&mut p);
            p.fifo_lazy_free = 0;
            let before = p;
            assert!(p.verify().is_err());
            assert_eq!(p, before);
        }
        let mut p = SmParams::new();
        p.max_send_size = 1000;
        assert_eq!(
            p.verify().unwrap_err().to_string(),
            "BTL_SM_MAX_SEND_SIZE conflicts with BTL_SM_EAGER_LIMIT: max_send_size must be >= \
             eager_limit"
        );
    }

    #[test]
    fn max_procs() {
        let mut p = SmParams::new();
        assert_eq!(calc_sm_max_procs(&p, 4), Ok(4));
        p.sm_extra_procs = 2;
        assert_eq!(calc_sm_max_procs(&p, 4), Ok(6));
        p.sm_extra_procs = -1;
        assert_eq!(calc_sm_max_procs(&p, 4), Ok(8));
        assert!(matches!(
            calc_sm_max_procs(&p, u32::MAX),
            Err(ParamError::Overflow { name: "max_procs" })
        ));
        p.sm_extra_procs = i32::MAX;
        assert!(matches!(
            calc_sm_max_procs(&p, u32::MAX - 1),
            Err(ParamError::Overflow {
                name: "sm_extra_procs"
            })
        ));
        p.max_procs = 16;
        assert_eq!(calc_sm_max_procs(&p, 16), Ok(16));
        let e = calc_sm_max_procs(&p, 17).unwrap_err();
        assert_eq!(
            e,
            ParamError::LocalProcs {
                max_procs: 16,
                n_local: 17
            }
        );
        assert!(e
            .to_string()
            .starts_with("BTL_SM_MAX_PROCS=16 is less than the 17"));
        assert!(calc_sm_max_procs(&p, 0).is_err());
    }

    #[test]
    fn fifo_mapping() {
        assert_eq!(fifo_map_num(4, 2), 2);
        assert_eq!(fifo_map_num(1, 8), 1);
        assert_eq!(fifo_map(5, 4), 1);
        assert_eq!(fifo_map(5, 1), 0);
        // With fewer processes than rings, every sender still maps below
        // fifo_map_num.
        for s in 0..3 {
            assert!(fifo_map(s, 4) < fifo_map_num(4, 3));
        }
    }
}
