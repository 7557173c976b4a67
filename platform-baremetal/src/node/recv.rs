//! The receive path: bytes from a socket into its decoder (or straight
//! into the peer's message buffer), frames out of the decoder, dispatched
//! by type — messages (whole, or assembled from chunks) to the caller,
//! barrier arrivals counted, FIN and RMA frames to their handlers — and the
//! end of a stream told apart as FIN, EOF or reset.

use btl_core::barrier::BarrierRepr;
use btl_core::tcp::decoder::Event as DecEvent;
use btl_core::tcp::endpoint::ConnId;
use btl_core::tcp::wire::{
    FrameRepr, FrameType, WireError, CHUNK_HEADER_LEN, MAX_USER_TAG, TAG_BARRIER, TAG_CHUNK,
};
use btl_core::{debug, warn};
use smoltcp::socket::tcp;

use super::peer::Chunk;
use super::pool::Role;
use super::{Event, Node};

impl<'a, const S: usize, const P: usize> Node<'a, S, P> {
    /// Whom slot `i` reads for: `Some(Some(peer))` for an identified
    /// connection, `Some(None)` for an incoming one not identified yet;
    /// `None` when the slot takes no input now (no connection, or an RMA
    /// answer to its peer waits for room: no more input meanwhile).
    fn reading_for(&self, i: usize) -> Option<Option<u32>> {
        let peer = match self.slots[i].role {
            Role::Conn(p) => Some(p),
            Role::Incoming(_) => None,
            _ => return None,
        };
        if peer.is_some_and(|p| self.peers[p as usize].reply.is_some()) {
            return None;
        }
        Some(peer)
    }

    /// Reads what slot `i`'s socket has, decoding as it goes; then notices
    /// EOF or a reset.
    pub(super) fn read(&mut self, i: usize, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
        let mut n = self.decode(i, on_event);
        for _ in 0..64 {
            let Some(peer) = self.reading_for(i) else {
                return n;
            };
            let s = &mut self.slots[i];
            let sock = self.sockets.get_mut::<tcp::Socket>(s.handle);
            if !sock.can_recv() {
                break;
            }
            let room = s.dec.direct_payload_room() as usize;
            let got = match (peer, s.cur) {
                (Some(p), Some(_)) if room > 0 => {
                    // Straight into the message buffer (the header was
                    // checked against its room).
                    let pr = &mut self.peers[p as usize];
                    let base = pr.chunk.map_or(0, |c| c.have) + s.fill;
                    let end = (base + room).min(pr.msg.len());
                    let got = sock.recv_slice(&mut pr.msg[base..end]).unwrap_or(0);
                    s.fill += got;
                    s.dec.payload_read_directly(got as u32);
                    got
                }
                _ => {
                    let got = sock.recv_slice(s.dec.spare()).unwrap_or(0);
                    s.dec.filled(got);
                    got
                }
            };
            if got == 0 {
                break;
            }
            n += self.decode(i, on_event);
        }
        // End of the stream?
        let Some(peer) = self.reading_for(i) else {
            return n;
        };
        let s = &self.slots[i];
        let sock = self.sockets.get::<tcp::Socket>(s.handle);
        let state = sock.state();
        let reset = state == tcp::State::Closed;
        let eof = !reset && !sock.may_recv() && sock.recv_queue() == 0;
        if !reset && !eof {
            return n;
        }
        let conn = s.id;
        let partial = s.dec.has_partial() || s.cur.is_some();
        match peer {
            None => {
                debug!("btl-baremetal: an unidentified connection closed");
                self.release(i, !reset);
            }
            Some(p) => {
                let a = if reset {
                    self.peers[p as usize].ep.on_error(conn)
                } else {
                    self.peers[p as usize].ep.on_eof(conn, partial)
                };
                self.apply(p, a);
                if self.slot_of(conn).is_some() {
                    self.release(i, !reset);
                }
            }
        }
        n + 1
    }

    /// Drains slot `i`'s decoder.
    fn decode(&mut self, i: usize, on_event: &mut dyn FnMut(Event<'_>)) -> usize {
        let mut n = 0;
        let max_frame = self.max_frame;
        loop {
            let s = &mut self.slots[i];
            let conn = s.id;
            let peer = match s.role {
                Role::Conn(p) => Some(p),
                Role::Incoming(_) => None,
                _ => return n,
            };
            if peer.is_some_and(|p| self.peers[p as usize].reply.is_some()) {
                return n;
            }
            let Some(ev) = s.dec.next_event(max_frame) else {
                return n;
            };
            n += 1;
            match (ev, peer) {
                (Err(e), Some(p)) => {
                    warn!("btl-baremetal: bad frame from {}: {}", p, e);
                    let a = self.peers[p as usize].ep.on_protocol_error(conn, e);
                    self.apply(p, a);
                    return n;
                }
                (Err(e), None) => {
                    warn!("btl-baremetal: dropped a connection: {}", e);
                    self.stats.rejected += 1;
                    self.release(i, false);
                    return n;
                }
                (Ok(DecEvent::Handshake(repr)), None) => {
                    self.incoming_handshake(i, repr);
                }
                (Ok(DecEvent::Handshake(repr)), Some(p)) => {
                    let a = self.peers[p as usize].ep.on_handshake(conn, repr);
                    self.apply(p, a);
                }
                (Ok(DecEvent::Header(h)), Some(p)) => {
                    let pr = &self.peers[p as usize];
                    let base = pr.chunk.map_or(0, |c| c.have);
                    let room = pr.msg.len() - base;
                    if h.len as usize > room {
                        let e = WireError::FrameTooLarge {
                            len: h.len,
                            max: room as u32,
                        };
                        warn!("btl-baremetal: frame from {} too large: {}", p, e);
                        let a = self.peers[p as usize].ep.on_protocol_error(conn, e);
                        self.apply(p, a);
                        return n;
                    }
                    s.cur = Some(h);
                    s.fill = 0;
                }
                (Ok(DecEvent::Payload(bytes)), Some(p)) => {
                    let pr = &mut self.peers[p as usize];
                    let at = pr.chunk.map_or(0, |c| c.have) + s.fill;
                    // In bounds: the header was checked against the room.
                    if let Some(dst) = pr.msg.get_mut(at..at + bytes.len()) {
                        dst.copy_from_slice(bytes);
                    }
                    s.fill += bytes.len();
                }
                (Ok(DecEvent::FrameEnd), Some(p)) => {
                    let h = s.cur.take();
                    let len = core::mem::take(&mut s.fill);
                    if let Some(h) = h {
                        self.on_frame(conn, p, h, len, on_event);
                    }
                }
                // Frames before the handshake: the decoder cannot produce
                // them (it expects the handshake first).
                (Ok(_), None) => {}
            }
        }
    }

    /// The payload of `peer`'s frame at hand: `len` bytes at `base` of its
    /// assembly buffer.
    pub(super) fn payload(&self, peer: u32, base: usize, len: usize) -> &[u8] {
        &self.peers[peer as usize].msg[base..base + len]
    }

    /// A whole frame from `peer`: its payload is `msg[base..base + len]`.
    fn on_frame(
        &mut self,
        conn: ConnId,
        peer: u32,
        h: FrameRepr,
        len: usize,
        on_event: &mut dyn FnMut(Event<'_>),
    ) {
        let pi = peer as usize;
        let base = self.peers[pi].chunk.map_or(0, |c| c.have);
        match h.kind {
            FrameType::Send if h.tag == TAG_CHUNK => self.on_chunk(conn, peer, len, on_event),
            FrameType::Send if h.tag == TAG_BARRIER => {
                match BarrierRepr::parse_bytes(self.payload(peer, base, len)) {
                    Ok(BarrierRepr::Arrived { epoch }) => self.barrier_arrived(peer, epoch),
                    // We see failures ourselves, and go on without them.
                    Ok(BarrierRepr::Abandoned { epoch, failed }) => warn!(
                        "btl-baremetal: rank {} gave barrier {} up: rank {} failed",
                        peer, epoch, failed
                    ),
                    Err(e) => warn!("btl-baremetal: from {}: {}; dropped", peer, e),
                }
            }
            FrameType::Send if h.tag <= MAX_USER_TAG => {
                self.stats.messages += 1;
                on_event(Event::Message {
                    from: peer,
                    tag: h.tag,
                    data: self.payload(peer, base, len),
                });
            }
            FrameType::Send => {
                warn!(
                    "btl-baremetal: message from {} with unknown internal tag {}",
                    peer, h.tag
                );
            }
            FrameType::Fin => {
                let a = self.peers[pi].ep.on_fin(conn);
                self.apply(peer, a);
            }
            FrameType::Put | FrameType::Get => self.serve_rma(peer, h, base, len),
            FrameType::GetResp | FrameType::PutAck => {
                self.on_rma_answer(peer, h, base, len, on_event)
            }
        }
    }

    /// A chunk of a large message (`len` bytes at the assembly point).
    fn on_chunk(
        &mut self,
        conn: ConnId,
        peer: u32,
        len: usize,
        on_event: &mut dyn FnMut(Event<'_>),
    ) {
        let pi = peer as usize;
        let cap = self.peers[pi].msg.len();
        let p = &mut self.peers[pi];
        let fail = match p.chunk {
            None => {
                // The first chunk: header, then data (moved to the front).
                if len < CHUNK_HEADER_LEN {
                    Some(WireError::Truncated {
                        needed: CHUNK_HEADER_LEN,
                        got: len,
                    })
                } else {
                    let tag = p.msg[0];
                    let mut t = [0u8; 8];
                    t.copy_from_slice(&p.msg[8..16]);
                    let total = u64::from_le_bytes(t);
                    let data = len - CHUNK_HEADER_LEN;
                    if tag > MAX_USER_TAG {
                        Some(WireError::BadType { found: tag })
                    } else if total > cap as u64 || (data as u64) > total {
                        Some(WireError::FrameTooLarge {
                            len: u32::try_from(total).unwrap_or(u32::MAX),
                            max: cap as u32,
                        })
                    } else {
                        p.msg.copy_within(CHUNK_HEADER_LEN..len, 0);
                        p.chunk = Some(Chunk {
                            tag,
                            total: total as usize,
                            have: data,
                        });
                        None
                    }
                }
            }
            Some(mut c) => {
                if c.have + len > c.total {
                    Some(WireError::FrameTooLarge {
                        len: (c.have + len) as u32,
                        max: c.total as u32,
                    })
                } else {
                    c.have += len;
                    p.chunk = Some(c);
                    None
                }
            }
        };
        if let Some(e) = fail {
            warn!("btl-baremetal: bad chunked message from {}: {}", peer, e);
            let a = self.peers[pi].ep.on_protocol_error(conn, e);
            self.apply(peer, a);
            return;
        }
        let p = &mut self.peers[pi];
        if let Some(c) = p.chunk.filter(|c| c.have == c.total) {
            p.chunk = None;
            self.stats.messages += 1;
            on_event(Event::Message {
                from: peer,
                tag: c.tag,
                data: &self.peers[pi].msg[..c.total],
            });
        }
    }
}
