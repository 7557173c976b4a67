//! The `sm` component's parameters: the seed's names, defaults, help texts
//! and validation rules, as a table and rules over the shared registry
//! ([`crate::params`]).
//!
//! - [`SM_PARAMS`] is the static table of definitions (name, kind, default,
//!   accepted range, help text, Open MPI info level), indexed by [`ParamId`]
//!   and named by [`SM`].
//! - [`SmParams`] holds one typed field per parameter plus where each value
//!   came from ([`crate::params::ParamSource`]). Values are set from code
//!   (assign a field, or [`Params::set`]) or from the environment
//!   ([`Params::set_from_env_var`], which understands both
//!   `BTL_SM_FIFO_SIZE` and Open MPI's `OMPI_MCA_btl_sm_fifo_size`).
//! - [`Params::verify`] applies the seed's register/verify/open rules and
//!   Open MPI's base BTL parameter checks: it either fails without touching
//!   anything, or adjusts (rounds, clamps) and returns the list of
//!   adjustments it made ([`Verified`]).
//! - [`Params::iter`] lists every parameter with its value, default and
//!   source, for `btl info`.
//!
//! Every error ([`ParamError`]) names the parameter as the user types it in
//! the environment (`BTL_SM_FIFO_SIZE`) and says what it accepts. The
//! segment's size in processes (the seed's `calc_sm_max_procs`) is
//! [`crate::sm::layout::calc_sm_max_procs`]; the ring a sender writes to is
//! [`crate::sm::fifo::fifo_map`].

use crate::params::base::{
    self, BaseKeys, ACCEPTS_BOOL, ACCEPTS_SIZE, ACCEPTS_U32, FLAG_GET, FLAG_PUT, FLAG_SEND,
};
use crate::params::{
    table, Assign, Component, ParamDef, ParamError, ParamKey, ParamKind, ParamState, Params, Value,
    Verified,
};
use crate::sm::fbox::{Fbox, DEFAULT_SIZE as FBOX_DEFAULT_SIZE, MAX_SIZE as FBOX_MAX_SIZE};

/// Name of the component, the middle part of `BTL_SM_FIFO_SIZE`.
pub const COMPONENT: &str = "sm";

/// Smallest accepted `eager_limit`: an eager fragment must carry a fragment
/// header and still have room for payload.
pub const MIN_EAGER_LIMIT: u32 = 64;

/// Largest accepted `fbox_max` (boxes a rank hands out): one per other
/// rank of the largest node the engine addresses.
pub const MAX_FBOX_MAX: u32 = 1024;

/// Largest accepted `poll_pause` (spin-wait hints after an empty pass):
/// tens of microseconds at most (10 µs here), so an idle pass never
/// becomes a wait.
pub const MAX_POLL_PAUSE: u32 = 1024;

/// Largest accepted `fifo_size` (slots per ring), as the seed's
/// `sm_fifo_init` allows.
pub const MAX_FIFO_SIZE: u32 = 1 << 30;

/// Number of parameters of the `sm` component (the length of [`SM_PARAMS`]).
pub const SM_PARAM_COUNT: usize = 28;

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
    /// `cma_split_min` (btl's)
    CmaSplitMin,
    /// `cma_measure` (btl's)
    CmaMeasure,
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
    /// `fbox_size` (btl's, after vader's)
    FboxSize,
    /// `fbox_threshold` (btl's, after vader's)
    FboxThreshold,
    /// `fbox_max` (btl's, after vader's)
    FboxMax,
    /// `poll_pause` (btl's)
    PollPause,
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
        ParamId::CmaSplitMin,
        ParamId::CmaMeasure,
        ParamId::FreeListNum,
        ParamId::FreeListMax,
        ParamId::FreeListInc,
        ParamId::MaxProcs,
        ParamId::FifoSize,
        ParamId::NumFifos,
        ParamId::FifoLazyFree,
        ParamId::SmExtraProcs,
        ParamId::FboxSize,
        ParamId::FboxThreshold,
        ParamId::FboxMax,
        ParamId::PollPause,
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
}

impl ParamKey for ParamId {
    const ALL: &'static [ParamId] = &ParamId::ALL;

    fn component() -> &'static Component {
        &SM
    }

    /// Index into [`SM_PARAMS`].
    fn index(self) -> usize {
        self as usize
    }

    fn def(self) -> &'static ParamDef {
        &SM_PARAMS[self as usize]
    }
}

const I32_MIN: i64 = i32::MIN as i64;
const I32_MAX: i64 = i32::MAX as i64;
const U32_MAX: i64 = u32::MAX as i64;

/// The `sm` component's parameters, in the seed's registration order
/// (component parameters, then the BTL base parameters), indexed by
/// [`ParamId`].
pub static SM_PARAMS: [ParamDef; SM_PARAM_COUNT] = table(
    COMPONENT,
    [
        ParamDef::number("use_knem", ParamKind::Int, 0, (I32_MIN, I32_MAX)).doc(
            9,
            "0 (knem is not available in this build; a negative value means 0)",
            "Whether knem support is desired or not (negative = try to enable knem support, but \
             continue even if it is not available, 0 = do not enable knem support, positive = try \
             to enable knem support and fail if it is not available). This build has no knem \
             support: the default is 0, a negative value is treated as 0 and a positive value is \
             an error.",
        ),
        ParamDef::number("knem_dma_min", ParamKind::Size, 0, (0, U32_MAX)).doc(
            9,
            ACCEPTS_SIZE,
            "Minimum message size (in bytes) to use the knem DMA mode; ignored if knem does not \
             support DMA mode (0 = do not use the knem DMA mode)",
        ),
        ParamDef::number("knem_max_simultaneous", ParamKind::UInt, 0, (0, U32_MAX)).doc(
            9,
            ACCEPTS_U32,
            "Max number of simultaneous ongoing knem operations to support (0 = do everything \
             synchronously, which probably gives the best large message latency; >0 means to do \
             all operations asynchronously, which supports better overlap for simultaneous large \
             message sends)",
        ),
        ParamDef::number("use_cma", ParamKind::Bool, 1, (0, 1)).doc(
            9,
            ACCEPTS_BOOL,
            "Whether or not to enable CMA (btl: on by default, unlike the seed's 0, which \
             reflected an optional build feature; btl always has CMA, probes it against every \
             peer at start and falls back to the pipelined copy where the kernel refuses it)",
        ),
        ParamDef::number("cma_split_min", ParamKind::Size, 131072, (0, U32_MAX)).doc(
            5,
            "0 (never) or a size in bytes (k, M, G suffixes allowed)",
            "Smallest single-copy get or large message that the two processes copy together, \
             so two cores copy at once instead of one: for a get, the target writes the \
             second half into the requester's memory (process_vm_writev, only as the \
             requester asks and before a deadline) while the requester reads the first \
             (process_vm_readv); for a message, the sender writes its second half into a \
             landing buffer the receiver mapped for it while the receiver reads the first. \
             0 turns splitting off; it is off on an oversubscribed node (more ranks than \
             cores), where the two copies would take turns.",
        ),
        ParamDef::number("cma_measure", ParamKind::Bool, 1, (0, 1)).doc(
            5,
            ACCEPTS_BOOL,
            "Whether large gets and large messages that are not split (from \
             min_rdma_pipeline_size on: messages below cma_split_min or without the receiver's \
             landing buffer, gets of any size) go by whichever of single copy and the pipelined \
             copy through shared fragments measures faster to each peer, re-measured about once \
             a second (1), or by single copy whenever the kernel allows it (0; use_cma=0 forces \
             the pipelined copy). Which one is faster depends on where the two processes run \
             (the pipelined copy wins while they share a cache, single copy when they do not) \
             and, for gets, on the alignment of the two buffers. Split messages always go \
             split.",
        ),
        base::free_list_num("Number of max-size fragments each process allocates up front."),
        base::free_list_max(),
        base::free_list_inc(64),
        ParamDef::number("max_procs", ParamKind::Int, -1, (-1, I32_MAX))
            .except(0)
            .doc(
                5,
                "-1 (automatic) or an integer >= the number of processes on the node",
                "Maximum number of processes on the node the shared segment is sized for (-1 = \
                 the local processes plus sm_extra_procs).",
            ),
        ParamDef::number(
            "fifo_size",
            ParamKind::UInt,
            4096,
            (2, MAX_FIFO_SIZE as i64),
        )
        .doc(
            4,
            "an integer between 2 and 2^30 (rounded up to a power of two)",
            "Number of slots in each receive ring (rounded up to a power of two).",
        ),
        ParamDef::number("num_fifos", ParamKind::Int, 1, (1, 1 << 30)).doc(
            4,
            "an integer between 1 and 2^30 (rounded up to a power of two)",
            "Number of receive rings per process; senders are spread over them (rounded up to a \
             power of two).",
        ),
        ParamDef::number("fifo_lazy_free", ParamKind::UInt, 120, (0, U32_MAX)).doc(
            5,
            "an integer >= 0 (clamped to between 1 and fifo_size/2)",
            "Number of slots a receiver reads before returning them to the writers (clamped to \
             between 1 and fifo_size/2).",
        ),
        ParamDef::number("sm_extra_procs", ParamKind::Int, 0, (I32_MIN, I32_MAX)).doc(
            9,
            "an integer (negative = as many extra processes as local ones)",
            "Number of extra processes to size the shared segment for when max_procs is -1 \
             (negative = as many as there are local processes).",
        ),
        ParamDef::number(
            "fbox_size",
            ParamKind::Size,
            FBOX_DEFAULT_SIZE as i64,
            (0, FBOX_MAX_SIZE as i64),
        )
        .doc(
            4,
            "0 (no fast boxes) or a power of two between 64 and 65536 (k suffix allowed)",
            "Bytes of each fast box: a mailbox per sender in each receiver's part of the segment, \
             for messages up to a quarter of it (minus 8 bytes of header) that travel without a \
             ring slot, a fragment or an acknowledgement (vader's fbox_size; 4096: messages up \
             to 1016 bytes). A receiver hands a box to a sender after fbox_threshold small \
             messages from it, at most fbox_max boxes in all; 0 sends everything through the \
             rings.",
        ),
        ParamDef::number("fbox_threshold", ParamKind::UInt, 16, (1, U32_MAX)).doc(
            5,
            "an integer >= 1",
            "Number of small messages (ones a fast box would take) a rank receives from a peer \
             through its ring before it hands that peer a fast box (vader's fbox_threshold): \
             boxes go only to the peers that actually send small messages, and memory is not \
             spent on the others.",
        ),
        ParamDef::number("fbox_max", ParamKind::UInt, 32, (0, MAX_FBOX_MAX as i64)).doc(
            5,
            "an integer between 0 and 1024",
            "Most fast boxes a rank hands out (one per sender; vader's fbox_max): each takes \
             fbox_size + 128 bytes of shared memory once handed out, nothing before; senders \
             beyond it use the rings. 0: no fast boxes.",
        ),
        ParamDef::number("poll_pause", ParamKind::UInt, 2, (0, MAX_POLL_PAUSE as i64)).doc(
            5,
            "an integer between 0 and 1024",
            "Spin-wait hints (x86's PAUSE, Arm's ISB or YIELD) a rank executes at the end of a \
             progress pass that found nothing to do, before it polls again; 0: poll again at \
             once (the spin-wait idiom: polls of an unchanged box no longer run ahead \
             speculatively, to be thrown away when the peer's message lands, nor keep pulling \
             the cache line the writer is filling). On the README's host (one hint ~10 ns) 2 \
             made the 8-byte latency 5-10 % lower under Open MPI when the machine was quiet, \
             and 0-4 % through the C ABI and btl bench; where one hint takes much longer, 1 \
             may do better.",
        ),
        base::exclusivity(65535),
        base::flags(
            FLAG_SEND | FLAG_GET,
            "a bit mask that includes 1 (send); 2 (put) is not supported, 4 (get) follows use_cma",
        ),
        base::rndv_eager_limit(4096),
        base::eager_limit(
            4096,
            MIN_EAGER_LIMIT,
            "a size in bytes between 64 and 4294967295 (k, M, G suffixes allowed)",
        ),
        base::max_send_size(
            65536,
            u32::MAX,
            "a size in bytes >= eager_limit (k, M, G suffixes allowed)",
        ),
        base::rdma_pipeline_send_length(65536),
        base::rdma_pipeline_frag_size(65536),
        base::min_rdma_pipeline_size(65536),
        base::latency(1),
        base::bandwidth(9000),
    ],
);

/// The `sm` component: its name and [`SM_PARAMS`].
pub static SM: Component = Component {
    name: COMPONENT,
    params: &SM_PARAMS,
};

/// Where `sm` keeps the parameters of Open MPI's base rules.
const BASE: BaseKeys<ParamId> = BaseKeys {
    flags: ParamId::Flags,
    eager_limit: ParamId::EagerLimit,
    max_send_size: ParamId::MaxSendSize,
    rndv_eager_limit: ParamId::RndvEagerLimit,
    rdma_pipeline_send_length: ParamId::RdmaPipelineSendLength,
    min_rdma_pipeline_size: ParamId::MinRdmaPipelineSize,
    free_lists: Some((ParamId::FreeListNum, ParamId::FreeListMax)),
};

/// The `sm` component's parameter values, with the seed's types and
/// defaults, and where each value came from.
///
/// Fields may be assigned directly from code; call [`Params::verify`]
/// afterwards. A field that differs from its default while its recorded
/// source is [`ParamSource::Default`] is reported as set by
/// [`ParamSource::Code`].
///
/// [`ParamSource::Default`]: crate::params::ParamSource::Default
/// [`ParamSource::Code`]: crate::params::ParamSource::Code
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
    /// Smallest single-copy get split between requester and target (0:
    /// never).
    pub cma_split_min: u32,
    /// Whether large transfers choose their mechanism by measurement
    /// (else single copy whenever allowed).
    pub cma_measure: bool,
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
    /// Bytes of each fast box (0: no fast boxes).
    pub fbox_size: u32,
    /// Small messages received from a peer by ring before it gets a box.
    pub fbox_threshold: u32,
    /// Most boxes a rank hands out.
    pub fbox_max: u32,
    /// Spin-wait hints at the end of a progress pass that found nothing.
    pub poll_pause: u32,
    /// BTL exclusivity.
    pub exclusivity: u32,
    /// BTL flags ([`FLAG_SEND`], [`FLAG_PUT`], [`FLAG_GET`]); `sm` has no
    /// put, so [`Params::verify`] clears [`FLAG_PUT`], and sets
    /// [`FLAG_GET`] exactly when single copy (`use_cma`) is enabled.
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
    state: ParamState,
}

impl Default for SmParams {
    fn default() -> Self {
        Self::new()
    }
}

impl SmParams {
    /// Defaults with rings of `fifo_size` slots (lazy free every quarter
    /// ring, at least every slot) and small fragments (64-byte eager ones and first fragments,
    /// 256-byte max-size ones; 2 to start with, 4 more at a time): a job
    /// that reaches full rings and empty pools in few messages, for the
    /// engine's tests, fuzz targets and loom models.
    #[doc(hidden)]
    pub fn small_for_tests(fifo_size: u32) -> Self {
        let mut p = Self::new();
        p.fifo_size = fifo_size;
        p.fifo_lazy_free = (fifo_size / 4).max(1);
        p.eager_limit = 64;
        p.rndv_eager_limit = 64;
        p.max_send_size = 256;
        p.free_list_num = 2;
        p.free_list_inc = 4;
        p
    }

    /// The seed's defaults, all with source
    /// [`ParamSource::Default`](crate::params::ParamSource::Default).
    pub const fn new() -> Self {
        SmParams {
            use_knem: 0,
            knem_dma_min: 0,
            knem_max_simultaneous: 0,
            use_cma: true,
            cma_split_min: 128 * 1024,
            cma_measure: true,
            free_list_num: 8,
            free_list_max: -1,
            free_list_inc: 64,
            max_procs: -1,
            fifo_size: 4096,
            num_fifos: 1,
            fifo_lazy_free: 120,
            sm_extra_procs: 0,
            fbox_size: FBOX_DEFAULT_SIZE,
            fbox_threshold: 16,
            fbox_max: 32,
            poll_pause: 2,
            exclusivity: 65535,
            flags: FLAG_SEND | FLAG_GET,
            rndv_eager_limit: 4096,
            eager_limit: 4096,
            // 64 KiB, where vader and the seed have 32: a message of
            // 32–64 KiB then travels in one fragment. In two, its copies
            // ran at ~10 GB/s against 45 (the sender's copy of the second
            // overlapping the receiver's of the first; README, "Messages
            // and the two bulk protocols"): `btl bench` 40–64 KiB took 5–9
            // µs (19–35 with the vCPUs on two CCXs) against 1.3–2.3 in one
            // fragment.
            max_send_size: 64 * 1024,
            rdma_pipeline_send_length: 64 * 1024,
            rdma_pipeline_frag_size: 64 * 1024,
            min_rdma_pipeline_size: 64 * 1024,
            latency: 1,
            bandwidth: 9000,
            state: ParamState::new(),
        }
    }

    /// The current value of `id` as an `i64` (booleans as 0/1).
    pub fn get(&self, id: ParamId) -> i64 {
        match id {
            ParamId::UseKnem => i64::from(self.use_knem),
            ParamId::KnemDmaMin => i64::from(self.knem_dma_min),
            ParamId::KnemMaxSimultaneous => i64::from(self.knem_max_simultaneous),
            ParamId::UseCma => i64::from(self.use_cma),
            ParamId::CmaSplitMin => i64::from(self.cma_split_min),
            ParamId::CmaMeasure => i64::from(self.cma_measure),
            ParamId::FreeListNum => i64::from(self.free_list_num),
            ParamId::FreeListMax => i64::from(self.free_list_max),
            ParamId::FreeListInc => i64::from(self.free_list_inc),
            ParamId::MaxProcs => i64::from(self.max_procs),
            ParamId::FifoSize => i64::from(self.fifo_size),
            ParamId::NumFifos => i64::from(self.num_fifos),
            ParamId::FifoLazyFree => i64::from(self.fifo_lazy_free),
            ParamId::SmExtraProcs => i64::from(self.sm_extra_procs),
            ParamId::FboxSize => i64::from(self.fbox_size),
            ParamId::FboxThreshold => i64::from(self.fbox_threshold),
            ParamId::FboxMax => i64::from(self.fbox_max),
            ParamId::PollPause => i64::from(self.poll_pause),
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

/// The registry's view of [`SmParams`], and the seed's verify and open
/// rules.
///
/// [`Params::verify`] errors (nothing is changed then): a value outside its
/// own range; `use_knem` > 0 (knem is not available in this build); `flags`
/// without [`FLAG_SEND`]; `max_send_size` < `eager_limit`; `free_list_max`
/// not -1 and < `free_list_num`; `fbox_size` neither 0 nor a box size
/// ([`Fbox::check_size`]: a power of two from 64 to 65536).
///
/// Adjustments (each logged, recorded in the result and in
/// [`crate::params::ParamInfo::adjusted`]): negative `use_knem` → 0;
/// `use_cma` off if knem is on; [`FLAG_PUT`] cleared, [`FLAG_GET`] set
/// exactly when `use_cma`; `num_fifos` and `fifo_size` rounded up to powers
/// of two; `fifo_lazy_free` clamped to [1, `fifo_size`/2] (of the rounded
/// ring size); `rndv_eager_limit` clamped to `eager_limit`;
/// `min_rdma_pipeline_size` raised to at least `eager_limit` +
/// `rdma_pipeline_send_length` (saturating at `u32::MAX`).
///
/// Verify is idempotent: a second call adjusts nothing.
impl Params for SmParams {
    type Key = ParamId;

    fn value(&self, id: ParamId) -> Value<'_> {
        Value::Int(self.get(id))
    }

    fn store(&mut self, id: ParamId, v: Assign<'_>) -> Result<(), ParamError> {
        match id {
            ParamId::UseKnem => self.use_knem = v.to_i32()?,
            ParamId::KnemDmaMin => self.knem_dma_min = v.to_u32()?,
            ParamId::KnemMaxSimultaneous => self.knem_max_simultaneous = v.to_u32()?,
            ParamId::UseCma => self.use_cma = v.to_bool()?,
            ParamId::CmaSplitMin => self.cma_split_min = v.to_u32()?,
            ParamId::CmaMeasure => self.cma_measure = v.to_bool()?,
            ParamId::FreeListNum => self.free_list_num = v.to_i32()?,
            ParamId::FreeListMax => self.free_list_max = v.to_i32()?,
            ParamId::FreeListInc => self.free_list_inc = v.to_i32()?,
            ParamId::MaxProcs => self.max_procs = v.to_i32()?,
            ParamId::FifoSize => self.fifo_size = v.to_u32()?,
            ParamId::NumFifos => self.num_fifos = v.to_i32()?,
            ParamId::FifoLazyFree => self.fifo_lazy_free = v.to_u32()?,
            ParamId::SmExtraProcs => self.sm_extra_procs = v.to_i32()?,
            ParamId::FboxSize => self.fbox_size = v.to_u32()?,
            ParamId::FboxThreshold => self.fbox_threshold = v.to_u32()?,
            ParamId::FboxMax => self.fbox_max = v.to_u32()?,
            ParamId::PollPause => self.poll_pause = v.to_u32()?,
            ParamId::Exclusivity => self.exclusivity = v.to_u32()?,
            ParamId::Flags => self.flags = v.to_u32()?,
            ParamId::RndvEagerLimit => self.rndv_eager_limit = v.to_u32()?,
            ParamId::EagerLimit => self.eager_limit = v.to_u32()?,
            ParamId::MaxSendSize => self.max_send_size = v.to_u32()?,
            ParamId::RdmaPipelineSendLength => self.rdma_pipeline_send_length = v.to_u32()?,
            ParamId::RdmaPipelineFragSize => self.rdma_pipeline_frag_size = v.to_u32()?,
            ParamId::MinRdmaPipelineSize => self.min_rdma_pipeline_size = v.to_u32()?,
            ParamId::Latency => self.latency = v.to_u32()?,
            ParamId::Bandwidth => self.bandwidth = v.to_u32()?,
        }
        Ok(())
    }

    fn state(&self) -> &ParamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut ParamState {
        &mut self.state
    }

    fn check_rules(&self) -> Result<(), ParamError> {
        if self.use_knem > 0 {
            return Err(ParamError::Unsupported {
                component: COMPONENT,
                name: ParamId::UseKnem.def().name,
                value: i64::from(self.use_knem),
                reason: "knem support is not available in this build",
            });
        }
        if self.fbox_size != 0 && Fbox::check_size(self.fbox_size).is_err() {
            let def = ParamId::FboxSize.def();
            return Err(ParamError::OutOfRange {
                component: COMPONENT,
                name: def.name,
                value: i64::from(self.fbox_size),
                accepts: def.accepts,
            });
        }
        base::check(self, &BASE)
    }

    fn apply_rules(&mut self, out: &mut Verified<ParamId>) -> Result<(), ParamError> {
        // Seed: negative use_knem means "use it if available"; it is not.
        if self.use_knem < 0 {
            self.adjust(
                out,
                ParamId::UseKnem,
                0,
                "knem support is not available in this build",
                &[],
            )?;
        }
        // Seed verify: knem wins over CMA (only reachable with knem support).
        if self.use_knem != 0 && self.use_cma {
            self.adjust(
                out,
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
                out,
                ParamId::Flags,
                i64::from(flags),
                "put is not supported; get follows use_cma",
                // Derived from use_cma: worth a warning only if the user set
                // flags themselves.
                &[],
            )?;
        }
        // Seed open: the number of rings is a power of two; seed
        // sm_fifo_init: so is the ring size.
        for id in [ParamId::NumFifos, ParamId::FifoSize] {
            let value = self.get(id);
            let rounded = next_pow2(value);
            if rounded != value {
                self.adjust(out, id, rounded, "rounded up to a power of two", &[])?;
            }
        }
        // Seed open: 1 <= lazy_free <= fifo_size / 2.
        let half = i64::from(self.fifo_size >> 1);
        let lazy = i64::from(self.fifo_lazy_free);
        let clamped = lazy.min(half).max(1);
        if clamped != lazy {
            self.adjust(
                out,
                ParamId::FifoLazyFree,
                clamped,
                "clamped to between 1 and fifo_size/2",
                &[ParamId::FifoSize],
            )?;
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
    use crate::params::{env_name, ParamSource};
    use std::string::ToString;

    #[test]
    fn table_matches_ids_and_defaults() {
        check_table::<SmParams>();
        let p = SmParams::new();
        for (i, id) in ParamId::ALL.into_iter().enumerate() {
            assert_eq!(id.index(), i);
            assert_eq!(Value::Int(p.get(id)), id.def().default);
        }
        assert_eq!(SmParams::default(), p);
        assert_eq!(ParamId::FifoSize.def().default, Value::Int(4096));
        assert_eq!(ParamId::Exclusivity.def().default, Value::Int(65535));
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name("sm", "fifo_size").to_string(), "BTL_SM_FIFO_SIZE");
        let def = ParamId::FifoLazyFree.def();
        assert_eq!(
            def.ompi_env_name().to_string(),
            "OMPI_MCA_btl_sm_fifo_lazy_free"
        );
        let from_env_name = ParamId::from_env_name;
        assert_eq!(
            from_env_name("BTL_SM_FIFO_SIZE").map(|d| d.def().name),
            Some("fifo_size")
        );
        assert_eq!(
            from_env_name("BTL_SM_fifo_Size").map(|d| d.def().name),
            Some("fifo_size")
        );
        assert_eq!(
            from_env_name("OMPI_MCA_btl_sm_num_fifos").map(|d| d.def().name),
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
                component: "sm",
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
        assert_eq!(
            (info.value, info.default),
            (Value::Int(8192), Value::Int(4096))
        );
        assert_eq!(p.iter().count(), SM_PARAM_COUNT);
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
        assert_eq!(v.len(), 1);
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
}
