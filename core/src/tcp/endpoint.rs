//! The per-peer connection state machine and the state machine of an
//! accepted socket that has not identified itself yet. Sans-IO: events in,
//! decisions and [`Action`]s out; no sockets, no clock (time comes in as
//! milliseconds from any monotonic origin the adapter chooses), no bytes
//! (handshakes arrive parsed by [`super::decoder`], and go out as
//! [`HandshakeRepr`]s for the adapter to write).
//!
//! # Connections and their ids
//!
//! The adapter names every socket with a small [`ConnId`] of its choice and
//! passes it in every call, so the endpoint can tell its own outgoing
//! connection from the peer's incoming one and from stale sockets. Any call
//! naming a socket the endpoint no longer cares about (a connection that
//! lost a tie-break, one closed earlier) answers [`Action::Close`] for that
//! socket and changes nothing: the adapter just drops it.
//!
//! # Lifecycle
//!
//! ```text
//! Closed ──send (lazy)──► Connecting ──our socket connected, handshake sent──► ConnectAck
//! ConnectAck ──the peer's handshake (job and rank checked)──► Connected
//! Closed | Connecting | ConnectAck ──incoming handshake accepted──► Connected
//! Connected ──FIN sent or received──► Closed
//! any ──error, timeout, EOF without FIN, wrong identity──► Failed(reason)  (final)
//! ```
//!
//! - Connections open lazily: the first [`Endpoint::on_send_request`] on a
//!   closed endpoint answers [`SendDecision::QueueAndConnect`]. Frames are
//!   queued by the adapter (per peer, in order) until an
//!   [`Action::FlushQueue`] or an [`IncomingDecision::Accept`] names the
//!   connection they may flow on; the core never drops a frame.
//! - **Simultaneous connect**: when both sides connect at once, the
//!   connection started by the lower rank wins. The higher rank accepts the
//!   lower rank's incoming connection and closes its own; the lower rank
//!   refuses the higher rank's incoming connection and keeps its own. Both
//!   end on the same connection. If the higher rank sees its own attempt
//!   closed before the peer's handshake arrives (the lower rank refused it
//!   first), it keeps waiting for the lower rank's connection until its
//!   handshake deadline.
//! - An incoming connection while connected is refused (the established one
//!   is kept).
//! - Clean close: the side that closes sends a FIN frame ([`Action::SendFin`])
//!   and becomes `Closed`; it should stop writing, but keep reading that
//!   socket until EOF (frames the peer sent before it saw the FIN are still
//!   delivered; that EOF is clean). The side that receives the FIN becomes
//!   `Closed` too. A later send reconnects lazily.
//! - **A peer slow to start is waited for**: with
//!   [`Endpoint::with_connect_retry`], a connect that is refused or not
//!   answered within the handshake timeout is retried — after a pause that
//!   doubles from [`RETRY_FIRST_MS`] up to [`RETRY_MAX_MS`], with a jitter
//!   from the two ranks so a job's ranks do not retry in step
//!   ([`Action::Connect`]) — until the retry window has passed since the
//!   first attempt; only then does the peer fail. The wire-up named the
//!   peer, so a refused connect means "not listening yet" (or its SYNs were
//!   dropped in a storm of connects), not "gone". The handshake timeout
//!   bounds one attempt and one handshake, never the peer's start-up.
//! - EOF without a FIN, EOF in the middle of a frame, a socket error, a
//!   malformed stream, a failed or timed-out connect or handshake (past the
//!   retry window, when retries are on), or a
//!   peer answering with the wrong identity make the endpoint `Failed`: the
//!   job reports the peer as failed; there is no silent reconnect.
//!
//! Known limit: a reconnect immediately after a clean close can reach the
//! peer before it has read the FIN on the old connection; the peer then
//! refuses it as [`RejectReason::AlreadyConnected`] and the reconnecting
//! side fails ([`FailReason::HandshakeRefused`], or
//! [`FailReason::HandshakeTimeout`] if it has the higher rank).

use super::wire::{HandshakeRepr, WireError};

/// The default handshake timeout (milliseconds).
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// The first pause before a refused or unanswered connect is retried
/// (milliseconds; see [`Endpoint::with_connect_retry`]).
pub const RETRY_FIRST_MS: u64 = 10;

/// The longest pause between two connect attempts (milliseconds).
pub const RETRY_MAX_MS: u64 = 1_000;

/// A socket, named by the adapter (an index in its socket table, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConnId(pub u32);

/// Why an endpoint failed. Final: the peer is reported as failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FailReason {
    /// Our connect attempt failed (refused, unreachable).
    #[error("connect failed")]
    ConnectFailed,
    /// Our connect attempt did not complete within the handshake timeout.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The handshake did not complete within the handshake timeout.
    #[error("handshake timed out")]
    HandshakeTimeout,
    /// The peer closed our connection without answering our handshake.
    #[error("peer closed the connection without answering the handshake")]
    HandshakeRefused,
    /// The peer answered our handshake as someone else.
    #[error("peer answered as rank {rank} of job {job:#018x}, not the expected process")]
    BadIdentity {
        /// The job hash it sent.
        job: u64,
        /// The rank it sent.
        rank: u32,
    },
    /// The connection ended without a FIN.
    #[error("connection lost in the middle of a frame")]
    ConnectionLost {
        /// The stream ended inside a frame.
        mid_frame: bool,
    },
    /// The socket reported an error.
    #[error("socket error")]
    SocketError,
    /// The peer sent bytes that do not parse.
    #[error("protocol error: {0}")]
    Protocol(WireError),
}

/// Why an incoming connection is refused (a one-line log; the adapter
/// closes the socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RejectReason {
    /// The handshake names another job.
    #[error("handshake from job {found:#018x}, this is job {expected:#018x}")]
    WrongJob {
        /// Our job hash.
        expected: u64,
        /// The job hash received.
        found: u64,
    },
    /// The handshake names a rank outside the job.
    #[error("handshake from rank {rank}, the job has {nprocs} ranks")]
    RankOutOfRange {
        /// The rank received.
        rank: u32,
        /// Ranks in the job.
        nprocs: u32,
    },
    /// The handshake names our own rank.
    #[error("handshake claims our own rank {rank}")]
    OwnRank {
        /// The rank received (ours).
        rank: u32,
    },
    /// The handshake was routed to the endpoint of another peer.
    #[error("handshake from rank {found} given to the endpoint of rank {expected}")]
    WrongPeer {
        /// The endpoint's peer.
        expected: u32,
        /// The rank received.
        found: u32,
    },
    /// Simultaneous connect: the connection started by rank `winner` (the
    /// lower one) is kept.
    #[error("simultaneous connect: keeping the connection started by rank {winner}")]
    TieBreak {
        /// The rank whose connection is kept.
        winner: u32,
    },
    /// A connection with this peer is already established.
    #[error("already connected to this peer")]
    AlreadyConnected,
    /// The peer has been declared failed.
    #[error("peer already failed: {0}")]
    PeerFailed(FailReason),
    /// The peer did not identify itself within the handshake timeout.
    #[error("no handshake within the timeout")]
    HandshakeTimeout,
}

/// The state of an [`Endpoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum EndpointState {
    /// No connection (never opened, or closed cleanly).
    Closed,
    /// We started a connect and wait for the socket to connect (or, after
    /// losing a tie-break, for the peer's connection).
    Connecting,
    /// Our socket is connected and our handshake sent; waiting for the
    /// peer's.
    ConnectAck,
    /// A connection is established; frames flow.
    Connected,
    /// Final: the peer is reported as failed.
    Failed(FailReason),
}

/// Who closed the last connection cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CloseCause {
    /// We sent the FIN ([`Endpoint::close`]).
    Local,
    /// The peer sent the FIN.
    Peer,
}

/// What to do with a frame the user wants to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SendDecision {
    /// Write it on `conn` now (behind anything already queued for it).
    SendNow {
        /// The established connection.
        conn: ConnId,
    },
    /// Queue it; a connection is being set up.
    Queue,
    /// Queue it and start connecting to the peer (then report
    /// [`Endpoint::on_connected`] or [`Endpoint::on_connect_failed`]).
    QueueAndConnect,
    /// The peer failed: complete the frame with an error.
    Refuse(FailReason),
}

/// What the adapter must do after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Action {
    /// Nothing.
    None,
    /// Write our handshake `repr` on `conn` (our outgoing connection), then
    /// read the peer's handshake from it.
    SendHandshake {
        /// Our outgoing connection.
        conn: ConnId,
        /// Our handshake.
        repr: HandshakeRepr,
    },
    /// The connection `conn` is established: write the queued frames on
    /// it, in order; later frames are [`SendDecision::SendNow`].
    FlushQueue {
        /// The established connection.
        conn: ConnId,
    },
    /// Write a FIN frame on `conn` after what is already being written,
    /// shut down its write side and keep reading it until EOF.
    SendFin {
        /// The connection being closed.
        conn: ConnId,
    },
    /// Drop the socket `conn` (after finishing any write in progress).
    Close {
        /// The socket to drop.
        conn: ConnId,
    },
    /// Start a new outgoing connection to the peer (a retry), first
    /// dropping any outgoing socket of the previous attempt that is still
    /// connecting; then report [`Endpoint::on_connected`] or
    /// [`Endpoint::on_connect_failed`] as for the first.
    Connect,
    /// The endpoint failed: drop `close` if any, complete every queued
    /// frame with an error and report the peer as failed.
    Fail {
        /// The socket to drop.
        close: Option<ConnId>,
        /// Why.
        reason: FailReason,
    },
}

/// The answer to an incoming connection's handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IncomingDecision {
    /// Keep `conn`: write `reply` (our handshake) on it, drop `close_ours`
    /// if any (our own attempt, which lost the tie-break), then flush the
    /// queue on `conn` (it is now the established connection, as for
    /// [`Action::FlushQueue`]).
    Accept {
        /// The incoming connection, now established.
        conn: ConnId,
        /// Our handshake, to write first.
        reply: HandshakeRepr,
        /// Our own outgoing connection, to drop.
        close_ours: Option<ConnId>,
    },
    /// Drop `conn`; the endpoint is unchanged (our attempt, if any, goes on).
    Refuse {
        /// The incoming connection to drop.
        conn: ConnId,
        /// Why (for a one-line log).
        reason: RejectReason,
    },
}

impl IncomingDecision {
    /// The connection queued frames may now flow on, if any.
    pub const fn flush_queue(&self) -> Option<ConnId> {
        match *self {
            Self::Accept { conn, .. } => Some(conn),
            Self::Refuse { .. } => None,
        }
    }
}

/// Our own outgoing attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attempt {
    /// None (or abandoned after losing a tie-break).
    None,
    /// The connect is in flight; the socket's id is learnt when it
    /// connects.
    InFlight,
    /// Connected, our handshake sent on this socket.
    HandshakeSent(ConnId),
    /// The last connect was refused or not answered: the next one starts
    /// at the deadline.
    Backoff,
}

/// What a socket is to this endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Our outgoing connection, handshake sent, no answer yet.
    Ours,
    /// The established connection.
    Established,
    /// A connection we sent a FIN on, read until EOF.
    Draining,
    /// Anything else: stale.
    Stale,
}

/// The connection state machine for one peer.
#[derive(Clone, Debug)]
pub struct Endpoint {
    me: u32,
    peer: u32,
    job: u64,
    handshake_timeout_ms: u64,
    state: EndpointState,
    attempt: Attempt,
    conn: Option<ConnId>,
    draining: Option<ConnId>,
    deadline_ms: u64,
    last_close: Option<CloseCause>,
    retry_for_ms: u64,
    retry_until_ms: u64,
    retries: u32,
}

impl Endpoint {
    /// The endpoint of `peer`, seen from rank `me` of the job whose hash is
    /// `job` ([`super::wire::job_hash`]). A connect or a handshake taking
    /// longer than `handshake_timeout_ms` fails the peer
    /// ([`DEFAULT_HANDSHAKE_TIMEOUT_MS`] is a sensible value).
    pub const fn new(me: u32, peer: u32, job: u64, handshake_timeout_ms: u64) -> Self {
        Self {
            me,
            peer,
            job,
            handshake_timeout_ms,
            state: EndpointState::Closed,
            attempt: Attempt::None,
            conn: None,
            draining: None,
            deadline_ms: 0,
            last_close: None,
            retry_for_ms: 0,
            retry_until_ms: 0,
            retries: 0,
        }
    }

    /// The same endpoint, retrying a refused or unanswered connect for up
    /// to `retry_for_ms` after the first attempt starts (0: no retry, a
    /// failed connect fails the peer at once). Adapters pass the job's
    /// timeout: a peer the wire-up named is given as long to start as any
    /// other wait of the job.
    #[must_use]
    pub const fn with_connect_retry(mut self, retry_for_ms: u64) -> Self {
        self.retry_for_ms = retry_for_ms;
        self
    }

    /// Sets the retry window of [`Self::with_connect_retry`] in place (it
    /// applies from the next connection set-up on).
    pub fn set_connect_retry(&mut self, retry_for_ms: u64) {
        self.retry_for_ms = retry_for_ms;
    }

    /// Connect attempts retried so far in the current connection set-up.
    pub const fn connect_retries(&self) -> u32 {
        self.retries
    }

    /// The pause before retry number `n` (0-based): doubling from
    /// [`RETRY_FIRST_MS`] to [`RETRY_MAX_MS`], plus up to a half more as a
    /// jitter drawn from the two ranks and `n`.
    fn retry_pause(&self, n: u32) -> u64 {
        let base = RETRY_FIRST_MS
            .saturating_mul(1u64 << n.min(20))
            .min(RETRY_MAX_MS);
        let h = (u64::from(self.me) << 32 | u64::from(self.peer))
            .wrapping_add(u64::from(n))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        base + (h >> 33) % (base / 2 + 1)
    }

    /// A connect attempt was refused or not answered at `now_ms`: schedule
    /// the next one if the retry window allows it (closing `close`), or
    /// fail with `reason`.
    fn retry_or_fail(&mut self, now_ms: u64, reason: FailReason, close: Option<ConnId>) -> Action {
        if now_ms >= self.retry_until_ms {
            return self.fail(reason, close);
        }
        let pause = self.retry_pause(self.retries);
        self.retries += 1;
        debug!(
            "tcp: peer {}: {} (attempt {}); retrying in {} ms",
            self.peer, reason, self.retries, pause
        );
        self.attempt = Attempt::Backoff;
        self.deadline_ms = now_ms.saturating_add(pause).min(self.retry_until_ms);
        match close {
            Some(conn) => Action::Close { conn },
            None => Action::None,
        }
    }

    /// Our rank.
    pub const fn me(&self) -> u32 {
        self.me
    }

    /// The peer's rank.
    pub const fn peer(&self) -> u32 {
        self.peer
    }

    /// The current state.
    pub const fn state(&self) -> EndpointState {
        self.state
    }

    /// The established connection, when connected.
    pub const fn connection(&self) -> Option<ConnId> {
        match self.state {
            EndpointState::Connected => self.conn,
            _ => None,
        }
    }

    /// Who closed the last connection cleanly, if one was.
    pub const fn last_close(&self) -> Option<CloseCause> {
        self.last_close
    }

    /// Our handshake (what we send to this peer).
    pub const fn handshake(&self) -> HandshakeRepr {
        HandshakeRepr {
            job: self.job,
            rank: self.me,
        }
    }

    /// When [`Self::on_timer`] must be called next (a connect or handshake
    /// is pending), in the adapter's milliseconds.
    pub const fn deadline(&self) -> Option<u64> {
        match self.state {
            EndpointState::Connecting | EndpointState::ConnectAck => Some(self.deadline_ms),
            _ => None,
        }
    }

    fn role(&self, conn: ConnId) -> Role {
        if self.state == EndpointState::ConnectAck && self.attempt == Attempt::HandshakeSent(conn) {
            Role::Ours
        } else if self.state == EndpointState::Connected && self.conn == Some(conn) {
            Role::Established
        } else if self.draining == Some(conn) {
            Role::Draining
        } else {
            Role::Stale
        }
    }

    fn fail(&mut self, reason: FailReason, close: Option<ConnId>) -> Action {
        warn!("tcp: peer {} failed: {}", self.peer, reason);
        self.state = EndpointState::Failed(reason);
        self.attempt = Attempt::None;
        self.conn = None;
        Action::Fail { close, reason }
    }

    /// Our outgoing connection ended before the peer's handshake. If the
    /// peer has the lower rank it may have refused ours in a simultaneous
    /// connect: wait for its connection (until the deadline). Otherwise
    /// ours would have won any tie-break, so this is a failure.
    fn attempt_lost(&mut self, conn: ConnId, reason: FailReason) -> Action {
        if self.peer < self.me {
            debug!(
                "tcp: peer {} closed our connection; waiting for its own",
                self.peer
            );
            self.state = EndpointState::Connecting;
            self.attempt = Attempt::None;
            Action::Close { conn }
        } else {
            self.fail(reason, Some(conn))
        }
    }

    /// The user wants to send a frame to the peer. `now_ms` is used only
    /// when the endpoint is [`EndpointState::Closed`] (the connect it
    /// starts gets its handshake deadline), so an adapter may skip reading
    /// the clock in the other states.
    pub fn on_send_request(&mut self, now_ms: u64) -> SendDecision {
        match self.state {
            EndpointState::Connected => match self.conn {
                Some(conn) => SendDecision::SendNow { conn },
                None => SendDecision::Queue,
            },
            EndpointState::Connecting | EndpointState::ConnectAck => SendDecision::Queue,
            EndpointState::Closed => {
                self.state = EndpointState::Connecting;
                self.attempt = Attempt::InFlight;
                self.deadline_ms = now_ms.saturating_add(self.handshake_timeout_ms);
                self.retry_until_ms = now_ms.saturating_add(self.retry_for_ms);
                self.retries = 0;
                SendDecision::QueueAndConnect
            }
            EndpointState::Failed(reason) => SendDecision::Refuse(reason),
        }
    }

    /// Our outgoing socket `conn` connected. Starts the handshake (the
    /// deadline restarts now), or drops the socket if it is no longer
    /// wanted (the peer's connection won meanwhile, or we closed).
    pub fn on_connected(&mut self, conn: ConnId, now_ms: u64) -> Action {
        if self.state == EndpointState::Connecting && self.attempt == Attempt::InFlight {
            self.state = EndpointState::ConnectAck;
            self.attempt = Attempt::HandshakeSent(conn);
            self.deadline_ms = now_ms.saturating_add(self.handshake_timeout_ms);
            Action::SendHandshake {
                conn,
                repr: self.handshake(),
            }
        } else {
            Action::Close { conn }
        }
    }

    /// Our outgoing socket `conn` could not connect (at `now_ms`): retried
    /// after a pause while the retry window lasts, else the peer fails.
    pub fn on_connect_failed(&mut self, conn: ConnId, now_ms: u64) -> Action {
        if self.state == EndpointState::Connecting && self.attempt == Attempt::InFlight {
            self.retry_or_fail(now_ms, FailReason::ConnectFailed, Some(conn))
        } else {
            Action::Close { conn }
        }
    }

    /// The peer's handshake arrived on our outgoing connection `conn`. It
    /// must name our job and the peer's rank; then the connection is
    /// established.
    pub fn on_handshake(&mut self, conn: ConnId, repr: HandshakeRepr) -> Action {
        match self.role(conn) {
            Role::Ours => {
                if repr.job != self.job || repr.rank != self.peer {
                    return self.fail(
                        FailReason::BadIdentity {
                            job: repr.job,
                            rank: repr.rank,
                        },
                        Some(conn),
                    );
                }
                self.state = EndpointState::Connected;
                self.attempt = Attempt::None;
                self.conn = Some(conn);
                Action::FlushQueue { conn }
            }
            // Cannot happen with a decoder created by `Decoder::new`.
            Role::Established => Action::None,
            Role::Draining | Role::Stale => Action::Close { conn },
        }
    }

    /// An incoming connection `conn` identified itself as this peer
    /// (`repr` validated by [`Incoming::on_handshake`]). Accepted unless we
    /// are connected, failed, or our own attempt wins the tie-break (ours
    /// wins when our rank is the lower).
    pub fn on_incoming(&mut self, conn: ConnId, repr: HandshakeRepr) -> IncomingDecision {
        let refuse = |reason| IncomingDecision::Refuse { conn, reason };
        if repr.job != self.job {
            return refuse(RejectReason::WrongJob {
                expected: self.job,
                found: repr.job,
            });
        }
        if repr.rank != self.peer {
            return refuse(RejectReason::WrongPeer {
                expected: self.peer,
                found: repr.rank,
            });
        }
        let close_ours = match (self.state, self.attempt) {
            (EndpointState::Failed(reason), _) => {
                return refuse(RejectReason::PeerFailed(reason));
            }
            (EndpointState::Connected, _) => return refuse(RejectReason::AlreadyConnected),
            (EndpointState::Closed, _) | (_, Attempt::None | Attempt::Backoff) => None,
            (_, attempt) => {
                if self.me < self.peer {
                    debug!("tcp: simultaneous connect with {}: ours wins", self.peer);
                    return refuse(RejectReason::TieBreak { winner: self.me });
                }
                debug!("tcp: simultaneous connect with {}: theirs wins", self.peer);
                match attempt {
                    Attempt::HandshakeSent(ours) => Some(ours),
                    _ => None,
                }
            }
        };
        self.state = EndpointState::Connected;
        self.attempt = Attempt::None;
        self.conn = Some(conn);
        IncomingDecision::Accept {
            conn,
            reply: self.handshake(),
            close_ours,
        }
    }

    /// The peer sent a FIN on `conn`: a clean close.
    pub fn on_fin(&mut self, conn: ConnId) -> Action {
        match self.role(conn) {
            Role::Established => {
                self.state = EndpointState::Closed;
                self.conn = None;
                self.last_close = Some(CloseCause::Peer);
                Action::Close { conn }
            }
            Role::Draining => {
                self.draining = None;
                Action::Close { conn }
            }
            Role::Ours => self.attempt_lost(conn, FailReason::HandshakeRefused),
            Role::Stale => Action::Close { conn },
        }
    }

    /// EOF on `conn`; `has_partial` is [`super::decoder::Decoder::has_partial`]
    /// (the stream ended inside a frame). Without a FIN before it, the
    /// connection is lost.
    pub fn on_eof(&mut self, conn: ConnId, has_partial: bool) -> Action {
        match self.role(conn) {
            Role::Established => self.fail(
                FailReason::ConnectionLost {
                    mid_frame: has_partial,
                },
                Some(conn),
            ),
            Role::Ours => self.attempt_lost(conn, FailReason::HandshakeRefused),
            Role::Draining => {
                self.draining = None;
                Action::Close { conn }
            }
            Role::Stale => Action::Close { conn },
        }
    }

    /// The socket `conn` reported an error (reset, timeout, ...).
    pub fn on_error(&mut self, conn: ConnId) -> Action {
        match self.role(conn) {
            Role::Established => self.fail(FailReason::SocketError, Some(conn)),
            Role::Ours => self.attempt_lost(conn, FailReason::SocketError),
            Role::Draining => {
                self.draining = None;
                Action::Close { conn }
            }
            Role::Stale => Action::Close { conn },
        }
    }

    /// The decoder of `conn` failed with `error`: the peer is not speaking
    /// the protocol.
    pub fn on_protocol_error(&mut self, conn: ConnId, error: WireError) -> Action {
        match self.role(conn) {
            Role::Established | Role::Ours => self.fail(FailReason::Protocol(error), Some(conn)),
            Role::Draining => {
                self.draining = None;
                Action::Close { conn }
            }
            Role::Stale => Action::Close { conn },
        }
    }

    /// We want to close the connection cleanly: a FIN when connected
    /// ([`Action::SendFin`]), our attempt dropped when connecting. The
    /// endpoint is `Closed` afterwards (a failed one stays failed).
    pub fn close(&mut self) -> Action {
        match self.state {
            EndpointState::Connected => {
                self.state = EndpointState::Closed;
                self.last_close = Some(CloseCause::Local);
                match self.conn.take() {
                    Some(conn) => {
                        self.draining = Some(conn);
                        Action::SendFin { conn }
                    }
                    None => Action::None,
                }
            }
            EndpointState::Connecting | EndpointState::ConnectAck => {
                self.state = EndpointState::Closed;
                self.last_close = Some(CloseCause::Local);
                match core::mem::replace(&mut self.attempt, Attempt::None) {
                    Attempt::HandshakeSent(conn) => Action::Close { conn },
                    _ => Action::None,
                }
            }
            EndpointState::Closed | EndpointState::Failed(_) => Action::None,
        }
    }

    /// Time passed: a pause before a retry that has ended starts the next
    /// connect ([`Action::Connect`]); a connect past its deadline is
    /// retried while the retry window lasts; otherwise a connect or
    /// handshake past its deadline fails the peer.
    pub fn on_timer(&mut self, now_ms: u64) -> Action {
        match self.deadline() {
            Some(deadline) if now_ms >= deadline => {
                let (reason, close) = match self.attempt {
                    Attempt::Backoff => {
                        self.attempt = Attempt::InFlight;
                        self.deadline_ms = now_ms.saturating_add(self.handshake_timeout_ms);
                        return Action::Connect;
                    }
                    Attempt::InFlight if now_ms < self.retry_until_ms => {
                        // The stale socket is the adapter's to drop with
                        // the next `Connect`.
                        return self.retry_or_fail(now_ms, FailReason::ConnectTimeout, None);
                    }
                    Attempt::InFlight => (FailReason::ConnectTimeout, None),
                    Attempt::HandshakeSent(conn) => (FailReason::HandshakeTimeout, Some(conn)),
                    Attempt::None => (FailReason::HandshakeTimeout, None),
                };
                self.fail(reason, close)
            }
            _ => Action::None,
        }
    }
}

/// Where an [`Incoming`] connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IncomingState {
    /// Waiting for the peer's handshake.
    Waiting,
    /// Identified as this rank: hand it to that peer's
    /// [`Endpoint::on_incoming`].
    Identified(u32),
    /// Refused: drop the socket.
    Rejected(RejectReason),
}

/// An accepted socket whose peer has not identified itself yet (the seed's
/// `accept_handler` / `recv_handler` pair, without the blocking read).
///
/// The adapter decodes the socket with
/// [`super::decoder::Decoder::expecting_handshake`], passes the handshake
/// to [`Self::on_handshake`], and drops the socket when it is rejected or
/// when [`Self::on_timer`] says it expired (EOF or a decoder error before
/// the handshake: drop it too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    deadline_ms: u64,
    state: IncomingState,
}

impl Incoming {
    /// A socket accepted at `accepted_ms`, which must identify itself
    /// within `handshake_timeout_ms`.
    pub const fn new(accepted_ms: u64, handshake_timeout_ms: u64) -> Self {
        Self {
            deadline_ms: accepted_ms.saturating_add(handshake_timeout_ms),
            state: IncomingState::Waiting,
        }
    }

    /// Where it stands.
    pub const fn state(&self) -> IncomingState {
        self.state
    }

    /// When it expires.
    pub const fn deadline(&self) -> u64 {
        self.deadline_ms
    }

    /// Validates the peer's handshake against our job (`my_job`), our rank
    /// (`me`) and the job size (`nprocs`): the same job hash, a rank below
    /// `nprocs` and not ours. Returns the peer's rank.
    pub fn on_handshake(
        &mut self,
        repr: HandshakeRepr,
        my_job: u64,
        me: u32,
        nprocs: u32,
    ) -> Result<u32, RejectReason> {
        let verdict = if self.state == IncomingState::Rejected(RejectReason::HandshakeTimeout) {
            Err(RejectReason::HandshakeTimeout)
        } else if repr.job != my_job {
            Err(RejectReason::WrongJob {
                expected: my_job,
                found: repr.job,
            })
        } else if repr.rank >= nprocs {
            Err(RejectReason::RankOutOfRange {
                rank: repr.rank,
                nprocs,
            })
        } else if repr.rank == me {
            Err(RejectReason::OwnRank { rank: me })
        } else {
            Ok(repr.rank)
        };
        self.state = match verdict {
            Ok(rank) => IncomingState::Identified(rank),
            Err(reason) => {
                debug!("tcp: incoming connection refused: {}", reason);
                IncomingState::Rejected(reason)
            }
        };
        verdict
    }

    /// Whether the socket expired (still unidentified at its deadline):
    /// drop it. Once identified, it never expires here (the endpoint owns
    /// its timeouts).
    pub fn on_timer(&mut self, now_ms: u64) -> bool {
        if self.state == IncomingState::Waiting && now_ms >= self.deadline_ms {
            self.state = IncomingState::Rejected(RejectReason::HandshakeTimeout);
        }
        self.state == IncomingState::Rejected(RejectReason::HandshakeTimeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::wire::job_hash;
    use std::string::ToString;

    const T: u64 = DEFAULT_HANDSHAKE_TIMEOUT_MS;

    fn job() -> u64 {
        job_hash(b"job-42")
    }

    fn hs(rank: u32) -> HandshakeRepr {
        HandshakeRepr { job: job(), rank }
    }

    /// Rank `me`'s endpoint of `peer`, connected over our outgoing `conn`.
    /// The decision accepting `conn`, answering `reply` and dropping
    /// `close_ours`.
    fn accept(conn: ConnId, reply: HandshakeRepr, close_ours: Option<ConnId>) -> IncomingDecision {
        IncomingDecision::Accept {
            conn,
            reply,
            close_ours,
        }
    }

    /// The action failing the peer for `reason`, closing `close`.
    fn fail(close: Option<ConnId>, reason: FailReason) -> Action {
        Action::Fail { close, reason }
    }

    fn connected(me: u32, peer: u32, conn: ConnId) -> Endpoint {
        let mut e = Endpoint::new(me, peer, job(), T);
        assert_eq!(e.on_send_request(0), SendDecision::QueueAndConnect);
        e.on_connected(conn, 1);
        assert_eq!(e.on_handshake(conn, hs(peer)), Action::FlushQueue { conn });
        e
    }

    #[test]
    fn lazy_connect_then_flush() {
        let c = ConnId(7);
        let mut e = Endpoint::new(0, 1, job(), T);
        assert_eq!(e.state(), EndpointState::Closed);
        assert_eq!(e.deadline(), None);
        assert_eq!(e.on_send_request(100), SendDecision::QueueAndConnect);
        assert_eq!(e.state(), EndpointState::Connecting);
        assert_eq!(e.deadline(), Some(100 + T));
        // More frames while connecting are queued, no second connect.
        assert_eq!(e.on_send_request(101), SendDecision::Queue);
        assert_eq!(
            e.on_connected(c, 150),
            Action::SendHandshake {
                conn: c,
                repr: HandshakeRepr {
                    job: job(),
                    rank: 0
                }
            }
        );
        assert_eq!(e.state(), EndpointState::ConnectAck);
        assert_eq!(e.deadline(), Some(150 + T));
        assert_eq!(e.on_send_request(151), SendDecision::Queue);
        assert_eq!(e.on_handshake(c, hs(1)), Action::FlushQueue { conn: c });
        assert_eq!(e.state(), EndpointState::Connected);
        assert_eq!(e.connection(), Some(c));
        assert_eq!(e.on_send_request(152), SendDecision::SendNow { conn: c });
        assert_eq!(e.on_timer(u64::MAX), Action::None);
    }

    /// Checks the outcome of a simultaneous connect between ranks 1 and 2:
    /// both connected over the same connection.
    fn assert_agree(e1: &Endpoint, e2: &Endpoint, winner: ConnId) {
        assert_eq!(e1.state(), EndpointState::Connected);
        assert_eq!(e2.state(), EndpointState::Connected);
        assert_eq!(e1.connection(), Some(winner));
        assert_eq!(e2.connection(), Some(winner));
    }

    // The ids name the sockets on both sides for readability: A is rank
    // 1's connection to rank 2 (accepted by rank 2), B the reverse.
    const A: ConnId = ConnId(1);
    const B: ConnId = ConnId(2);

    fn both_start() -> (Endpoint, Endpoint) {
        let mut e1 = Endpoint::new(1, 2, job(), T);
        let mut e2 = Endpoint::new(2, 1, job(), T);
        assert_eq!(e1.on_send_request(0), SendDecision::QueueAndConnect);
        assert_eq!(e2.on_send_request(0), SendDecision::QueueAndConnect);
        (e1, e2)
    }

    #[test]
    fn simultaneous_connect_both_handshakes_cross() {
        let (mut e1, mut e2) = both_start();
        assert!(matches!(
            e1.on_connected(A, 1),
            Action::SendHandshake { .. }
        ));
        assert!(matches!(
            e2.on_connected(B, 1),
            Action::SendHandshake { .. }
        ));
        // Rank 2 gets rank 1's handshake on A: the lower rank's wins.
        let d2 = e2.on_incoming(A, hs(1));
        assert_eq!(d2, accept(A, hs(2), Some(B)));
        assert_eq!(d2.flush_queue(), Some(A));
        // Rank 1 gets rank 2's handshake on B: refused, ours goes on.
        let d1 = e1.on_incoming(B, hs(2));
        assert_eq!(
            d1,
            IncomingDecision::Refuse {
                conn: B,
                reason: RejectReason::TieBreak { winner: 1 }
            }
        );
        assert_eq!(d1.flush_queue(), None);
        assert_eq!(e1.state(), EndpointState::ConnectAck);
        // Rank 2's reply arrives on A.
        assert_eq!(e1.on_handshake(A, hs(2)), Action::FlushQueue { conn: A });
        // The dropped B reports EOF on both sides: stale, ignored.
        assert_eq!(e1.on_eof(B, false), Action::Close { conn: B });
        assert_eq!(e2.on_eof(B, false), Action::Close { conn: B });
        assert_agree(&e1, &e2, A);
    }

    #[test]
    fn simultaneous_connect_refusal_seen_first() {
        let (mut e1, mut e2) = both_start();
        e1.on_connected(A, 1);
        e2.on_connected(B, 1);
        // Rank 1 refuses B before rank 2 has seen A's handshake.
        assert!(matches!(
            e1.on_incoming(B, hs(2)),
            IncomingDecision::Refuse { .. }
        ));
        // Rank 2 sees its own connection closed: rank 1 is lower, so it
        // waits for rank 1's connection instead of failing.
        assert_eq!(e2.on_eof(B, false), Action::Close { conn: B });
        assert_eq!(e2.state(), EndpointState::Connecting);
        assert_eq!(e2.on_incoming(A, hs(1)), accept(A, hs(2), None));
        assert_eq!(e1.on_handshake(A, hs(2)), Action::FlushQueue { conn: A });
        assert_agree(&e1, &e2, A);
    }

    #[test]
    fn simultaneous_connect_ours_not_yet_connected() {
        let (mut e1, mut e2) = both_start();
        e1.on_connected(A, 1);
        // Rank 2's own connect is still in flight when A's handshake comes.
        assert_eq!(e2.on_incoming(A, hs(1)), accept(A, hs(2), None));
        // ... then it connects: no longer wanted.
        assert_eq!(e2.on_connected(B, 2), Action::Close { conn: B });
        assert_eq!(e1.on_handshake(A, hs(2)), Action::FlushQueue { conn: A });
        assert_agree(&e1, &e2, A);
        // Rank 1's connect in flight while B's handshake comes: refused.
        let (mut e1, mut e2) = both_start();
        e2.on_connected(B, 1);
        assert!(matches!(
            e1.on_incoming(B, hs(2)),
            IncomingDecision::Refuse {
                reason: RejectReason::TieBreak { winner: 1 },
                ..
            }
        ));
        e1.on_connected(A, 2);
        assert!(matches!(
            e2.on_incoming(A, hs(1)),
            IncomingDecision::Accept {
                close_ours: Some(B),
                ..
            }
        ));
        assert_eq!(e1.on_handshake(A, hs(2)), Action::FlushQueue { conn: A });
        assert_agree(&e1, &e2, A);
    }

    #[test]
    fn incoming_while_closed_or_connected() {
        let mut e = Endpoint::new(0, 1, job(), T);
        let d = e.on_incoming(ConnId(3), hs(1));
        assert_eq!(d.flush_queue(), Some(ConnId(3)));
        assert_eq!(
            e.on_send_request(0),
            SendDecision::SendNow { conn: ConnId(3) }
        );
        assert_eq!(
            e.on_incoming(ConnId(4), hs(1)),
            IncomingDecision::Refuse {
                conn: ConnId(4),
                reason: RejectReason::AlreadyConnected
            }
        );
        assert_eq!(
            e.on_incoming(ConnId(5), hs(2)),
            IncomingDecision::Refuse {
                conn: ConnId(5),
                reason: RejectReason::WrongPeer {
                    expected: 1,
                    found: 2
                }
            }
        );
        assert!(matches!(
            e.on_incoming(ConnId(6), HandshakeRepr { job: 1, rank: 1 }),
            IncomingDecision::Refuse {
                reason: RejectReason::WrongJob { .. },
                ..
            }
        ));
        assert_eq!(e.connection(), Some(ConnId(3)));
    }

    #[test]
    fn fin_is_a_clean_close() {
        let c = ConnId(1);
        let mut e = connected(0, 1, c);
        assert_eq!(e.on_fin(c), Action::Close { conn: c });
        assert_eq!(e.state(), EndpointState::Closed);
        assert_eq!(e.last_close(), Some(CloseCause::Peer));
        // EOF after the FIN is nothing.
        assert_eq!(e.on_eof(c, false), Action::Close { conn: c });
        assert_eq!(e.state(), EndpointState::Closed);
        // The next send reconnects lazily.
        assert_eq!(e.on_send_request(5), SendDecision::QueueAndConnect);
    }

    /// An endpoint connected on `c` whose connection ends (`mid_frame` or
    /// between frames) without a FIN: checks that this fails the peer,
    /// closing the connection; gives the endpoint and the reason.
    fn lost_by_eof(c: ConnId, mid_frame: bool) -> (Endpoint, FailReason) {
        let mut e = connected(0, 1, c);
        let lost = FailReason::ConnectionLost { mid_frame };
        assert_eq!(e.on_eof(c, mid_frame), fail(Some(c), lost));
        assert_eq!(e.state(), EndpointState::Failed(lost));
        (e, lost)
    }

    #[test]
    fn eof_without_fin_is_a_failure() {
        let (mut e, lost) = lost_by_eof(ConnId(1), false);
        assert_eq!(e.on_send_request(0), SendDecision::Refuse(lost));
        // Failed is final: no reconnect, incoming refused.
        assert!(matches!(
            e.on_incoming(ConnId(2), hs(1)),
            IncomingDecision::Refuse {
                reason: RejectReason::PeerFailed(_),
                ..
            }
        ));
        assert_eq!(e.close(), Action::None);
        assert_eq!(e.state(), EndpointState::Failed(lost));
    }

    #[test]
    fn eof_mid_frame_is_a_failure() {
        let c = ConnId(1);
        lost_by_eof(c, true);
        let mut e = connected(0, 1, c);
        assert!(matches!(
            e.on_error(c),
            Action::Fail {
                reason: FailReason::SocketError,
                ..
            }
        ));
        let mut e = connected(0, 1, c);
        let err = WireError::BadType { found: 9 };
        assert_eq!(
            e.on_protocol_error(c, err),
            fail(Some(c), FailReason::Protocol(err))
        );
    }

    #[test]
    fn local_close_sends_fin_and_drains() {
        let c = ConnId(1);
        let mut e = connected(0, 1, c);
        assert_eq!(e.close(), Action::SendFin { conn: c });
        assert_eq!(e.state(), EndpointState::Closed);
        assert_eq!(e.last_close(), Some(CloseCause::Local));
        // The peer closes in turn: a clean EOF on the drained connection.
        assert_eq!(e.on_eof(c, false), Action::Close { conn: c });
        assert_eq!(e.state(), EndpointState::Closed);
        // Closing while connecting drops our socket.
        let mut e = Endpoint::new(0, 1, job(), T);
        e.on_send_request(0);
        e.on_connected(ConnId(2), 0);
        assert_eq!(e.close(), Action::Close { conn: ConnId(2) });
        assert_eq!(e.state(), EndpointState::Closed);
    }

    #[test]
    fn a_refused_connect_is_retried_with_growing_pauses_until_the_window_ends() {
        let window = 5_000;
        let mut e = Endpoint::new(3, 7, job(), T).with_connect_retry(window);
        assert_eq!(e.on_send_request(100), SendDecision::QueueAndConnect);
        let mut now = 100;
        let mut pauses = std::vec::Vec::new();
        let mut conn = 1;
        loop {
            let a = e.on_connect_failed(ConnId(conn), now);
            if let Action::Fail { reason, close } = a {
                assert_eq!(reason, FailReason::ConnectFailed);
                assert_eq!(close, Some(ConnId(conn)));
                break;
            }
            assert_eq!(a, Action::Close { conn: ConnId(conn) });
            assert_eq!(e.state(), EndpointState::Connecting);
            let d = e.deadline().unwrap();
            assert!(d > now && d <= 100 + window, "{d}");
            pauses.push(d - now);
            // Nothing happens before the pause ends, then a new connect.
            assert_eq!(e.on_timer(d - 1), Action::None);
            assert_eq!(e.on_timer(d), Action::Connect);
            now = d;
            conn += 1;
        }
        assert!(now >= 100 + window, "failed before the window ended: {now}");
        assert!(pauses.len() >= 5, "{pauses:?}");
        // Doubling (with a jitter of at most a half) up to the ceiling.
        assert!(pauses[0] >= RETRY_FIRST_MS && pauses[0] <= RETRY_FIRST_MS * 3 / 2);
        assert!(pauses[3] >= 8 * RETRY_FIRST_MS, "{pauses:?}");
        assert!(
            pauses.iter().all(|&p| p <= RETRY_MAX_MS * 3 / 2),
            "{pauses:?}"
        );
        assert_eq!(e.connect_retries() as usize, pauses.len());
    }

    #[test]
    fn an_unanswered_connect_is_retried_then_connects() {
        let mut e = Endpoint::new(0, 1, job(), T).with_connect_retry(60_000);
        e.on_send_request(0);
        // The first attempt is not answered within the handshake timeout.
        assert_eq!(e.on_timer(T), Action::None);
        let d = e.deadline().unwrap();
        assert_eq!(e.on_timer(d), Action::Connect);
        // The new attempt connects and the handshake completes.
        let c = ConnId(9);
        assert!(matches!(
            e.on_connected(c, d + 1),
            Action::SendHandshake { .. }
        ));
        assert_eq!(
            e.on_handshake(
                c,
                HandshakeRepr {
                    job: job(),
                    rank: 1
                }
            ),
            Action::FlushQueue { conn: c }
        );
        assert_eq!(e.state(), EndpointState::Connected);
    }

    #[test]
    fn an_unanswered_connect_fails_once_the_window_has_passed() {
        let mut e = Endpoint::new(0, 1, job(), T).with_connect_retry(T / 2);
        e.on_send_request(0);
        assert_eq!(e.on_timer(T), fail(None, FailReason::ConnectTimeout));
    }

    #[test]
    fn the_peer_connecting_during_a_pause_is_accepted() {
        // The lower rank, waiting to retry, takes the peer's connection
        // (it has no attempt of its own to prefer).
        let mut e = Endpoint::new(0, 1, job(), T).with_connect_retry(60_000);
        e.on_send_request(0);
        e.on_connect_failed(ConnId(1), 5);
        let d = e.on_incoming(
            ConnId(2),
            HandshakeRepr {
                job: job(),
                rank: 1,
            },
        );
        assert!(
            matches!(
                d,
                IncomingDecision::Accept {
                    close_ours: None,
                    ..
                }
            ),
            "{d:?}"
        );
        assert_eq!(e.state(), EndpointState::Connected);
        assert_eq!(e.deadline(), None);
    }

    #[test]
    fn jitter_differs_between_peers() {
        let a = Endpoint::new(0, 1, job(), T).retry_pause(4);
        let b = Endpoint::new(0, 2, job(), T).retry_pause(4);
        let c = Endpoint::new(5, 1, job(), T).retry_pause(4);
        assert!(a != b || b != c, "{a} {b} {c}");
    }

    #[test]
    fn handshake_timeout() {
        let c = ConnId(1);
        let mut e = Endpoint::new(0, 1, job(), T);
        e.on_send_request(0);
        e.on_connected(c, 10);
        assert_eq!(e.on_timer(10 + T - 1), Action::None);
        let reason = FailReason::HandshakeTimeout;
        assert_eq!(e.on_timer(10 + T), fail(Some(c), reason));
        assert_eq!(e.state(), EndpointState::Failed(reason));
        // A late reply changes nothing.
        assert_eq!(e.on_handshake(c, hs(1)), Action::Close { conn: c });
        assert_eq!(e.state(), EndpointState::Failed(reason));
        // A connect that never completes.
        let mut e = Endpoint::new(0, 1, job(), T);
        e.on_send_request(0);
        assert_eq!(e.on_timer(T), fail(None, FailReason::ConnectTimeout));
        assert_eq!(e.on_connected(c, T + 1), Action::Close { conn: c });
    }

    #[test]
    fn connect_failed_and_refused() {
        let c = ConnId(1);
        let mut e = Endpoint::new(0, 1, job(), T);
        e.on_send_request(0);
        assert_eq!(
            e.on_connect_failed(c, 5),
            fail(Some(c), FailReason::ConnectFailed)
        );
        // Lower rank: a peer closing our connection unanswered is a failure.
        let mut e = Endpoint::new(0, 1, job(), T);
        e.on_send_request(0);
        e.on_connected(c, 0);
        assert_eq!(
            e.on_eof(c, false),
            fail(Some(c), FailReason::HandshakeRefused)
        );
        // Higher rank: it waits for the peer's connection, until the deadline.
        let mut e = Endpoint::new(1, 0, job(), T);
        e.on_send_request(0);
        e.on_connected(c, 0);
        assert_eq!(e.on_eof(c, false), Action::Close { conn: c });
        assert_eq!(e.state(), EndpointState::Connecting);
        assert!(matches!(
            e.on_timer(T),
            Action::Fail {
                close: None,
                reason: FailReason::HandshakeTimeout
            }
        ));
    }

    #[test]
    fn bad_identity_on_our_connection() {
        let c = ConnId(1);
        for reply in [hs(2), HandshakeRepr { job: 5, rank: 1 }] {
            let mut e = Endpoint::new(0, 1, job(), T);
            e.on_send_request(0);
            e.on_connected(c, 0);
            let reason = FailReason::BadIdentity {
                job: reply.job,
                rank: reply.rank,
            };
            assert_eq!(e.on_handshake(c, reply), fail(Some(c), reason));
            assert_eq!(e.state(), EndpointState::Failed(reason));
        }
    }

    #[test]
    fn incoming_validation() {
        let mut i = Incoming::new(1000, T);
        assert_eq!(i.on_handshake(hs(3), job(), 0, 4), Ok(3));
        assert_eq!(i.state(), IncomingState::Identified(3));
        assert!(!i.on_timer(u64::MAX));

        let mut i = Incoming::new(1000, T);
        assert_eq!(
            i.on_handshake(HandshakeRepr { job: 7, rank: 1 }, job(), 0, 4),
            Err(RejectReason::WrongJob {
                expected: job(),
                found: 7
            })
        );
        assert_eq!(
            i.on_handshake(hs(4), job(), 0, 4),
            Err(RejectReason::RankOutOfRange { rank: 4, nprocs: 4 })
        );
        assert_eq!(
            i.on_handshake(hs(u32::MAX), job(), 0, 4),
            Err(RejectReason::RankOutOfRange {
                rank: u32::MAX,
                nprocs: 4
            })
        );
        assert_eq!(
            i.on_handshake(hs(2), job(), 2, 4),
            Err(RejectReason::OwnRank { rank: 2 })
        );
        assert!(matches!(i.state(), IncomingState::Rejected(_)));
    }

    #[test]
    fn incoming_times_out() {
        let mut i = Incoming::new(1000, T);
        assert_eq!(i.deadline(), 1000 + T);
        assert!(!i.on_timer(1000 + T - 1));
        assert!(i.on_timer(1000 + T));
        assert_eq!(
            i.on_handshake(hs(1), job(), 0, 4),
            Err(RejectReason::HandshakeTimeout)
        );
        assert!(i.on_timer(1000 + T));
    }

    #[test]
    fn reasons_display() {
        assert_eq!(
            RejectReason::RankOutOfRange { rank: 9, nprocs: 4 }.to_string(),
            "handshake from rank 9, the job has 4 ranks"
        );
        assert_eq!(
            FailReason::ConnectionLost { mid_frame: true }.to_string(),
            "connection lost in the middle of a frame"
        );
        assert!(FailReason::Protocol(WireError::BadType { found: 0 })
            .to_string()
            .contains("unknown frame type 0"));
    }
}
