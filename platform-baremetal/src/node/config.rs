//! How a node runs ([`Config`]) and how much memory its buffers take
//! ([`Sizes`]): plain values, checked by [`super::Node::new`].

use btl_core::tcp::endpoint::DEFAULT_HANDSHAKE_TIMEOUT_MS;
use btl_core::tcp::wire::job_hash;

/// Buffer sizes, in bytes. See [`Sizes::memory_size`] for the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Sizes {
    /// Receive buffer of each socket (the TCP window it advertises, up to
    /// 64 KiB without window scaling).
    pub rx: usize,
    /// Transmit buffer of each socket (at least 64).
    pub tx: usize,
    /// Decoder read-ahead buffer of each socket (the seed's
    /// `endpoint_cache`; at least 64).
    pub read_ahead: usize,
    /// Message buffer of each peer: the largest frame payload and the
    /// largest (chunked) message this node accepts from it.
    pub message: usize,
    /// Outgoing queue of each peer: the largest message this node can send
    /// (headers included); at least `max_frame + 16`, to hold a get reply.
    pub queue: usize,
}

impl Sizes {
    /// A small profile for microcontrollers: 4 KiB socket buffers, 1 KiB
    /// read-ahead, 4 KiB messages, 8 KiB queues.
    pub const SMALL: Sizes = Sizes {
        rx: 4096,
        tx: 4096,
        read_ahead: 1024,
        message: 4096,
        queue: 8192,
    };

    /// Bytes of memory [`Node::new`](super::Node::new) needs for `sockets` sockets and
    /// `peers` peers (besides the `Node` value itself and smoltcp's
    /// `SocketStorage` array).
    pub const fn memory_size(&self, sockets: usize, peers: usize) -> usize {
        sockets * (self.rx + self.tx + self.read_ahead) + peers * (self.message + self.queue)
    }
}

/// How a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// The job's hash ([`job_hash`] of the job id every rank was given).
    pub job: u64,
    /// This node's rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// The port this node listens on.
    pub port: u16,
    /// Sockets kept listening (peers that can connect at the same moment).
    pub listen_sockets: usize,
    /// A connect or handshake taking longer fails the peer.
    pub handshake_timeout_ms: u64,
    /// smoltcp keep-alive interval (probes an idle connection).
    pub keep_alive_ms: Option<u64>,
    /// smoltcp socket timeout: a connection whose peer sends nothing for
    /// this long while data or a keep-alive is outstanding is reset, and
    /// the peer reported failed.
    pub timeout_ms: Option<u64>,
    /// Nagle's algorithm (off by default, as the seed's `use_nagle`).
    pub use_nagle: bool,
    /// smoltcp's delayed-ACK time (`None`: acknowledge at once).
    pub ack_delay_ms: Option<u64>,
    /// Largest frame payload this node sends and accepts (capped by
    /// [`Sizes::message`]); every rank of the job should use the same.
    pub max_frame: u32,
    /// Buffer sizes.
    pub sizes: Sizes,
}

impl Config {
    /// A node of rank `rank` in a job of `size` ranks whose id is `job_id`
    /// (hashed as every rank does), listening on `port`, with
    /// [`Sizes::SMALL`], 2 listening sockets, the core's default handshake
    /// timeout (10 s), keep-alive every 2 s, a 10 s socket timeout, no
    /// Nagle and no delayed ACK.
    pub const fn new(job_id: &[u8], rank: u32, size: u32, port: u16) -> Self {
        Self {
            job: job_hash(job_id),
            rank,
            size,
            port,
            listen_sockets: 2,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            keep_alive_ms: Some(2_000),
            timeout_ms: Some(10_000),
            use_nagle: false,
            ack_delay_ms: None,
            max_frame: Sizes::SMALL.message as u32,
            sizes: Sizes::SMALL,
        }
    }

    /// Takes `use_nagle`, `handshake_timeout` and `max_frame` from the
    /// `tcp` component's verified parameters, and dead-link detection as
    /// Linux ranks have it: keep-alive every `keepalive_intvl` seconds
    /// (none with `keepalive_time` 0) and `user_timeout` as the socket
    /// timeout (a peer that sends nothing that long fails; 0 keeps the
    /// default). The read-ahead buffer size, `endpoint_cache`, is a memory
    /// decision: set [`Sizes::read_ahead`].
    pub fn apply_params(&mut self, params: &btl_core::tcp::params::TcpParams) {
        self.use_nagle = params.use_nagle;
        self.handshake_timeout_ms = u64::from(params.handshake_timeout);
        self.max_frame = params.max_frame();
        self.keep_alive_ms =
            (params.keepalive_time > 0).then(|| u64::from(params.keepalive_intvl.max(1)) * 1000);
        if params.user_timeout > 0 {
            self.timeout_ms = Some(u64::from(params.user_timeout));
        }
    }

    pub(super) fn max_frame(&self) -> u32 {
        let m = u32::try_from(self.sizes.message).unwrap_or(u32::MAX);
        self.max_frame.min(m)
    }
}
