//! Open MPI's base BTL parameters (`mca_btl_base_param_register` and
//! `mca_btl_base_param_verify`) and the free-list parameters both seeds
//! register: their definitions (name, type, level and help text shared by
//! every component; defaults and limits per component) and the rules
//! between them.
//!
//! A component lists these definitions in its table at the seed's
//! registration positions and names the keys in a [`BaseKeys`], then calls
//! [`check`] from its [`Params::check_rules`] and [`adjust`] from its
//! [`Params::apply_rules`].

use super::def::{ParamDef, ParamKind, Value};
use super::error::ParamError;
use super::registry::{ParamKey, Params, Verified};

/// `flags` bit: the BTL sends fragments (Open MPI's `MCA_BTL_FLAGS_SEND`).
pub const FLAG_SEND: u32 = 0x1;
/// `flags` bit: remote put (`MCA_BTL_FLAGS_PUT`).
pub const FLAG_PUT: u32 = 0x2;
/// `flags` bit: remote get (`MCA_BTL_FLAGS_GET`).
pub const FLAG_GET: u32 = 0x4;

/// What an unsigned 32-bit parameter accepts.
pub const ACCEPTS_U32: &str = "an integer between 0 and 4294967295";
/// What a 32-bit size parameter accepts.
pub const ACCEPTS_SIZE: &str =
    "a size in bytes between 0 and 4294967295 (k, M, G suffixes allowed)";
/// What a boolean parameter accepts.
pub const ACCEPTS_BOOL: &str = "0, 1, true, false, yes or no";

const I32_MAX: i64 = i32::MAX as i64;
const U32_MAX: i64 = u32::MAX as i64;

/// `free_list_num` (the seeds' help texts differ).
pub const fn free_list_num(help: &'static str) -> ParamDef {
    ParamDef::number("free_list_num", ParamKind::Int, 8, (0, I32_MAX)).doc(
        5,
        "an integer >= 0",
        help,
    )
}

/// `free_list_max`.
pub const fn free_list_max() -> ParamDef {
    ParamDef::number("free_list_max", ParamKind::Int, -1, (-1, I32_MAX)).doc(
        5,
        "-1 (unlimited) or an integer >= free_list_num",
        "Maximum number of fragments in each free list (-1 = unlimited).",
    )
}

/// `free_list_inc`.
pub const fn free_list_inc(default: i64) -> ParamDef {
    ParamDef::number("free_list_inc", ParamKind::Int, default, (1, I32_MAX)).doc(
        5,
        "an integer >= 1",
        "Number of fragments a free list grows by when it runs empty.",
    )
}

/// `exclusivity`.
pub const fn exclusivity(default: u32) -> ParamDef {
    ParamDef::number("exclusivity", ParamKind::UInt, default as i64, (0, U32_MAX)).doc(
        7,
        ACCEPTS_U32,
        "BTL exclusivity (must be >= 0)",
    )
}

/// `flags`: a mask of [`FLAG_SEND`], [`FLAG_PUT`] and [`FLAG_GET`].
pub const fn flags(default: u32, accepts: &'static str) -> ParamDef {
    let all = (FLAG_SEND | FLAG_PUT | FLAG_GET) as i64;
    ParamDef::number("flags", ParamKind::UInt, default as i64, (0, all)).doc(
        5,
        accepts,
        "BTL bit flags (general flags: send, put, get, in-place, hetero-rdma, atomics, \
         fetching-atomics)",
    )
}

/// `rndv_eager_limit`.
pub const fn rndv_eager_limit(default: u32) -> ParamDef {
    ParamDef::number(
        "rndv_eager_limit",
        ParamKind::Size,
        default as i64,
        (0, U32_MAX),
    )
    .doc(
        4,
        "a size in bytes between 0 and eager_limit (k, M, G suffixes allowed)",
        "Size (in bytes, including header) of \"phase 1\" fragment sent for all large messages \
         (must be >= 0 and <= eager_limit)",
    )
}

/// `eager_limit`, at least `min`.
pub const fn eager_limit(default: u32, min: u32, accepts: &'static str) -> ParamDef {
    let range = (min as i64, U32_MAX);
    ParamDef::number("eager_limit", ParamKind::Size, default as i64, range).doc(
        4,
        accepts,
        "Maximum size (in bytes, including header) of \"short\" messages (must be >= 1).",
    )
}

/// `max_send_size`, at most `max`.
pub const fn max_send_size(default: u32, max: u32, accepts: &'static str) -> ParamDef {
    let range = (1, max as i64);
    ParamDef::number("max_send_size", ParamKind::Size, default as i64, range).doc(
        4,
        accepts,
        "Maximum size (in bytes) of a single \"phase 2\" fragment of a long message when using \
         the pipeline protocol (must be >= 1)",
    )
}

/// `rdma_pipeline_send_length`.
pub const fn rdma_pipeline_send_length(default: u32) -> ParamDef {
    let range = (0, U32_MAX);
    ParamDef::number(
        "rdma_pipeline_send_length",
        ParamKind::Size,
        default as i64,
        range,
    )
    .doc(
        4,
        ACCEPTS_SIZE,
        "Length of the \"phase 2\" portion of a large message (in bytes) when using the pipeline \
         protocol.  This part of the message will be split into fragments of size max_send_size \
         and sent using send/receive semantics (must be >= 0; only relevant when the PUT flag is \
         set)",
    )
}

/// `rdma_pipeline_frag_size`.
pub const fn rdma_pipeline_frag_size(default: u32) -> ParamDef {
    let range = (1, U32_MAX);
    ParamDef::number(
        "rdma_pipeline_frag_size",
        ParamKind::Size,
        default as i64,
        range,
    )
    .doc(
        4,
        "a size in bytes between 1 and 4294967295 (k, M, G suffixes allowed)",
        "Maximum size (in bytes) of a single \"phase 3\" fragment from a long message when using \
         the pipeline protocol.  These fragments will be sent using RDMA semantics (must be >= \
         1; only relevant when the PUT flag is set)",
    )
}

/// `min_rdma_pipeline_size` (raised by [`adjust`]).
pub const fn min_rdma_pipeline_size(default: u32) -> ParamDef {
    let range = (0, U32_MAX);
    ParamDef::number(
        "min_rdma_pipeline_size",
        ParamKind::Size,
        default as i64,
        range,
    )
    .doc(
        4,
        ACCEPTS_SIZE,
        "Messages smaller than this size (in bytes) will not use the RDMA pipeline protocol.  \
         Instead, they will be split into fragments of max_send_size and sent using send/receive \
         semantics (must be >=0, and is automatically adjusted up to at least \
         (eager_limit+btl_rdma_pipeline_send_length); only relevant when the PUT flag is set)",
    )
}

/// `latency`.
pub const fn latency(default: u32) -> ParamDef {
    ParamDef::number("latency", ParamKind::UInt, default as i64, (0, U32_MAX)).doc(
        5,
        ACCEPTS_U32,
        "Approximate latency of interconnect (0 = auto-detect value at run-time [not supported \
         in all BTL modules], >= 1 = latency in microseconds)",
    )
}

/// `bandwidth`.
pub const fn bandwidth(default: u32) -> ParamDef {
    ParamDef::number("bandwidth", ParamKind::UInt, default as i64, (0, U32_MAX)).doc(
        5,
        ACCEPTS_U32,
        "Approximate maximum bandwidth of interconnect (0 = auto-detect value at run-time [not \
         supported in all BTL modules], >= 1 = bandwidth in Mbps)",
    )
}

/// Where a component keeps the parameters the base rules read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseKeys<K> {
    /// `flags`.
    pub flags: K,
    /// `eager_limit`.
    pub eager_limit: K,
    /// `max_send_size`.
    pub max_send_size: K,
    /// `rndv_eager_limit`.
    pub rndv_eager_limit: K,
    /// `rdma_pipeline_send_length`.
    pub rdma_pipeline_send_length: K,
    /// `min_rdma_pipeline_size`.
    pub min_rdma_pipeline_size: K,
    /// `free_list_num` and `free_list_max`, if the component has free
    /// lists.
    pub free_lists: Option<(K, K)>,
}

fn number<P: Params>(p: &P, key: P::Key) -> Result<i64, ParamError> {
    match p.value(key) {
        Value::Int(v) => Ok(v),
        Value::Text(_) => Err(key.def().malformed()),
    }
}

fn conflict<K: ParamKey>(name: K, other: K, rule: &'static str) -> ParamError {
    let (name, other) = (name.def(), other.def());
    ParamError::Conflict {
        component: name.component,
        name: name.name,
        other: other.name,
        rule,
    }
}

/// The base verify errors: `flags` without [`FLAG_SEND`]; `max_send_size`
/// < `eager_limit`; `free_list_max` neither -1 nor >= `free_list_num`.
pub fn check<P: Params>(p: &P, keys: &BaseKeys<P::Key>) -> Result<(), ParamError> {
    let flags = number(p, keys.flags)?;
    if flags & i64::from(FLAG_SEND) == 0 {
        return Err(keys.flags.def().out_of_range(flags));
    }
    if number(p, keys.max_send_size)? < number(p, keys.eager_limit)? {
        return Err(conflict(
            keys.max_send_size,
            keys.eager_limit,
            "max_send_size must be >= eager_limit",
        ));
    }
    if let Some((num, max)) = keys.free_lists {
        let max_v = number(p, max)?;
        if max_v != -1 && max_v < number(p, num)? {
            return Err(conflict(
                max,
                num,
                "free_list_max must be -1 (unlimited) or >= free_list_num",
            ));
        }
    }
    Ok(())
}

/// The base verify adjustments: `rndv_eager_limit` clamped to
/// `eager_limit` (the first fragment of a large message is an eager
/// fragment); `min_rdma_pipeline_size` raised to at least `eager_limit` +
/// `rdma_pipeline_send_length` (saturating at `u32::MAX`).
pub fn adjust<P: Params>(
    p: &mut P,
    out: &mut Verified<P::Key>,
    keys: &BaseKeys<P::Key>,
) -> Result<(), ParamError> {
    let eager = number(p, keys.eager_limit)?;
    if number(p, keys.rndv_eager_limit)? > eager {
        p.adjust(
            out,
            keys.rndv_eager_limit,
            eager,
            "clamped to eager_limit",
            &[keys.eager_limit],
        )?;
    }
    let floor = eager
        .saturating_add(number(p, keys.rdma_pipeline_send_length)?)
        .min(U32_MAX);
    if number(p, keys.min_rdma_pipeline_size)? < floor {
        p.adjust(
            out,
            keys.min_rdma_pipeline_size,
            floor,
            "raised to eager_limit + rdma_pipeline_send_length",
            &[keys.eager_limit, keys.rdma_pipeline_send_length],
        )?;
    }
    Ok(())
}
