//! The shared-memory transport's own messages: the payloads of its
//! internal tags ([`crate::tags`]), carried in fragments or fast boxes like
//! user messages. This module only parses and emits bytes.
//!
//! Every integer is **little endian**, as everywhere in btl.
//!
//! ```text
//! SM_RNDV: single-copy rendezvous (17 bytes)
//!  0     1              9              17
//! [tag ][ addr (u64)   ][ len (u64)   ]
//!  user  sender's address of the message, its length
//!
//! SM_RNDV_SPLIT: split rendezvous (33 bytes)
//!  0             17            25            33
//! [ SM_RNDV's 17 ][ at (u64)   ][ seq (u64)  ]
//!                  where the sender's part starts (<= len), the sequence
//!                  number its flag write carries
//!
//! SM_LANDING: a receiver's landing buffer (16 bytes)
//!  0              8              16
//! [ addr (u64)   ][ cap (u64)   ]
//!  flag word there, data from addr + LANDING_DATA_OFF, cap bytes of it
//!
//! CHUNK: header of a pipelined chunk (32 bytes, then data)
//!  0     1              9              17                 32
//! [tag ][ total (u64)  ][ offset (u64) ][ reserved (0)     ]
//!  user  message length, this chunk's offset (<= total)
//!
//! SM_GET_REQ, SM_PUT_CMA, SM_PUT_DATA: a range request (36 bytes)
//!  0             8          12             20            28            36
//! [ req (u64)   ][ id u32  ][ offset (u64) ][ len (u64)  ][ addr (u64) ]
//!   GET_REQ:  addr is the mode (GET_BY_FRAGMENTS, GET_BY_SINGLE_COPY,
//!             GET_SPLIT); a split get adds a 24-byte split tail:
//!  36            44            52               60
//! [ at (u64)    ][ dst (u64)  ][ deadline (u64) ]
//!   PUT_CMA:  addr is the requester's source address
//!   PUT_DATA: len is the put's total length, addr this chunk's offset in
//!             it; the chunk's data follows
//!
//! SM_RMA_REPLY: the answer to a get or put (20 bytes)
//!  0             8             12            20
//! [ req (u64)   ][ status u32 ][ addr (u64) ]
//!                  RmaStatus code; the address to read, or (a split get's
//!                  second answer) the bytes written
//!
//! SM_GET_DATA: header of a get's data chunk (32 bytes, then data)
//!  0             8               16                   32
//! [ req (u64)   ][ offset (u64) ][ reserved (0)       ]
//! ```
//!
//! The two 32-byte headers are padded so that, after the fragment's own
//! 32-byte header, the data starts on a cache line of the (cache-line
//! aligned) fragment: copies whose source and destination are misaligned
//! against each other are slower.
//!
//! Views (`*Packet`) wrap any `T: AsRef<[u8]>`; once `new_checked` (or
//! `check_len`) succeeded, no accessor can panic. A view of a header may
//! hold data after it ([`ChunkPacket::data`]); a view of a whole message
//! (rendezvous, landing buffer, get request, single-copy put, answer)
//! covers exactly it, and its parser refuses any other length. Representations
//! (`*Repr`) validate every field a peer controls that this layer can judge
//! (tags, lengths against a limit, offsets within their length, address
//! ranges that must not wrap, reserved bytes, status codes) in `parse` and
//! write them back with `emit`. What needs the receiver's state (a region
//! id and range, a request id, the order of chunks) is the adapter's to
//! check. All malformed input is a typed [`WireError`], never a panic.

use crate::rma::RmaStatus;
use crate::wire_view::Field;

/// Largest user tag (chunked and rendezvous messages carry user messages
/// only).
pub const MAX_USER_TAG: u8 = crate::tags::MAX_USER_TAG;

/// Length of a single-copy rendezvous header.
pub const RNDV_LEN: usize = field::RNDV_LEN.end;
/// Length of a split rendezvous header.
pub const RNDV_SPLIT_LEN: usize = field::SPLIT_SEQ.end;
/// Length of a landing buffer advertisement.
pub const LANDING_AD_LEN: usize = field::AD_CAP.end;
/// Where a landing buffer's data starts after its address (the flag word
/// is at the address itself): a page.
pub const LANDING_DATA_OFF: usize = 4096;
/// Length of a pipelined chunk's header.
pub const CHUNK_HEADER_LEN: usize = field::CH_RESERVED.end;
/// Length of a range request (and of a put data chunk's header).
pub const RANGE_REQ_LEN: usize = field::RQ_ADDR.end;
/// Length of a split get's tail.
pub const SPLIT_TAIL_LEN: usize = field::TAIL_DEADLINE.end;
/// Length of a split get's request: the range request, then its tail.
pub const GET_REQ_SPLIT_LEN: usize = RANGE_REQ_LEN + SPLIT_TAIL_LEN;
/// Length of an answer to a get or put.
pub const REPLY_LEN: usize = field::RE_ADDR.end;
/// Length of a get data chunk's header.
pub const GET_DATA_HEADER_LEN: usize = field::GD_RESERVED.end;

/// The `addr` of a get request asking for the data in fragments.
pub const GET_BY_FRAGMENTS: u64 = 0;
/// The `addr` of a get request asking for the answer to carry the address
/// of the range (the requester reads it by single copy).
pub const GET_BY_SINGLE_COPY: u64 = 1;
/// The `addr` of a get request asking for a split single copy: the
/// request carries a split tail.
pub const GET_SPLIT: u64 = 2;

mod field {
    use super::Field;

    // Single-copy rendezvous; a split one continues it.
    pub(super) const RNDV_TAG: Field = 0..1;
    pub(super) const RNDV_ADDR: Field = 1..9;
    pub(super) const RNDV_LEN: Field = 9..17;
    pub(super) const SPLIT_AT: Field = 17..25;
    pub(super) const SPLIT_SEQ: Field = 25..33;

    // Landing buffer advertisement.
    pub(super) const AD_ADDR: Field = 0..8;
    pub(super) const AD_CAP: Field = 8..16;

    // Pipelined chunk header.
    pub(super) const CH_TAG: Field = 0..1;
    pub(super) const CH_TOTAL: Field = 1..9;
    pub(super) const CH_OFFSET: Field = 9..17;
    pub(super) const CH_RESERVED: Field = 17..32;

    // Range request.
    pub(super) const RQ_REQ: Field = 0..8;
    pub(super) const RQ_ID: Field = 8..12;
    pub(super) const RQ_OFFSET: Field = 12..20;
    pub(super) const RQ_LEN: Field = 20..28;
    pub(super) const RQ_ADDR: Field = 28..36;

    // Split get tail (after a range request).
    pub(super) const TAIL_AT: Field = 0..8;
    pub(super) const TAIL_DST: Field = 8..16;
    pub(super) const TAIL_DEADLINE: Field = 16..24;

    // Answer.
    pub(super) const RE_REQ: Field = 0..8;
    pub(super) const RE_STATUS: Field = 8..12;
    pub(super) const RE_ADDR: Field = 12..20;

    // Get data chunk header.
    pub(super) const GD_REQ: Field = 0..8;
    pub(super) const GD_OFFSET: Field = 8..16;
    pub(super) const GD_RESERVED: Field = 16..32;
}

/// Why a message a peer wrote was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum WireError {
    /// A tag above [`MAX_USER_TAG`] where only user messages travel.
    #[error("tag {found}, not a user tag (0..={MAX_USER_TAG})")]
    BadTag {
        /// The tag received.
        found: u8,
    },
    /// Fewer bytes than the format has.
    #[error("truncated: {got} bytes, {needed} needed")]
    Truncated {
        /// The format's length.
        needed: usize,
        /// The bytes there were.
        got: usize,
    },
    /// A message whose length is not its format's.
    #[error("{len} bytes, not {expected}")]
    BadLength {
        /// The message's length.
        len: usize,
        /// The length its format has.
        expected: usize,
    },
    /// A length above the receiver's limit.
    #[error("length {len}, limit is {max}")]
    TooLong {
        /// The length received.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A reserved byte is not zero.
    #[error("reserved byte {at} is not zero")]
    ReservedNotZero {
        /// Its offset in the format.
        at: usize,
    },
    /// An offset past the length it lies within.
    #[error("offset {at} past length {len}")]
    OutOfRange {
        /// The offset received.
        at: u64,
        /// The length it must not exceed.
        len: u64,
    },
    /// An address range that wraps around the address space.
    #[error("address range {addr:#x}+{len} wraps around")]
    Overflow {
        /// The start address received.
        addr: u64,
        /// The range's length.
        len: u64,
    },
    /// An answer's status code is not an [`RmaStatus`].
    #[error("unknown status code {found}")]
    BadStatus {
        /// The code received.
        found: u32,
    },
    /// A get request's mode is not one of [`GET_BY_FRAGMENTS`],
    /// [`GET_BY_SINGLE_COPY`] and [`GET_SPLIT`].
    #[error("unknown get mode {found}")]
    BadGetMode {
        /// The mode received.
        found: u64,
    },
}

/// A read/write view (`wire_view!`, and `data`, the bytes after the
/// format): the type, its length constant, its fields (name, getter,
/// setter, type, range) and optionally its reserved bytes. With
/// `=> Repr`, also the plain `Repr` of the same fields (their validation,
/// `parse`, is written by hand), its `emit` (reserved bytes zero),
/// `buffer_len` and `to_bytes`, and `Repr::raw`, the fields as the bytes
/// have them.
macro_rules! view {
    (
        $(#[$doc:meta])*
        $name:ident, $len:ident => $(#[$rdoc:meta])* $repr:ident {
            $( $(#[$fdoc:meta])* $fname:ident ($get:ident, $set:ident): $ty:ty = $field:expr; )*
        }
        $( reserved $res:expr; )?
    ) => {
        view! {
            $(#[$doc])*
            $name, $len {
                $( $(#[$fdoc])* $fname ($get, $set): $ty = $field; )*
            }
            $( reserved $res; )?
        }

        $(#[$rdoc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        pub struct $repr {
            $( $(#[$fdoc])* pub $fname: $ty, )*
        }

        impl $repr {
            /// The fields as the bytes have them, not validated.
            fn raw<T: AsRef<[u8]> + ?Sized>(packet: &$name<&T>) -> Self {
                Self { $( $fname: packet.$get(), )* }
            }

            /// Writes the format (reserved bytes zero).
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut $name<&mut T>) {
                $( packet.$set(self.$fname); )*
                $( packet.buffer.as_mut()[$res].fill(0); )?
            }
        }

        fixed_len! { $repr: $name, $len; }
    };
    (
        $(#[$doc:meta])*
        $name:ident, $len:ident {
            $( $(#[$fdoc:meta])* $fname:ident ($get:ident, $set:ident): $ty:ty = $field:expr; )*
        }
        $( reserved $res:expr; )?
    ) => {
        wire_view! {
            $(#[$doc])*
            $name, $len, WireError {
                $( $(#[$fdoc])* ($get, $set): $ty = $field; )*
            }
            $( reserved $res; )?
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// The bytes after the format (a chunk's data, a split get's
            /// tail; empty for a message of exactly the format's length).
            pub fn data(&self) -> &[u8] {
                &self.buffer.as_ref()[$len..]
            }
        }
    };
}

/// A message format without data after it: the view covers exactly the
/// message (`check_len` saw it is not shorter).
fn whole(extra: &[u8], expected: usize) -> Result<(), WireError> {
    if !extra.is_empty() {
        return Err(WireError::BadLength {
            len: expected + extra.len(),
            expected,
        });
    }
    Ok(())
}

fixed_len! {
    RndvSplitRepr: RndvSplitPacket, RNDV_SPLIT_LEN;
    PutCmaRepr: RangeReqPacket, RANGE_REQ_LEN;
    PutDataRepr: RangeReqPacket, RANGE_REQ_LEN;
    ReplyRepr: ReplyPacket, REPLY_LEN;
}

fn user_tag(tag: u8) -> Result<u8, WireError> {
    if tag > MAX_USER_TAG {
        return Err(WireError::BadTag { found: tag });
    }
    Ok(tag)
}

fn at_most(len: u64, max: u64) -> Result<u64, WireError> {
    if len > max {
        return Err(WireError::TooLong { len, max });
    }
    Ok(len)
}

fn within(at: u64, len: u64) -> Result<u64, WireError> {
    if at > len {
        return Err(WireError::OutOfRange { at, len });
    }
    Ok(at)
}

fn no_wrap(addr: u64, len: u64) -> Result<u64, WireError> {
    if addr.checked_add(len).is_none() {
        return Err(WireError::Overflow { addr, len });
    }
    Ok(addr)
}

fn no_reserved(at: Option<usize>) -> Result<(), WireError> {
    match at {
        Some(at) => Err(WireError::ReservedNotZero { at }),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// Single-copy rendezvous (SM_RNDV) and its split form (SM_RNDV_SPLIT).

view! {
    /// A read/write view of a single-copy rendezvous header.
    RndvPacket, RNDV_LEN =>
    /// A validated single-copy rendezvous: the receiver reads `len` bytes
    /// at `addr` of the sender's memory and delivers them with `tag`.
    RndvRepr {
        /// The message's (user) tag.
        tag (tag, set_tag): u8 = field::RNDV_TAG;
        /// The sender's address of the message.
        addr (addr, set_addr): u64 = field::RNDV_ADDR;
        /// The message's length.
        len (msg_len, set_msg_len): u64 = field::RNDV_LEN;
    }
}

impl RndvRepr {
    /// Parses a header (the view covers exactly the message): the tag must
    /// be a user tag, the length at most `max` (the receiver's message
    /// limit), and the range must not wrap.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &RndvPacket<&T>,
        max: u64,
    ) -> Result<Self, WireError> {
        packet.check_len()?;
        whole(packet.data(), RNDV_LEN)?;
        let r = Self::raw(packet);
        user_tag(r.tag)?;
        at_most(r.len, max)?;
        no_wrap(r.addr, r.len)?;
        Ok(r)
    }
}

view! {
    /// A read/write view of a split rendezvous header: a single-copy
    /// rendezvous header ([`Self::rndv`]), then `at` and `seq`.
    RndvSplitPacket, RNDV_SPLIT_LEN {
        /// Where the sender's part starts in the message.
        at (at, set_at): u64 = field::SPLIT_AT;
        /// The sequence number the sender's flag write carries.
        seq (seq, set_seq): u64 = field::SPLIT_SEQ;
    }
}

impl<T: AsRef<[u8]>> RndvSplitPacket<T> {
    /// The rendezvous header the split one starts with.
    pub fn rndv(&self) -> RndvPacket<&[u8]> {
        RndvPacket::new_unchecked(&self.buffer.as_ref()[..RNDV_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RndvSplitPacket<T> {
    /// The rendezvous header the split one starts with, for writing.
    pub fn rndv_mut(&mut self) -> RndvPacket<&mut [u8]> {
        RndvPacket::new_unchecked(&mut self.buffer.as_mut()[..RNDV_LEN])
    }
}

/// A validated split rendezvous: the receiver reads `rndv`'s bytes before
/// `at`, the sender writes the rest into the receiver's landing buffer and
/// then `seq` into its flag word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RndvSplitRepr {
    /// The message, as a single-copy rendezvous names it.
    pub rndv: RndvRepr,
    /// Where the sender's part starts (at most the length).
    pub at: u64,
    /// The sequence number of the sender's flag write.
    pub seq: u64,
}

impl RndvSplitRepr {
    /// Parses a header (the view covers exactly the message): the
    /// rendezvous as [`RndvRepr::parse`] (with `max`, the landing buffer's
    /// capacity), `at` within its length.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &RndvSplitPacket<&T>,
        max: u64,
    ) -> Result<Self, WireError> {
        packet.check_len()?;
        whole(packet.data(), RNDV_SPLIT_LEN)?;
        let rndv = RndvRepr::parse(&packet.rndv(), max)?;
        Ok(Self {
            rndv,
            at: within(packet.at(), rndv.len)?,
            seq: packet.seq(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut RndvSplitPacket<&mut T>,
    ) {
        self.rndv.emit(&mut packet.rndv_mut());
        packet.set_at(self.at);
        packet.set_seq(self.seq);
    }
}

// ---------------------------------------------------------------------------
// Landing buffer advertisement (SM_LANDING).

view! {
    /// A read/write view of a landing buffer advertisement.
    LandingAdPacket, LANDING_AD_LEN =>
    /// A validated landing buffer, as its sender knows it: the flag word at
    /// `addr`, `cap` bytes of data from `addr +` [`LANDING_DATA_OFF`].
    LandingAdRepr {
        /// The landing buffer's address (its flag word).
        addr (addr, set_addr): u64 = field::AD_ADDR;
        /// Its data capacity.
        cap (cap, set_cap): u64 = field::AD_CAP;
    }
}

impl LandingAdRepr {
    /// Parses an advertisement (the view covers exactly the message): the
    /// buffer (flag, gap and data) must not wrap around the address space.
    /// Whether the sender may write there is for the kernel to say.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &LandingAdPacket<&T>) -> Result<Self, WireError> {
        packet.check_len()?;
        whole(packet.data(), LANDING_AD_LEN)?;
        let r = Self::raw(packet);
        // The data area starts LANDING_DATA_OFF after the flag; neither
        // that start nor the area's end may wrap.
        let data = no_wrap(r.addr, LANDING_DATA_OFF as u64)? + LANDING_DATA_OFF as u64;
        no_wrap(data, r.cap)?;
        Ok(r)
    }

    /// The address of data byte `off`.
    pub fn data_addr(&self, off: u64) -> Option<u64> {
        self.addr
            .checked_add(LANDING_DATA_OFF as u64)?
            .checked_add(off)
    }
}

// ---------------------------------------------------------------------------
// Pipelined chunk header (CHUNK).

view! {
    /// A read/write view of a pipelined chunk: the header, then
    /// ([`Self::data`]) the chunk's data.
    ChunkPacket, CHUNK_HEADER_LEN =>
    /// A validated chunk header. Chunks of one message arrive in order
    /// (per-peer order), so `offset` is a check, not a reordering key: the
    /// receiver's reassembly compares it, and the data's length, with what
    /// it has.
    ChunkRepr {
        /// The message's (user) tag.
        tag (tag, set_tag): u8 = field::CH_TAG;
        /// The message's length.
        total (total, set_total): u64 = field::CH_TOTAL;
        /// This chunk's offset in the message (at most `total`).
        offset (offset, set_offset): u64 = field::CH_OFFSET;
    }
    reserved field::CH_RESERVED;
}

impl ChunkRepr {
    /// Parses a header: a user tag, `total` at most `max` (the receiver's
    /// message limit), `offset` within it, the reserved bytes zero.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &ChunkPacket<&T>,
        max: u64,
    ) -> Result<Self, WireError> {
        packet.check_len()?;
        no_reserved(packet.nonzero_reserved())?;
        let r = Self::raw(packet);
        at_most(r.total, max)?;
        user_tag(r.tag)?;
        within(r.offset, r.total)?;
        Ok(r)
    }
}

// ---------------------------------------------------------------------------
// Range requests (SM_GET_REQ, SM_PUT_CMA, SM_PUT_DATA) and a split get's
// tail.

view! {
    /// A read/write view of a range request: a get request (a split one's
    /// tail in [`Self::data`]), a single-copy put, or a put data chunk's
    /// header (its data in [`Self::data`]).
    RangeReqPacket, RANGE_REQ_LEN {
        /// The requester's request id.
        req (req, set_req): u64 = field::RQ_REQ;
        /// The target's region id.
        id (id, set_id): u32 = field::RQ_ID;
        /// The offset in the region.
        offset (offset, set_offset): u64 = field::RQ_OFFSET;
        /// The range's length (a put chunk: the put's total length).
        range_len (range_len, set_range_len): u64 = field::RQ_LEN;
        /// The get's mode, the put's source address, or the put chunk's
        /// offset in the put.
        addr (addr, set_addr): u64 = field::RQ_ADDR;
    }
}

/// The five fields of a range request, in order.
type RangeFields = (u64, u32, u64, u64, u64);

impl<T: AsRef<[u8]>> RangeReqPacket<T> {
    fn fields(&self) -> Result<RangeFields, WireError> {
        self.check_len()?;
        Ok((
            self.req(),
            self.id(),
            self.offset(),
            self.range_len(),
            self.addr(),
        ))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RangeReqPacket<T> {
    fn set_fields(&mut self, (req, id, offset, len, addr): RangeFields) {
        self.set_req(req);
        self.set_id(id);
        self.set_offset(offset);
        self.set_range_len(len);
        self.set_addr(addr);
    }
}

view! {
    /// A read/write view of a split get's tail.
    SplitTailPacket, SPLIT_TAIL_LEN =>
    /// What a split get adds to its request: the target writes the range's
    /// bytes from `at` on to `dst` in the requester's memory, beginning
    /// each piece before `deadline`.
    SplitTailRepr {
        /// Where the part the target writes begins, in the range.
        at (at, set_at): u64 = field::TAIL_AT;
        /// The requester's address of that byte.
        dst (dst, set_dst): u64 = field::TAIL_DST;
        /// Until when (`CLOCK_MONOTONIC`, ns) the target may begin writing
        /// a piece.
        deadline (deadline, set_deadline): u64 = field::TAIL_DEADLINE;
    }
}

impl SplitTailRepr {
    /// Parses a tail; that it fits its request is
    /// [`GetReqRepr::parse`]'s to check.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &SplitTailPacket<&T>) -> Result<Self, WireError> {
        packet.check_len()?;
        Ok(Self::raw(packet))
    }
}

/// How a get's data travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GetMode {
    /// The target sends the data in fragments ([`GET_BY_FRAGMENTS`]).
    Fragments,
    /// The answer carries the range's address; the requester reads it
    /// ([`GET_BY_SINGLE_COPY`]).
    SingleCopy,
    /// As `SingleCopy`, and the target writes the tail ([`GET_SPLIT`]).
    Split(SplitTailRepr),
}

impl GetMode {
    /// The mode's value in the request's `addr` field.
    pub const fn code(&self) -> u64 {
        match self {
            Self::Fragments => GET_BY_FRAGMENTS,
            Self::SingleCopy => GET_BY_SINGLE_COPY,
            Self::Split(_) => GET_SPLIT,
        }
    }
}

/// A validated get request (`SM_GET_REQ`). Whether the region and range
/// exist is the target's to check (it answers with a status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct GetReqRepr {
    /// The requester's request id.
    pub req: u64,
    /// The target's region id.
    pub id: u32,
    /// The offset in the region.
    pub offset: u64,
    /// The range's length.
    pub len: u64,
    /// How the data travels.
    pub mode: GetMode,
}

impl GetReqRepr {
    /// Parses a get request; the view covers exactly the message:
    /// [`RANGE_REQ_LEN`] bytes, or [`GET_REQ_SPLIT_LEN`] for a split get,
    /// whose tail must start within the range and whose destination must
    /// not wrap around the address space.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RangeReqPacket<&T>) -> Result<Self, WireError> {
        let (req, id, offset, len, code) = packet.fields()?;
        let got = RANGE_REQ_LEN + packet.data().len();
        let expected = match code {
            GET_BY_FRAGMENTS | GET_BY_SINGLE_COPY => RANGE_REQ_LEN,
            GET_SPLIT => GET_REQ_SPLIT_LEN,
            found => return Err(WireError::BadGetMode { found }),
        };
        if got < expected {
            return Err(WireError::Truncated {
                needed: expected,
                got,
            });
        } else if got > expected {
            return Err(WireError::BadLength { len: got, expected });
        }
        let mode = match code {
            GET_BY_FRAGMENTS => GetMode::Fragments,
            GET_BY_SINGLE_COPY => GetMode::SingleCopy,
            _ => {
                let tail = SplitTailRepr::parse(&SplitTailPacket::new_checked(packet.data())?)?;
                let at = within(tail.at, len)?;
                no_wrap(tail.dst, len - at)?;
                GetMode::Split(tail)
            }
        };
        Ok(Self {
            req,
            id,
            offset,
            len,
            mode,
        })
    }

    /// Bytes [`Self::emit`] writes: [`RANGE_REQ_LEN`], or
    /// [`GET_REQ_SPLIT_LEN`] for a split get.
    pub const fn buffer_len(&self) -> usize {
        match self.mode {
            GetMode::Split(_) => GET_REQ_SPLIT_LEN,
            _ => RANGE_REQ_LEN,
        }
    }

    /// Writes the request (into a buffer of at least
    /// [`Self::buffer_len`] bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut RangeReqPacket<&mut T>) {
        packet.set_fields((self.req, self.id, self.offset, self.len, self.mode.code()));
        if let GetMode::Split(t) = self.mode {
            let tail = &mut packet.buffer.as_mut()[RANGE_REQ_LEN..GET_REQ_SPLIT_LEN];
            t.emit(&mut SplitTailPacket::new_unchecked(tail));
        }
    }
}

/// A validated single-copy put (`SM_PUT_CMA`): the target reads `len`
/// bytes at `src` of the requester's memory into `offset` of region `id`
/// (checked against its regions, answered with a status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PutCmaRepr {
    /// The requester's request id.
    pub req: u64,
    /// The target's region id.
    pub id: u32,
    /// The offset in the region.
    pub offset: u64,
    /// The range's length.
    pub len: u64,
    /// The requester's address of the data.
    pub src: u64,
}

impl PutCmaRepr {
    /// Parses a single-copy put (the view covers exactly the message): the
    /// source range must not wrap.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RangeReqPacket<&T>) -> Result<Self, WireError> {
        let (req, id, offset, len, src) = packet.fields()?;
        whole(packet.data(), RANGE_REQ_LEN)?;
        Ok(Self {
            req,
            id,
            offset,
            len,
            src: no_wrap(src, len)?,
        })
    }

    /// Writes the request.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut RangeReqPacket<&mut T>) {
        packet.set_fields((self.req, self.id, self.offset, self.len, self.src));
    }
}

/// A validated put data chunk's header (`SM_PUT_DATA`, then the data): the
/// put's request, region, offset and total length, and where this chunk
/// lies in it. Whether the chunk fits the put and the put the region is
/// the target's to check (it answers with a status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PutDataRepr {
    /// The requester's request id.
    pub req: u64,
    /// The target's region id.
    pub id: u32,
    /// The put's offset in the region.
    pub offset: u64,
    /// The put's total length.
    pub total: u64,
    /// This chunk's offset in the put.
    pub chunk_off: u64,
}

impl PutDataRepr {
    /// Parses a put data chunk's header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RangeReqPacket<&T>) -> Result<Self, WireError> {
        let (req, id, offset, total, chunk_off) = packet.fields()?;
        Ok(Self {
            req,
            id,
            offset,
            total,
            chunk_off,
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut RangeReqPacket<&mut T>) {
        let Self {
            req,
            id,
            offset,
            total,
            chunk_off,
        } = *self;
        packet.set_fields((req, id, offset, total, chunk_off));
    }
}

// ---------------------------------------------------------------------------
// Answer (SM_RMA_REPLY).

view! {
    /// A read/write view of an answer to a get or put.
    ReplyPacket, REPLY_LEN {
        /// The request answered.
        req (req, set_req): u64 = field::RE_REQ;
        /// The status code ([`RmaStatus::code`]).
        status (status, set_status): u32 = field::RE_STATUS;
        /// The address to read, or the bytes written.
        addr (addr, set_addr): u64 = field::RE_ADDR;
    }
}

/// A validated answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ReplyRepr {
    /// The request answered.
    pub req: u64,
    /// Its outcome.
    pub status: RmaStatus,
    /// A single-copy get's address to read; a split get's second answer:
    /// the bytes of the tail the target wrote; otherwise 0.
    pub addr: u64,
}

impl ReplyRepr {
    /// Parses an answer (the view covers exactly the message): the status
    /// code must be an [`RmaStatus`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ReplyPacket<&T>) -> Result<Self, WireError> {
        packet.check_len()?;
        whole(packet.data(), REPLY_LEN)?;
        let code = packet.status();
        let status = RmaStatus::from_code(code);
        if status.code() != code {
            return Err(WireError::BadStatus { found: code });
        }
        Ok(Self {
            req: packet.req(),
            status,
            addr: packet.addr(),
        })
    }

    /// Writes the answer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut ReplyPacket<&mut T>) {
        packet.set_req(self.req);
        packet.set_status(self.status.code());
        packet.set_addr(self.addr);
    }
}

// ---------------------------------------------------------------------------
// Get data chunk header (SM_GET_DATA).

view! {
    /// A read/write view of a get data chunk: the header, then
    /// ([`Self::data`]) the data.
    GetDataPacket, GET_DATA_HEADER_LEN =>
    /// A validated get data chunk's header. Whether the chunk lies inside
    /// the get is the requester's to check.
    GetDataRepr {
        /// The get's request id.
        req (req, set_req): u64 = field::GD_REQ;
        /// This chunk's offset in the get's range.
        offset (offset, set_offset): u64 = field::GD_OFFSET;
    }
    reserved field::GD_RESERVED;
}

impl GetDataRepr {
    /// Parses a header: the reserved bytes must be zero.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &GetDataPacket<&T>) -> Result<Self, WireError> {
        packet.check_len()?;
        no_reserved(packet.nonzero_reserved())?;
        Ok(Self::raw(packet))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Little-endian bytes of `v`, for fixtures.
    const fn b8(v: u64) -> [u8; 8] {
        v.to_le_bytes()
    }

    fn cat<const N: usize>(parts: &[&[u8]]) -> [u8; N] {
        let mut out = [0u8; N];
        let mut at = 0;
        for p in parts {
            out[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        assert_eq!(at, N);
        out
    }

    const MAX: u64 = 1 << 30;

    fn rndv_fixture() -> [u8; RNDV_LEN] {
        // tag 3, addr 0x7fff_1234_5000, len 0x0102_0304.
        cat(&[&[3], &b8(0x7fff_1234_5000), &b8(0x0102_0304)])
    }

    /// `fn name(bytes[, max]) -> Result<Repr, WireError>`: the view, then
    /// the `Repr`'s parse.
    macro_rules! parsers {
        ($($name:ident: $repr:ident($packet:ident $(, $max:ident)?);)*) => {$(
            fn $name(b: &[u8] $(, $max: u64)?) -> Result<$repr, WireError> {
                $repr::parse(&$packet::new_checked(b)? $(, $max)?)
            }
        )*};
    }

    parsers! {
        parse_rndv: RndvRepr(RndvPacket, max);
        parse_split: RndvSplitRepr(RndvSplitPacket, max);
        parse_ad: LandingAdRepr(LandingAdPacket);
        parse_chunk: ChunkRepr(ChunkPacket, max);
        parse_get: GetReqRepr(RangeReqPacket);
        parse_put_cma: PutCmaRepr(RangeReqPacket);
        parse_put_data: PutDataRepr(RangeReqPacket);
        parse_reply: ReplyRepr(ReplyPacket);
        parse_get_data: GetDataRepr(GetDataPacket);
    }

    /// Every prefix shorter than `len` is refused as truncated.
    fn truncations<R: core::fmt::Debug>(
        bytes: &[u8],
        len: usize,
        parse: impl Fn(&[u8]) -> Result<R, WireError>,
    ) {
        for n in 0..len {
            let e = parse(&bytes[..n]).unwrap_err();
            assert!(
                matches!(e, WireError::Truncated { got, .. } if got == n),
                "{n}: {e:?}"
            );
        }
    }

    /// A whole message with a byte more is refused.
    fn longer<R: core::fmt::Debug>(bytes: &[u8], parse: impl Fn(&[u8]) -> Result<R, WireError>) {
        let mut b = [0u8; 64];
        b[..bytes.len()].copy_from_slice(bytes);
        let len = bytes.len() + 1;
        assert_eq!(
            parse(&b[..len]).unwrap_err(),
            WireError::BadLength {
                len,
                expected: bytes.len()
            }
        );
    }

    #[test]
    fn rndv_fixture_roundtrips() {
        let b = rndv_fixture();
        let r = parse_rndv(&b, MAX).unwrap();
        assert_eq!(
            r,
            RndvRepr {
                tag: 3,
                addr: 0x7fff_1234_5000,
                len: 0x0102_0304
            }
        );
        assert_eq!(r.to_bytes(), b);
        assert_eq!(r.buffer_len(), RNDV_LEN);
        truncations(&b, RNDV_LEN, |b| parse_rndv(b, MAX));
        longer(&b, |b| parse_rndv(b, MAX));
    }

    #[test]
    fn rndv_bad_fields() {
        let r = RndvRepr {
            tag: MAX_USER_TAG,
            addr: 0,
            len: MAX,
        };
        assert_eq!(parse_rndv(&r.to_bytes(), MAX), Ok(r));
        for tag in [MAX_USER_TAG + 1, crate::tags::SM_RNDV, u8::MAX] {
            let b = RndvRepr { tag, ..r }.to_bytes();
            assert_eq!(parse_rndv(&b, MAX), Err(WireError::BadTag { found: tag }));
        }
        assert_eq!(
            parse_rndv(&RndvRepr { len: MAX + 1, ..r }.to_bytes(), MAX),
            Err(WireError::TooLong {
                len: MAX + 1,
                max: MAX
            })
        );
        let wraps = RndvRepr {
            addr: u64::MAX - 4,
            len: 5,
            ..r
        };
        assert_eq!(
            parse_rndv(&wraps.to_bytes(), MAX),
            Err(WireError::Overflow {
                addr: u64::MAX - 4,
                len: 5
            })
        );
        assert!(parse_rndv(&RndvRepr { len: 4, ..wraps }.to_bytes(), MAX).is_ok());
    }

    #[test]
    fn rndv_split_fixture_roundtrips() {
        let b: [u8; RNDV_SPLIT_LEN] = cat(&[&rndv_fixture(), &b8(0x0100_0000), &b8(u64::MAX)]);
        let r = parse_split(&b, 64 << 20).unwrap();
        assert_eq!(r.rndv, parse_rndv(&rndv_fixture(), MAX).unwrap());
        assert_eq!((r.at, r.seq), (0x0100_0000, u64::MAX));
        assert_eq!(r.to_bytes(), b);
        assert_eq!(r.buffer_len(), RNDV_SPLIT_LEN);
        truncations(&b, RNDV_SPLIT_LEN, |b| parse_split(b, MAX));
        longer(&b, |b| parse_split(b, MAX));
        // The rendezvous's rules, with the landing capacity as the limit.
        assert!(matches!(
            parse_split(&b, 0x0102_0303),
            Err(WireError::TooLong { .. })
        ));
        let mut bad = b;
        bad[0] = MAX_USER_TAG + 1;
        assert!(matches!(
            parse_split(&bad, MAX),
            Err(WireError::BadTag { .. })
        ));
        // `at` up to the length, not past it.
        let end = RndvSplitRepr {
            at: r.rndv.len,
            ..r
        };
        assert_eq!(parse_split(&end.to_bytes(), MAX), Ok(end));
        let past = RndvSplitRepr {
            at: r.rndv.len + 1,
            ..r
        };
        assert_eq!(
            parse_split(&past.to_bytes(), MAX),
            Err(WireError::OutOfRange {
                at: r.rndv.len + 1,
                len: r.rndv.len
            })
        );
    }

    #[test]
    fn landing_ad_fixture_roundtrips() {
        let b: [u8; LANDING_AD_LEN] = cat(&[&b8(0x7f00_0000_0000), &b8(64 << 20)]);
        let a = parse_ad(&b).unwrap();
        assert_eq!(
            a,
            LandingAdRepr {
                addr: 0x7f00_0000_0000,
                cap: 64 << 20
            }
        );
        assert_eq!(a.to_bytes(), b);
        assert_eq!(a.buffer_len(), LANDING_AD_LEN);
        assert_eq!(a.data_addr(5), Some(0x7f00_0000_0000 + 4096 + 5));
        truncations(&b, LANDING_AD_LEN, parse_ad);
        longer(&b, parse_ad);
        // A capacity near 2^64 with the address 0 wraps only once the data
        // offset is added.
        let mut b = [0u8; LANDING_AD_LEN];
        LandingAdRepr {
            addr: 0,
            cap: u64::MAX,
        }
        .emit(&mut LandingAdPacket::new_unchecked(&mut b[..]));
        assert!(LandingAdRepr::parse(&LandingAdPacket::new_unchecked(&b[..])).is_err());
        // The whole buffer must not wrap: flag page, then `cap` bytes.
        let top = LandingAdRepr {
            addr: u64::MAX - 4096 - 10,
            cap: 10,
        };
        assert_eq!(parse_ad(&top.to_bytes()), Ok(top));
        assert_eq!(top.data_addr(11), None);
        let high = LandingAdRepr {
            addr: u64::MAX - 10,
            cap: 1,
        };
        assert_eq!(high.data_addr(0), None);
        let wraps = LandingAdRepr { cap: 11, ..top };
        assert!(matches!(
            parse_ad(&wraps.to_bytes()),
            Err(WireError::Overflow { .. })
        ));
        let huge = LandingAdRepr {
            addr: 1,
            cap: u64::MAX,
        };
        assert!(parse_ad(&huge.to_bytes()).is_err());
    }

    #[test]
    fn chunk_fixture_roundtrips() {
        // tag 9, total 100, offset 40, then data.
        let hdr: [u8; CHUNK_HEADER_LEN] = cat(&[&[9], &b8(100), &b8(40), &[0; 15]]);
        let mut b = [0u8; CHUNK_HEADER_LEN + 4];
        b[..CHUNK_HEADER_LEN].copy_from_slice(&hdr);
        b[CHUNK_HEADER_LEN..].copy_from_slice(b"data");
        let c = parse_chunk(&b, MAX).unwrap();
        assert_eq!(
            c,
            ChunkRepr {
                tag: 9,
                total: 100,
                offset: 40
            }
        );
        assert_eq!(ChunkPacket::new_checked(&b[..]).unwrap().data(), b"data");
        let mut out = [0xffu8; CHUNK_HEADER_LEN];
        c.emit(&mut ChunkPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, hdr);
        assert_eq!(c.buffer_len(), CHUNK_HEADER_LEN);
        truncations(&b, CHUNK_HEADER_LEN, |b| parse_chunk(b, MAX));
    }

    #[test]
    fn chunk_bad_fields() {
        let good: [u8; CHUNK_HEADER_LEN] = cat(&[&[9], &b8(100), &b8(100), &[0; 15]]);
        assert!(parse_chunk(&good, MAX).is_ok());
        for at in 17..CHUNK_HEADER_LEN {
            let mut b = good;
            b[at] = 0x80;
            assert_eq!(parse_chunk(&b, MAX), Err(WireError::ReservedNotZero { at }));
        }
        let mut b = good;
        b[0] = crate::tags::CHUNK;
        assert_eq!(
            parse_chunk(&b, MAX),
            Err(WireError::BadTag {
                found: crate::tags::CHUNK
            })
        );
        assert_eq!(
            parse_chunk(&good, 99),
            Err(WireError::TooLong { len: 100, max: 99 })
        );
        let past: [u8; CHUNK_HEADER_LEN] = cat(&[&[9], &b8(100), &b8(101), &[0; 15]]);
        assert_eq!(
            parse_chunk(&past, MAX),
            Err(WireError::OutOfRange { at: 101, len: 100 })
        );
    }

    /// req 7, region 3, offset 5, length 4 MiB, then `addr`.
    fn range_fixture(addr: u64) -> [u8; RANGE_REQ_LEN] {
        cat(&[&b8(7), &3u32.to_le_bytes(), &b8(5), &b8(4 << 20), &b8(addr)])
    }

    #[test]
    fn get_requests_roundtrip() {
        for (code, mode) in [
            (GET_BY_FRAGMENTS, GetMode::Fragments),
            (GET_BY_SINGLE_COPY, GetMode::SingleCopy),
        ] {
            let b = range_fixture(code);
            let g = parse_get(&b).unwrap();
            assert_eq!(
                g,
                GetReqRepr {
                    req: 7,
                    id: 3,
                    offset: 5,
                    len: 4 << 20,
                    mode
                }
            );
            assert_eq!(g.buffer_len(), RANGE_REQ_LEN);
            let mut out = [0u8; RANGE_REQ_LEN];
            g.emit(&mut RangeReqPacket::new_unchecked(&mut out[..]));
            assert_eq!(out, b);
            truncations(&b, RANGE_REQ_LEN, parse_get);
        }
        let tail = SplitTailRepr {
            at: 2 << 20,
            dst: 0x7fff_0000_1000,
            deadline: u64::MAX - 1,
        };
        let b: [u8; GET_REQ_SPLIT_LEN] = cat(&[
            &range_fixture(GET_SPLIT),
            &b8(2 << 20),
            &b8(0x7fff_0000_1000),
            &b8(u64::MAX - 1),
        ]);
        let g = parse_get(&b).unwrap();
        assert_eq!(g.mode, GetMode::Split(tail));
        assert_eq!(g.buffer_len(), GET_REQ_SPLIT_LEN);
        let mut out = [0u8; GET_REQ_SPLIT_LEN];
        g.emit(&mut RangeReqPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        truncations(&b, GET_REQ_SPLIT_LEN, parse_get);
        assert_eq!(
            SplitTailRepr::parse(&SplitTailPacket::new_checked(&b[RANGE_REQ_LEN..]).unwrap()),
            Ok(tail)
        );
        assert_eq!(tail.buffer_len(), SPLIT_TAIL_LEN);
    }

    #[test]
    fn get_requests_bad_fields() {
        // A split mode without its tail, a tail without the split mode.
        assert_eq!(
            parse_get(&range_fixture(GET_SPLIT)),
            Err(WireError::Truncated {
                needed: GET_REQ_SPLIT_LEN,
                got: RANGE_REQ_LEN
            })
        );
        let mut long = [0u8; GET_REQ_SPLIT_LEN];
        long[..RANGE_REQ_LEN].copy_from_slice(&range_fixture(GET_BY_SINGLE_COPY));
        assert_eq!(
            parse_get(&long),
            Err(WireError::BadLength {
                len: GET_REQ_SPLIT_LEN,
                expected: RANGE_REQ_LEN
            })
        );
        long[..RANGE_REQ_LEN].copy_from_slice(&range_fixture(GET_SPLIT));
        let mut longer = [0u8; GET_REQ_SPLIT_LEN + 1];
        longer[..GET_REQ_SPLIT_LEN].copy_from_slice(&long);
        assert!(matches!(
            parse_get(&longer),
            Err(WireError::BadLength { .. })
        ));
        for found in [3, 0x7fff_0000_0000, u64::MAX] {
            assert_eq!(
                parse_get(&range_fixture(found)),
                Err(WireError::BadGetMode { found })
            );
        }
        // The tail starts within the range; its destination does not wrap.
        let split = |at: u64, dst: u64| {
            let g = GetReqRepr {
                req: 1,
                id: 0,
                offset: 0,
                len: 100,
                mode: GetMode::Split(SplitTailRepr {
                    at,
                    dst,
                    deadline: 0,
                }),
            };
            let mut out = [0u8; GET_REQ_SPLIT_LEN];
            g.emit(&mut RangeReqPacket::new_unchecked(&mut out[..]));
            (g, parse_get(&out))
        };
        let (g, r) = split(100, u64::MAX);
        assert_eq!(r, Ok(g));
        assert_eq!(
            split(101, 0).1,
            Err(WireError::OutOfRange { at: 101, len: 100 })
        );
        assert_eq!(
            split(50, u64::MAX - 49).1,
            Err(WireError::Overflow {
                addr: u64::MAX - 49,
                len: 50
            })
        );
    }

    #[test]
    fn puts_roundtrip() {
        let b = range_fixture(0x7fff_0000_2000);
        let p = parse_put_cma(&b).unwrap();
        assert_eq!(
            p,
            PutCmaRepr {
                req: 7,
                id: 3,
                offset: 5,
                len: 4 << 20,
                src: 0x7fff_0000_2000
            }
        );
        assert_eq!(p.to_bytes(), b);
        assert_eq!(p.buffer_len(), RANGE_REQ_LEN);
        truncations(&b, RANGE_REQ_LEN, parse_put_cma);
        longer(&b, parse_put_cma);
        assert_eq!(
            parse_put_cma(&range_fixture(u64::MAX)),
            Err(WireError::Overflow {
                addr: u64::MAX,
                len: 4 << 20
            })
        );

        // A put chunk: the same layout, total and chunk offset in the last
        // two fields, then the data.
        let mut b = [0u8; RANGE_REQ_LEN + 3];
        b[..RANGE_REQ_LEN].copy_from_slice(&range_fixture(1 << 20));
        b[RANGE_REQ_LEN..].copy_from_slice(b"xyz");
        let d = parse_put_data(&b).unwrap();
        assert_eq!(
            d,
            PutDataRepr {
                req: 7,
                id: 3,
                offset: 5,
                total: 4 << 20,
                chunk_off: 1 << 20
            }
        );
        assert_eq!(RangeReqPacket::new_checked(&b[..]).unwrap().data(), b"xyz");
        let mut out = [0u8; RANGE_REQ_LEN];
        d.emit(&mut RangeReqPacket::new_unchecked(&mut out[..]));
        assert_eq!(out[..], b[..RANGE_REQ_LEN]);
        assert_eq!(d.buffer_len(), RANGE_REQ_LEN);
        truncations(&b, RANGE_REQ_LEN, parse_put_data);
    }

    #[test]
    fn replies_roundtrip() {
        for status in [
            RmaStatus::Ok,
            RmaStatus::UnknownRegion,
            RmaStatus::OutOfBounds,
            RmaStatus::CopyFailed,
        ] {
            let b: [u8; REPLY_LEN] = cat(&[&b8(9), &status.code().to_le_bytes(), &b8(0xabc)]);
            let r = parse_reply(&b).unwrap();
            assert_eq!(
                r,
                ReplyRepr {
                    req: 9,
                    status,
                    addr: 0xabc
                }
            );
            assert_eq!(r.to_bytes(), b);
            assert_eq!(r.buffer_len(), REPLY_LEN);
            truncations(&b, REPLY_LEN, parse_reply);
            longer(&b, parse_reply);
        }
        for found in [4u32, 0x100, u32::MAX] {
            let b: [u8; REPLY_LEN] = cat(&[&b8(9), &found.to_le_bytes(), &b8(0)]);
            assert_eq!(parse_reply(&b), Err(WireError::BadStatus { found }));
        }
    }

    #[test]
    fn get_data_roundtrips() {
        let hdr: [u8; GET_DATA_HEADER_LEN] = cat(&[&b8(11), &b8(4096), &[0; 16]]);
        let mut b = [0u8; GET_DATA_HEADER_LEN + 2];
        b[..GET_DATA_HEADER_LEN].copy_from_slice(&hdr);
        b[GET_DATA_HEADER_LEN..].copy_from_slice(b"ok");
        let g = parse_get_data(&b).unwrap();
        assert_eq!(
            g,
            GetDataRepr {
                req: 11,
                offset: 4096
            }
        );
        assert_eq!(GetDataPacket::new_checked(&b[..]).unwrap().data(), b"ok");
        let mut out = [0xeeu8; GET_DATA_HEADER_LEN];
        g.emit(&mut GetDataPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, hdr);
        assert_eq!(g.buffer_len(), GET_DATA_HEADER_LEN);
        truncations(&b, GET_DATA_HEADER_LEN, parse_get_data);
        for at in 16..GET_DATA_HEADER_LEN {
            let mut b = hdr;
            b[at] = 1;
            assert_eq!(parse_get_data(&b), Err(WireError::ReservedNotZero { at }));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Bytes of a linear congruential generator, most of them small so
        // that lengths, offsets and modes parse now and then.
        let mut x = 1u64;
        let rounds = if cfg!(miri) { 200 } else { 20_000 };
        for _ in 0..rounds {
            let mut buf = [0u8; GET_REQ_SPLIT_LEN + 1];
            for (i, b) in buf.iter_mut().enumerate() {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                *b = (x >> 56) as u8 & if i % 3 == 0 { 0xff } else { 0x03 };
            }
            let n = (x % (buf.len() as u64 + 1)) as usize;
            let b = &buf[..n];
            let max = x >> 34;
            let _ = parse_rndv(b, max);
            let _ = parse_split(b, max);
            let _ = parse_ad(b);
            let _ = parse_chunk(b, max);
            let _ = parse_get(b);
            let _ = parse_put_cma(b);
            let _ = parse_put_data(b);
            let _ = parse_reply(b);
            let _ = parse_get_data(b);
        }
    }

    #[test]
    fn errors_display() {
        use std::string::ToString;
        assert_eq!(
            WireError::Truncated { needed: 17, got: 3 }.to_string(),
            "truncated: 3 bytes, 17 needed"
        );
        assert_eq!(
            WireError::BadTag { found: 255 }.to_string(),
            "tag 255, not a user tag (0..=239)"
        );
        assert!(WireError::Overflow { addr: 16, len: 1 }
            .to_string()
            .contains("0x10+1"));
    }
}
