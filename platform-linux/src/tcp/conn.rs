//! Connection management: listening, connecting, accepting and
//! identifying sockets, carrying out the endpoint state machine's actions,
//! breaks and timers.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use btl_core::tcp::decoder::Decoder;
use btl_core::tcp::endpoint::{Action, ConnId, Incoming, IncomingDecision, RejectReason};
use btl_core::tcp::wire::{FrameRepr, HandshakeRepr};
use rustix::event::epoll;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::*;

/// A close-on-exec TCP socket of `ip`'s address family.
fn stream_socket(ip: IpAddr) -> io::Result<Socket> {
    let domain = if ip.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))
}

/// Binds a non-blocking IPv4 listener on `ip` within the port range,
/// skipping ports in use (no `SO_REUSEADDR`).
pub(super) fn listen_in_range(ip: IpAddr, cfg: &Config) -> Result<Socket, TcpError> {
    let (port_min, port_range) = if ip.is_ipv4() {
        (cfg.port_min, cfg.port_range)
    } else {
        (cfg.port_min6, cfg.port_range6)
    };
    for i in 0..u32::from(port_range) {
        let port = u32::from(port_min) + i;
        let Ok(port) = u16::try_from(port) else { break };
        let sock = stream_socket(ip).map_err(io_err("create a listening socket"))?;
        if ip.is_ipv6() {
            sock.set_only_v6(true).map_err(io_err("set IPV6_V6ONLY"))?;
        }
        match sock.bind(&SockAddr::from(SocketAddr::new(ip, port))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => {
                return Err(TcpError::Io {
                    what: "bind the listening socket",
                    source: e,
                })
            }
        }
        sock.listen(1024).map_err(io_err("listen"))?;
        sock.set_nonblocking(true)
            .map_err(io_err("make the listener non-blocking"))?;
        return Ok(sock);
    }
    Err(TcpError::NoPort {
        min: port_min,
        range: port_range,
    })
}

/// Configures a connection: non-blocking, Nagle, buffer sizes, and
/// dead-link detection — keep-alive probes after `keepalive_time` idle
/// seconds, every `keepalive_intvl` seconds, `keepalive_probes` of them;
/// and `TCP_USER_TIMEOUT`, so data that stays unacknowledged that long
/// breaks the connection (a partition does not send FIN or RST).
pub(super) fn tune(sock: &Socket, cfg: &Config) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    sock.set_nodelay(cfg.nodelay)?;
    if cfg.keepalive_time > 0 {
        let ka = socket2::TcpKeepalive::new()
            .with_time(std::time::Duration::from_secs(u64::from(
                cfg.keepalive_time,
            )))
            .with_interval(std::time::Duration::from_secs(u64::from(
                cfg.keepalive_intvl.max(1),
            )))
            .with_retries(cfg.keepalive_probes.max(1));
        sock.set_tcp_keepalive(&ka)?;
    }
    if cfg.user_timeout_ms > 0 {
        sock.set_tcp_user_timeout(Some(std::time::Duration::from_millis(u64::from(
            cfg.user_timeout_ms,
        ))))?;
    }
    if cfg.sndbuf > 0 {
        sock.set_send_buffer_size(cfg.sndbuf)?;
    }
    if cfg.rcvbuf > 0 {
        sock.set_recv_buffer_size(cfg.rcvbuf)?;
    }
    Ok(())
}

impl Tcp {
    pub(super) fn add_conn(
        &mut self,
        sock: Socket,
        peer: Option<u32>,
        incoming: Option<Incoming>,
        connecting: bool,
        addr: String,
    ) -> Result<ConnId, TcpError> {
        let id = self.next_conn;
        self.next_conn = self.next_conn.wrapping_add(1);
        let flags = if connecting {
            epoll::EventFlags::OUT
        } else {
            epoll::EventFlags::IN
        };
        epoll::add(
            &self.epoll,
            sock.as_fd(),
            epoll::EventData::new_u64(u64::from(id)),
            flags,
        )
        .map_err(|e| TcpError::Io {
            what: "register a connection",
            source: e.into(),
        })?;
        let buf = vec![0u8; self.cfg.cache].into_boxed_slice();
        let rbuf = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
        let dec = if incoming.is_some() || connecting {
            Decoder::expecting_handshake(buf)
        } else {
            Decoder::new(buf)
        }
        .map_err(|e| TcpError::Param(e.to_string()))?;
        self.direct_stale = true;
        self.conns.insert(
            id,
            Conn {
                sock,
                peer,
                incoming,
                connecting,
                dec,
                out: VecDeque::new(),
                out_off: 0,
                write_armed: connecting,
                cur: None,
                payload: Vec::new(),
                into: None,
                delivered: false,
                rbuf,
                close_after_write: false,
                wrote_in: u64::MAX,
                held: 0,
                lowat: 1,
                lowat_on: None,
                big_read_end: None,
                addr,
            },
        );
        Ok(ConnId(id))
    }

    /// Drops a connection; frames of ours it had not written complete with
    /// an error (their peer's stream is gone).
    pub(super) fn drop_conn(&mut self, id: ConnId) {
        if let Some(c) = self.conns.remove(&id.0) {
            self.direct_stale = true;
            self.unwatched.retain(|&c| c != id);
            let _ = epoll::delete(&self.epoll, c.sock.as_fd());
            if c.out.iter().any(|b| b.op().is_some() || b.len() > 0) {
                self.abandon(c.peer, c.out);
            }
        }
    }

    pub(super) fn start_connect(&mut self, peer: u32) -> Result<(), TcpError> {
        let Some((addr, from)) = self.peers[peer as usize].addr else {
            return Err(TcpError::BadAddress { peer });
        };
        let sock = stream_socket(addr.ip()).map_err(io_err("create a socket"))?;
        tune(&sock, &self.cfg).map_err(io_err("configure a socket"))?;
        // Outgoing connections leave from the address we listen on (the
        // selected interface).
        let _ = sock.bind(&SockAddr::from(SocketAddr::new(from, 0)));
        match sock.connect(&SockAddr::from(addr)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => {
                log::debug!("tcp: connect to {peer} at {addr}: {e}");
                let now = self.now_ms();
                let a = self.peers[peer as usize]
                    .ep
                    .on_connect_failed(ConnId(u32::MAX), now);
                let failed = matches!(a, Action::Fail { .. });
                self.apply(peer, a);
                if failed {
                    return Err(TcpError::Io {
                        what: "connect",
                        source: e,
                    });
                }
                return Ok(());
            }
        }
        self.add_conn(sock, Some(peer), None, true, addr.to_string())?;
        Ok(())
    }

    /// Carries out an endpoint action for `peer`.
    pub(super) fn apply(&mut self, peer: u32, action: Action) {
        match action {
            Action::None => {}
            Action::SendHandshake { conn, repr } => {
                self.queue_bytes(conn, repr.to_bytes().to_vec());
            }
            Action::FlushQueue { conn } => self.flush_queue_to(peer, conn),
            Action::SendFin { conn } => {
                self.queue_bytes(conn, FrameRepr::fin().to_bytes().to_vec());
                if let Some(c) = self.conns.get_mut(&conn.0) {
                    c.close_after_write = true;
                }
            }
            Action::Close { conn } => {
                let pending = self.conns.get(&conn.0).is_some_and(|c| !c.out.is_empty());
                if pending {
                    if let Some(c) = self.conns.get_mut(&conn.0) {
                        c.close_after_write = true;
                    }
                } else {
                    self.drop_conn(conn);
                }
            }
            Action::Connect => {
                // A retry: the previous attempt's socket, if still
                // connecting, is dropped first.
                let stale: Vec<ConnId> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.connecting && c.peer == Some(peer))
                    .map(|(&id, _)| ConnId(id))
                    .collect();
                for c in stale {
                    self.drop_conn(c);
                }
                if let Err(e) = self.start_connect(peer) {
                    self.fail_peer(peer, e.to_string());
                }
            }
            Action::Fail { close, reason } => {
                if let Some(c) = close {
                    self.drop_conn(c);
                }
                self.fail_peer(peer, reason.to_string());
            }
        }
    }

    /// Declares `peer` failed (once): its queued frames are dropped, its
    /// operations complete with an error, and the failure is reported.
    pub(super) fn fail_peer(&mut self, peer: u32, why: String) {
        let Some(p) = self.peers.get_mut(peer as usize) else {
            return;
        };
        if p.failed.is_some() {
            return;
        }
        if !p.queue.is_empty() {
            log::warn!(
                "tcp: dropping {} queued frames to failed peer {peer}",
                p.queue.len()
            );
        }
        // (The endpoint state machine logged the failure.) The system's
        // word for a broken connection says what happened (a timeout: the
        // peer stopped answering; a reset: it went away).
        let why = match self.io_error.take() {
            Some(e) => format!("{why}: {e}"),
            None => why,
        };
        let p = &mut self.peers[peer as usize];
        p.failed = Some(why.clone());
        p.partial = None;
        let q = std::mem::take(&mut p.queue);
        self.abandon(Some(peer), q);
        let conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.peer == Some(peer) && c.incoming.is_none())
            .map(|(&id, _)| ConnId(id))
            .collect();
        for c in conns {
            self.drop_conn(c);
        }
        self.rma.fail_peer(peer, &mut self.done);
        self.to_report.push((peer, why));
    }

    /// A connection broke (error or EOF): tell its endpoint, or just drop
    /// it if it never identified itself.
    pub(super) fn conn_broken(&mut self, conn: ConnId, eof_clean_possible: bool) {
        let Some(c) = self.conns.get(&conn.0) else {
            return;
        };
        let has_partial = c.dec.has_partial() || c.cur.is_some();
        match c.peer {
            Some(peer) if c.incoming.is_none() => {
                let a = if eof_clean_possible {
                    self.peers[peer as usize].ep.on_eof(conn, has_partial)
                } else {
                    self.peers[peer as usize].ep.on_error(conn)
                };
                self.drop_conn(conn);
                let a = match a {
                    Action::Close { conn: c2 } if c2 == conn => Action::None,
                    Action::Fail {
                        close: Some(c2),
                        reason,
                    } if c2 == conn => Action::Fail {
                        close: None,
                        reason,
                    },
                    other => other,
                };
                self.apply(peer, a);
            }
            _ => self.drop_conn(conn),
        }
    }

    pub(super) fn reject(&mut self, conn: ConnId, why: &dyn fmt::Display) {
        let addr = self
            .conns
            .get(&conn.0)
            .map(|c| c.addr.clone())
            .unwrap_or_default();
        log::warn!("tcp: dropped connection from {addr}: {why}");
        self.rejected += 1;
        self.drop_conn(conn);
    }

    pub(super) fn accept_all(&mut self, listener: usize) -> usize {
        let mut n = 0;
        loop {
            let Some(l) = self.listeners.get(listener) else {
                return n;
            };
            match l.accept() {
                Ok((sock, addr)) => {
                    n += 1;
                    let addr = addr.as_socket().map(|a| a.to_string()).unwrap_or_default();
                    if let Err(e) = tune(&sock, &self.cfg) {
                        log::warn!("tcp: cannot configure a connection from {addr}: {e}");
                        continue;
                    }
                    let inc = Incoming::new(self.now_ms(), self.cfg.handshake_ms);
                    if let Err(e) = self.add_conn(sock, None, Some(inc), false, addr) {
                        log::warn!("{e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("tcp: accept failed: {e}");
                    break;
                }
            }
        }
        n
    }

    pub(super) fn on_incoming_handshake(&mut self, conn: ConnId, repr: HandshakeRepr) {
        let (me, n, job) = (self.me, self.n, self.job);
        let verdict = {
            let Some(c) = self.conns.get_mut(&conn.0) else {
                return;
            };
            let Some(inc) = c.incoming.as_mut() else {
                return;
            };
            let v = inc.on_handshake(repr, job, me, n);
            if let Ok(peer) = v {
                c.peer = Some(peer);
                c.incoming = None;
                self.direct_stale = true;
            }
            v
        };
        let peer = match verdict {
            Err(reason) => return self.reject(conn, &reason),
            Ok(peer) => peer,
        };
        match self.peers[peer as usize].ep.on_incoming(conn, repr) {
            IncomingDecision::Accept {
                conn,
                reply,
                close_ours,
            } => {
                if let Some(o) = close_ours {
                    self.drop_conn(o);
                }
                self.queue_bytes(conn, reply.to_bytes().to_vec());
                self.apply(peer, Action::FlushQueue { conn });
            }
            IncomingDecision::Refuse { conn, reason } => {
                if matches!(
                    reason,
                    RejectReason::TieBreak { .. } | RejectReason::AlreadyConnected
                ) {
                    // The normal end of a simultaneous connect: the
                    // connection started by the lower rank wins and the
                    // other one is dropped quietly. (A stranger repeating a
                    // valid identity looks the same, and is dropped too.)
                    log::debug!("tcp: second connection from {peer} dropped: {reason}");
                    self.drop_conn(conn);
                } else {
                    self.reject(conn, &format_args!("it claims to be rank {peer}: {reason}"));
                }
            }
        }
    }

    pub(super) fn timers(&mut self) {
        let now = self.now_ms();
        let expired: Vec<u32> = self
            .conns
            .iter_mut()
            .filter_map(|(&id, c)| {
                let inc = c.incoming.as_mut()?;
                inc.on_timer(now).then_some(id)
            })
            .collect();
        for id in expired {
            self.reject(ConnId(id), &"no handshake within the handshake timeout");
        }
        for peer in 0..self.n {
            let ep = &mut self.peers[peer as usize].ep;
            if ep.deadline().is_some_and(|d| now >= d) {
                let a = ep.on_timer(now);
                self.apply(peer, a);
            }
        }
    }

    pub(super) fn on_writable(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return;
        };
        if c.connecting {
            c.connecting = false;
            self.direct_stale = true;
            let peer = c.peer.unwrap_or(0);
            let err = c.sock.take_error().ok().flatten();
            if let Some(e) = err {
                log::debug!("tcp: connect to {peer} failed: {e}");
                let now = self.now_ms();
                let a = self.peers[peer as usize].ep.on_connect_failed(conn, now);
                self.drop_conn(conn);
                self.apply(peer, a);
                return;
            }
            let now = self.now_ms();
            let a = self.peers[peer as usize].ep.on_connected(conn, now);
            self.apply(peer, a);
        }
        self.flush_conn(conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    pub(super) fn listener_skips_ports_in_use() {
        let cfg = Config::from(&TcpParams::default());
        let a = listen_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).unwrap();
        let pa = a.local_addr().unwrap().as_socket().unwrap().port();
        let cfg2 = Config {
            port_min: pa,
            port_range: 50,
            ..cfg
        };
        let b = listen_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg2).unwrap();
        let pb = b.local_addr().unwrap().as_socket().unwrap().port();
        assert!(pb > pa && pb < pa + 50);
        let cfg3 = Config {
            port_min: pa,
            port_range: 1,
            ..cfg
        };
        assert!(matches!(
            listen_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg3),
            Err(TcpError::NoPort { .. })
        ));
    }
}
