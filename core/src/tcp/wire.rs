//! The TCP byte formats: the handshake, the frame header, the RMA
//! sub-header and the chunk header. This module only parses and emits
//! bytes.
//!
//! Every integer is **little endian** (the byte order of every machine btl
//! runs on: x86_64, aarch64, Cortex-M; no swapping on the hot path).
//!
//! ```text
//! handshake (24 bytes, each side sends one first; the connecting side first)
//!  0      4        6      8            16     20        24
//! [ BTLT ][version][flags][ job (u64)  ][rank ][reserved]
//!           u16=1    u16=0  FNV-1a hash   u32     u32=0
//!
//! frame header (16 bytes), then `len` payload bytes
//!  0     1    2      4            8                  16
//! [type][tag][flags][ len (u32)  ][ id (u64)         ]
//!                bit 0: error     request id (PUT/GET and their responses)
//!
//! RMA sub-header (24 bytes), at the start of a PUT or GET payload
//!  0         4          8             16          24
//! [region u32][reserved][ offset u64  ][ len u64  ]
//!
//! chunk header (16 bytes), at the start of the first TAG_CHUNK frame
//!  0     1              8                  16
//! [tag ][ reserved (0) ][ total (u64)      ]
//!  user tag               message length; data follows, then the next
//!                         TAG_CHUNK frames carry data only
//! ```
//!
//! Views ([`HandshakePacket`], [`FrameHeader`], [`RmaPacket`],
//! [`ChunkPacket`]) wrap any
//! `T: AsRef<[u8]>`; once `new_checked` (or `check_len`) succeeded, no
//! accessor can panic. Representations ([`HandshakeRepr`], [`FrameRepr`],
//! [`RmaRepr`], [`ChunkRepr`]) validate every field a peer controls in `parse` and write
//! them back with `emit`. All malformed input is a typed [`WireError`],
//! never a panic.

/// The handshake magic, `b"BTLT"`.
pub const MAGIC: [u8; 4] = *b"BTLT";
/// The protocol version this code speaks.
pub const VERSION: u16 = 1;
/// Length of a handshake.
pub const HANDSHAKE_LEN: usize = field::HS_RESERVED.end;
/// Length of a frame header.
pub const FRAME_HEADER_LEN: usize = field::FR_ID.end;
/// Length of the RMA sub-header at the start of PUT and GET payloads.
pub const RMA_HEADER_LEN: usize = field::RMA_LEN.end;
/// Frame flag: the frame reports an error status (a failed PUT or GET).
pub const FLAG_ERROR: u16 = 1;

/// Largest tag of a user message; tags above are the transport's own
/// (the table is [`crate::tags`]).
pub const MAX_USER_TAG: u8 = crate::tags::MAX_USER_TAG;
/// Internal SEND tag of a barrier arrival: the payload is the barrier's
/// epoch (u64, little endian), counted from 1 by every rank.
pub const TAG_BARRIER: u8 = crate::tags::BARRIER;
/// Internal SEND tag of a chunk of a message larger than one frame: the
/// first chunk starts with a [`CHUNK_HEADER_LEN`]-byte header (user tag
/// u8, 7 bytes zero, total length u64 little endian), then data; the
/// following chunks are data only, back to back on the connection until
/// the total is reached.
pub const TAG_CHUNK: u8 = crate::tags::CHUNK;
/// Length of the header of the first chunk of a chunked message.
pub const CHUNK_HEADER_LEN: usize = field::CH_TOTAL.end;

mod field {
    use core::ops::Range;

    pub(super) type Field = Range<usize>;

    // Handshake.
    pub(super) const HS_MAGIC: Field = 0..4;
    pub(super) const HS_VERSION: Field = 4..6;
    pub(super) const HS_FLAGS: Field = 6..8;
    pub(super) const HS_JOB: Field = 8..16;
    pub(super) const HS_RANK: Field = 16..20;
    pub(super) const HS_RESERVED: Field = 20..24;

    // Frame header.
    pub(super) const FR_TYPE: Field = 0..1;
    pub(super) const FR_TAG: Field = 1..2;
    pub(super) const FR_FLAGS: Field = 2..4;
    pub(super) const FR_LEN: Field = 4..8;
    pub(super) const FR_ID: Field = 8..16;

    // RMA sub-header.
    pub(super) const RMA_REGION: Field = 0..4;
    pub(super) const RMA_RESERVED: Field = 4..8;
    pub(super) const RMA_OFFSET: Field = 8..16;
    pub(super) const RMA_LEN: Field = 16..24;

    // Chunk header.
    pub(super) const CH_TAG: Field = 0..1;
    pub(super) const CH_RESERVED: Field = 1..8;
    pub(super) const CH_TOTAL: Field = 8..16;
}

/// 64-bit FNV-1a hash of a job identifier (the handshake's `job` field).
///
/// Both sides hash the job id string they were launched with; equal hashes
/// mean "same job". Collisions between concurrently running jobs on one
/// network are the only way two jobs can be confused (probability about
/// 2^-64 per pair).
pub const fn job_hash(job: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET_BASIS;
    let mut i = 0;
    while i < job.len() {
        hash ^= job[i] as u64;
        hash = hash.wrapping_mul(PRIME);
        i += 1;
    }
    hash
}

/// Bytes a peer sent could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WireError {
    /// The buffer is shorter than the format needs.
    #[error("truncated: {got} bytes, {needed} needed")]
    Truncated {
        /// Bytes the format needs.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The handshake does not start with [`MAGIC`] (not a btl peer).
    #[error(
        "bad handshake magic {:02x}{:02x}{:02x}{:02x} (not a btl peer)",
        .found[0],
        .found[1],
        .found[2],
        .found[3]
    )]
    BadMagic {
        /// The first four bytes received.
        found: [u8; 4],
    },
    /// The handshake names another protocol version than [`VERSION`].
    #[error("protocol version {found}, this side speaks {VERSION}")]
    BadVersion {
        /// The version received.
        found: u16,
    },
    /// Flag bits this version does not define are set (handshake: any bit;
    /// frame header: any bit but [`FLAG_ERROR`]).
    #[error("undefined flag bits {found:#06x}")]
    BadFlags {
        /// The flags received.
        found: u16,
    },
    /// A reserved field is not zero.
    #[error("reserved field is {found:#010x}, not zero")]
    ReservedNotZero {
        /// The value received.
        found: u32,
    },
    /// The frame type byte is not a [`FrameType`].
    #[error("unknown frame type {found}")]
    BadType {
        /// The type byte received.
        found: u8,
    },
    /// The frame announces more payload than the receiver allows.
    #[error("frame announces {len} payload bytes, limit is {max}")]
    FrameTooLarge {
        /// Announced payload length.
        len: u32,
        /// The receiver's `max_frame`.
        max: u32,
    },
    /// The payload length is impossible for the frame type (a FIN or
    /// PUT-ACK with payload, a GET whose payload is not exactly the RMA
    /// sub-header, a PUT shorter than it).
    #[error("{kind:?} frame with impossible payload length {len}")]
    BadLength {
        /// The frame type.
        kind: FrameType,
        /// Announced payload length.
        len: u32,
    },
    /// A SEND or FIN carries a non-zero request id.
    #[error("{kind:?} frame with non-zero request id {id}")]
    UnexpectedId {
        /// The frame type.
        kind: FrameType,
        /// The id received.
        id: u64,
    },
    /// An RMA sub-header whose `offset + len` overflows 64 bits.
    #[error("RMA range {offset}+{len} overflows")]
    RmaRangeOverflow {
        /// Offset received.
        offset: u64,
        /// Length received.
        len: u64,
    },
    /// A PUT whose sub-header length differs from the data it carries.
    #[error("PUT announces {announced} bytes but carries {carried}")]
    RmaLengthMismatch {
        /// Length in the sub-header.
        announced: u64,
        /// Data bytes in the frame (payload minus the sub-header).
        carried: u32,
    },
    /// The stream ended inside a handshake or frame (EOF while the decoder
    /// held a partial item).
    #[error("stream ended inside a handshake or frame")]
    UnexpectedEof,
    /// A chunk header names a tag above [`MAX_USER_TAG`] (chunked
    /// messages carry user messages only).
    #[error("chunked message with internal tag {found} (user tags end at {MAX_USER_TAG})")]
    BadTag {
        /// The tag received.
        found: u8,
    },
}

fixed_len! {
    HandshakeRepr: HandshakePacket, HANDSHAKE_LEN;
    FrameRepr: FrameHeader, FRAME_HEADER_LEN;
    RmaRepr: RmaPacket, RMA_HEADER_LEN;
    ChunkRepr: ChunkPacket, CHUNK_HEADER_LEN;
}

// ---------------------------------------------------------------------------
// Handshake.

wire_view! {
    /// A read/write view of a handshake.
    HandshakePacket, HANDSHAKE_LEN, WireError {
        /// The protocol version field.
        (version, set_version): u16 = field::HS_VERSION;
        /// The flags field.
        (flags, set_flags): u16 = field::HS_FLAGS;
        /// The job hash field.
        (job, set_job): u64 = field::HS_JOB;
        /// The rank field.
        (rank, set_rank): u32 = field::HS_RANK;
        /// The reserved field.
        (reserved, set_reserved): u32 = field::HS_RESERVED;
    }
}

impl<T: AsRef<[u8]>> HandshakePacket<T> {
    /// The magic field.
    pub fn magic(&self) -> [u8; 4] {
        crate::wire_view::le(self.buffer.as_ref(), field::HS_MAGIC)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> HandshakePacket<T> {
    /// Sets the magic field.
    pub fn set_magic(&mut self, value: [u8; 4]) {
        self.buffer.as_mut()[field::HS_MAGIC].copy_from_slice(&value);
    }
}

/// A validated handshake: who the sender claims to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct HandshakeRepr {
    /// The sender's job hash ([`job_hash`] of its job id).
    pub job: u64,
    /// The sender's rank in the job.
    pub rank: u32,
}

impl HandshakeRepr {
    /// Parses a handshake: magic, version, flags (0) and reserved (0) are
    /// checked; `job` and `rank` are left for the caller to validate
    /// against the job (see [`super::endpoint::Incoming`]).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &HandshakePacket<&T>) -> Result<Self, WireError> {
        packet.check_len()?;
        let magic = packet.magic();
        if magic != MAGIC {
            return Err(WireError::BadMagic { found: magic });
        }
        let version = packet.version();
        if version != VERSION {
            return Err(WireError::BadVersion { found: version });
        }
        let flags = packet.flags();
        if flags != 0 {
            return Err(WireError::BadFlags { found: flags });
        }
        let reserved = packet.reserved();
        if reserved != 0 {
            return Err(WireError::ReservedNotZero { found: reserved });
        }
        Ok(Self {
            job: packet.job(),
            rank: packet.rank(),
        })
    }

    /// Writes the handshake (magic, [`VERSION`], zero flags and reserved).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        packet: &mut HandshakePacket<&mut T>,
    ) {
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_flags(0);
        packet.set_job(self.job);
        packet.set_rank(self.rank);
        packet.set_reserved(0);
    }
}

// ---------------------------------------------------------------------------
// Frame header.

/// The kind of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum FrameType {
    /// An active message: the payload goes to the handler of `tag`.
    Send = 1,
    /// Write into a registered region: RMA sub-header, then the data.
    Put = 2,
    /// Read from a registered region: RMA sub-header only.
    Get = 3,
    /// The data of a GET (error flag: the GET was refused; no data).
    GetResp = 4,
    /// Completion of a PUT (empty; error flag: the PUT was refused).
    PutAck = 5,
    /// Clean close: the sender sends nothing more on this connection.
    Fin = 6,
}

impl TryFrom<u8> for FrameType {
    type Error = WireError;

    fn try_from(value: u8) -> Result<Self, WireError> {
        Ok(match value {
            1 => Self::Send,
            2 => Self::Put,
            3 => Self::Get,
            4 => Self::GetResp,
            5 => Self::PutAck,
            6 => Self::Fin,
            found => return Err(WireError::BadType { found }),
        })
    }
}

wire_view! {
    /// A read/write view of a frame header.
    FrameHeader, FRAME_HEADER_LEN, WireError {
        /// The raw frame type byte.
        (frame_type, set_frame_type): u8 = field::FR_TYPE;
        /// The tag byte.
        (tag, set_tag): u8 = field::FR_TAG;
        /// The flags field.
        (flags, set_flags): u16 = field::FR_FLAGS;
        /// The payload length field.
        (payload_len, set_payload_len): u32 = field::FR_LEN;
        /// The request id field.
        (id, set_id): u64 = field::FR_ID;
    }
}

/// A validated frame header; [`Self::to_bytes`] is what a vectored write
/// sends before the payload (written by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FrameRepr {
    /// The frame type.
    pub kind: FrameType,
    /// Active-message tag (meaningful for SEND).
    pub tag: u8,
    /// Error status ([`FLAG_ERROR`]).
    pub error: bool,
    /// Payload bytes following the header.
    pub len: u32,
    /// Request id: PUT/GET and their responses; 0 for SEND and FIN.
    pub id: u64,
}

impl FrameRepr {
    /// A SEND of `len` payload bytes to the handler of `tag`.
    pub const fn send(tag: u8, len: u32) -> Self {
        Self {
            kind: FrameType::Send,
            tag,
            error: false,
            len,
            id: 0,
        }
    }

    /// A FIN.
    pub const fn fin() -> Self {
        Self {
            kind: FrameType::Fin,
            tag: 0,
            error: false,
            len: 0,
            id: 0,
        }
    }

    /// Parses a frame header, refusing any payload length above
    /// `max_frame` (before anything is allocated or read for it) and any
    /// inconsistency: unknown type, undefined flag bits, a FIN or PUT-ACK
    /// with payload, a GET whose payload is not exactly the RMA sub-header,
    /// a PUT shorter than it, a SEND or FIN with a request id.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &FrameHeader<&T>,
        max_frame: u32,
    ) -> Result<Self, WireError> {
        header.check_len()?;
        let kind = FrameType::try_from(header.frame_type())?;
        let flags = header.flags();
        if flags & !FLAG_ERROR != 0 {
            return Err(WireError::BadFlags { found: flags });
        }
        let len = header.payload_len();
        if len > max_frame {
            return Err(WireError::FrameTooLarge {
                len,
                max: max_frame,
            });
        }
        let rma = RMA_HEADER_LEN as u32;
        let len_ok = match kind {
            FrameType::Send | FrameType::GetResp => true,
            FrameType::Put => len >= rma,
            FrameType::Get => len == rma,
            FrameType::PutAck | FrameType::Fin => len == 0,
        };
        if !len_ok {
            return Err(WireError::BadLength { kind, len });
        }
        let id = header.id();
        if matches!(kind, FrameType::Send | FrameType::Fin) && id != 0 {
            return Err(WireError::UnexpectedId { kind, id });
        }
        Ok(Self {
            kind,
            tag: header.tag(),
            error: flags & FLAG_ERROR != 0,
            len,
            id,
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut FrameHeader<&mut T>) {
        header.set_frame_type(self.kind as u8);
        header.set_tag(self.tag);
        header.set_flags(if self.error { FLAG_ERROR } else { 0 });
        header.set_payload_len(self.len);
        header.set_id(self.id);
    }
}

// ---------------------------------------------------------------------------
// RMA sub-header.

wire_view! {
    /// A read/write view of the RMA sub-header of a PUT or GET payload
    /// (PUT data may follow it: [`RmaPacket::data`]).
    RmaPacket, RMA_HEADER_LEN, WireError {
        /// The region id field.
        (region, set_region): u32 = field::RMA_REGION;
        /// The reserved field.
        (reserved, set_reserved): u32 = field::RMA_RESERVED;
        /// The byte offset field.
        (offset, set_offset): u64 = field::RMA_OFFSET;
        /// The length field.
        (len, set_len): u64 = field::RMA_LEN;
    }
}

impl<T: AsRef<[u8]>> RmaPacket<T> {
    /// Whether the length field is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> RmaPacket<&'a T> {
    /// The bytes after the sub-header (a PUT's data).
    pub fn data(&self) -> &'a [u8] {
        &self.buffer.as_ref()[RMA_HEADER_LEN..]
    }
}

/// A validated RMA sub-header: which bytes of which registered region.
///
/// Whether the region exists and the range lies inside it is for the
/// target to check against its own table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RmaRepr {
    /// The target's region id.
    pub region: u32,
    /// Byte offset in the region.
    pub offset: u64,
    /// Bytes to write (PUT) or read (GET).
    pub len: u64,
}

impl RmaRepr {
    /// Parses a sub-header: reserved must be zero and `offset + len` must
    /// not overflow.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RmaPacket<&T>) -> Result<Self, WireError> {
        packet.check_len()?;
        let reserved = packet.reserved();
        if reserved != 0 {
            return Err(WireError::ReservedNotZero { found: reserved });
        }
        let (offset, len) = (packet.offset(), packet.len());
        if offset.checked_add(len).is_none() {
            return Err(WireError::RmaRangeOverflow { offset, len });
        }
        Ok(Self {
            region: packet.region(),
            offset,
            len,
        })
    }

    /// Checks this sub-header against the frame that carries it: a PUT's
    /// `len` must equal the data it carries (payload minus sub-header);
    /// other frame types are not checked here.
    pub fn check_frame(&self, frame: &FrameRepr) -> Result<(), WireError> {
        if frame.kind == FrameType::Put {
            let carried = frame.len.saturating_sub(RMA_HEADER_LEN as u32);
            if self.len != u64::from(carried) {
                return Err(WireError::RmaLengthMismatch {
                    announced: self.len,
                    carried,
                });
            }
        }
        Ok(())
    }

    /// Writes the sub-header (reserved zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut RmaPacket<&mut T>) {
        packet.set_region(self.region);
        packet.set_reserved(0);
        packet.set_offset(self.offset);
        packet.set_len(self.len);
    }
}

// ---------------------------------------------------------------------------
// Chunk header.

wire_view! {
    /// A read/write view of the header at the start of the first chunk of a
    /// chunked message (a SEND on [`TAG_CHUNK`]); the first data bytes may
    /// follow it ([`ChunkPacket::data`]).
    ChunkPacket, CHUNK_HEADER_LEN, WireError {
        /// The user tag field.
        (tag, set_tag): u8 = field::CH_TAG;
        /// The total message length field.
        (total, set_total): u64 = field::CH_TOTAL;
    }
}

impl<T: AsRef<[u8]>> ChunkPacket<T> {
    /// The reserved field (7 bytes, as an integer below 2^56).
    pub fn reserved(&self) -> u64 {
        let mut b = [0u8; 8];
        b[..7].copy_from_slice(&self.buffer.as_ref()[field::CH_RESERVED]);
        u64::from_le_bytes(b)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> ChunkPacket<&'a T> {
    /// The bytes after the header (the message's first data).
    pub fn data(&self) -> &'a [u8] {
        &self.buffer.as_ref()[CHUNK_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ChunkPacket<T> {
    /// Sets the reserved field (its low 7 bytes).
    pub fn set_reserved(&mut self, value: u64) {
        self.buffer.as_mut()[field::CH_RESERVED].copy_from_slice(&value.to_le_bytes()[..7]);
    }
}

/// A validated chunk header: the user tag and length of the message the
/// chunks carry.
///
/// Whether the receiver can hold `total` bytes is for its reassembler to
/// check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ChunkRepr {
    /// The message's user tag (at most [`MAX_USER_TAG`]).
    pub tag: u8,
    /// The message's length in bytes (all chunks' data together).
    pub total: u64,
}

impl ChunkRepr {
    /// Parses a chunk header: the tag must be a user tag and the reserved
    /// bytes zero.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ChunkPacket<&T>) -> Result<Self, WireError> {
        packet.check_len()?;
        let tag = packet.tag();
        if tag > MAX_USER_TAG {
            return Err(WireError::BadTag { found: tag });
        }
        let reserved = packet.reserved();
        if reserved != 0 {
            return Err(WireError::ReservedNotZero {
                found: u32::try_from(reserved).unwrap_or(u32::MAX),
            });
        }
        Ok(Self {
            tag,
            total: packet.total(),
        })
    }

    /// Writes the header (reserved zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut ChunkPacket<&mut T>) {
        packet.set_tag(self.tag);
        packet.set_reserved(0);
        packet.set_total(self.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// job 0x0102030405060708, rank 7.
    const HANDSHAKE: [u8; 24] = [
        b'B', b'T', b'L', b'T', // magic
        0x01, 0x00, // version 1
        0x00, 0x00, // flags
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // job
        0x07, 0x00, 0x00, 0x00, // rank
        0x00, 0x00, 0x00, 0x00, // reserved
    ];

    /// PUT, tag 9, error flag, 0x30 payload bytes, id 0x1122334455667788.
    const PUT_HEADER: [u8; 16] = [
        0x02, 0x09, 0x01, 0x00, // type, tag, flags
        0x30, 0x00, 0x00, 0x00, // len
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // id
    ];

    /// region 3, offset 0x100, len 24.
    const RMA: [u8; 24] = [
        0x03, 0x00, 0x00, 0x00, // region
        0x00, 0x00, 0x00, 0x00, // reserved
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // offset
        0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // len
    ];

    fn parse_hs(bytes: &[u8]) -> Result<HandshakeRepr, WireError> {
        HandshakeRepr::parse(&HandshakePacket::new_checked(bytes)?)
    }

    fn parse_frame(bytes: &[u8], max: u32) -> Result<FrameRepr, WireError> {
        FrameRepr::parse(&FrameHeader::new_checked(bytes)?, max)
    }

    fn parse_rma(bytes: &[u8]) -> Result<RmaRepr, WireError> {
        RmaRepr::parse(&RmaPacket::new_checked(bytes)?)
    }

    #[test]
    fn fnv1a_fixtures() {
        assert_eq!(job_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(job_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(job_hash(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn handshake_fixture() {
        let repr = parse_hs(&HANDSHAKE).unwrap();
        assert_eq!(
            repr,
            HandshakeRepr {
                job: 0x0102_0304_0506_0708,
                rank: 7
            }
        );
        assert_eq!(repr.to_bytes(), HANDSHAKE);
        assert_eq!(repr.buffer_len(), HANDSHAKE_LEN);
        let view = HandshakePacket::new_checked(&HANDSHAKE[..]).unwrap();
        assert_eq!(view.magic(), MAGIC);
        assert_eq!(view.version(), 1);
        assert_eq!((view.flags(), view.reserved()), (0, 0));
        // Longer buffers are fine: only the first 24 bytes are read.
        let mut long = [0xeeu8; 30];
        long[..24].copy_from_slice(&HANDSHAKE);
        assert_eq!(parse_hs(&long), Ok(repr));
    }

    #[test]
    fn handshake_errors() {
        for n in 0..HANDSHAKE_LEN {
            assert_eq!(
                parse_hs(&HANDSHAKE[..n]),
                Err(WireError::Truncated { needed: 24, got: n })
            );
        }
        let mut b = HANDSHAKE;
        b[0] = b'X';
        assert_eq!(parse_hs(&b), Err(WireError::BadMagic { found: *b"XTLT" }));
        let mut b = HANDSHAKE;
        b[4] = 2;
        assert_eq!(parse_hs(&b), Err(WireError::BadVersion { found: 2 }));
        let mut b = HANDSHAKE;
        b[7] = 0x80;
        assert_eq!(parse_hs(&b), Err(WireError::BadFlags { found: 0x8000 }));
        let mut b = HANDSHAKE;
        b[23] = 1;
        assert_eq!(
            parse_hs(&b),
            Err(WireError::ReservedNotZero { found: 1 << 24 })
        );
        // An HTTP client or a port scanner, say.
        assert!(matches!(
            parse_hs(b"GET / HTTP/1.1\r\nHost: x\r\n"),
            Err(WireError::BadMagic { .. })
        ));
    }

    #[test]
    fn frame_fixture() {
        let repr = parse_frame(&PUT_HEADER, 1 << 20).unwrap();
        assert_eq!(
            repr,
            FrameRepr {
                kind: FrameType::Put,
                tag: 9,
                error: true,
                len: 0x30,
                id: 0x1122_3344_5566_7788
            }
        );
        assert_eq!(repr.to_bytes(), PUT_HEADER);
        assert_eq!(
            FrameRepr::send(5, 3).to_bytes(),
            [1, 5, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            FrameRepr::fin().to_bytes(),
            [6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        // Every type round-trips.
        for (kind, len, id) in [
            (FrameType::Send, 0, 0),
            (FrameType::Send, 100, 0),
            (FrameType::Put, 24, 1),
            (FrameType::Get, 24, 2),
            (FrameType::GetResp, 77, 3),
            (FrameType::PutAck, 0, 4),
            (FrameType::Fin, 0, 0),
        ] {
            let r = FrameRepr {
                kind,
                tag: 1,
                error: false,
                len,
                id,
            };
            assert_eq!(parse_frame(&r.to_bytes(), 100), Ok(r));
        }
    }

    #[test]
    fn frame_errors() {
        for n in 0..FRAME_HEADER_LEN {
            assert_eq!(
                parse_frame(&PUT_HEADER[..n], 1 << 20),
                Err(WireError::Truncated { needed: 16, got: n })
            );
        }
        for t in [0u8, 7, 0x80, 0xff] {
            let mut b = PUT_HEADER;
            b[0] = t;
            assert_eq!(
                parse_frame(&b, 1 << 20),
                Err(WireError::BadType { found: t })
            );
        }
        let mut b = PUT_HEADER;
        b[2] = 0x03;
        assert_eq!(
            parse_frame(&b, 1 << 20),
            Err(WireError::BadFlags { found: 3 })
        );
        // 4 GiB - 1 announced: refused from the header alone.
        let mut b = FrameRepr::send(0, 0).to_bytes();
        b[4..8].copy_from_slice(&[0xff; 4]);
        assert_eq!(
            parse_frame(&b, 30 * 1024),
            Err(WireError::FrameTooLarge {
                len: u32::MAX,
                max: 30 * 1024
            })
        );
        assert_eq!(
            parse_frame(&FrameRepr::send(0, 11).to_bytes(), 10),
            Err(WireError::FrameTooLarge { len: 11, max: 10 })
        );
        assert!(parse_frame(&FrameRepr::send(0, 10).to_bytes(), 10).is_ok());
        let bad_len = |kind, len| {
            let r = FrameRepr {
                kind,
                tag: 0,
                error: false,
                len,
                id: 1,
            };
            parse_frame(&r.to_bytes(), 1000)
        };
        assert_eq!(
            bad_len(FrameType::Fin, 1),
            Err(WireError::BadLength {
                kind: FrameType::Fin,
                len: 1
            })
        );
        assert!(matches!(
            bad_len(FrameType::PutAck, 8),
            Err(WireError::BadLength { .. })
        ));
        assert!(matches!(
            bad_len(FrameType::Get, 25),
            Err(WireError::BadLength { .. })
        ));
        assert!(matches!(
            bad_len(FrameType::Get, 0),
            Err(WireError::BadLength { .. })
        ));
        assert!(matches!(
            bad_len(FrameType::Put, 23),
            Err(WireError::BadLength { .. })
        ));
        assert_eq!(
            bad_len(FrameType::Send, 0),
            Err(WireError::UnexpectedId {
                kind: FrameType::Send,
                id: 1
            })
        );
        let mut fin = FrameRepr::fin().to_bytes();
        fin[15] = 1;
        assert!(matches!(
            parse_frame(&fin, 10),
            Err(WireError::UnexpectedId { .. })
        ));
    }

    #[test]
    fn rma_fixture() {
        let repr = parse_rma(&RMA).unwrap();
        assert_eq!(
            repr,
            RmaRepr {
                region: 3,
                offset: 0x100,
                len: 24
            }
        );
        assert_eq!(repr.to_bytes(), RMA);
        let put = parse_frame(&PUT_HEADER, 1 << 20).unwrap();
        assert_eq!(repr.check_frame(&put), Ok(()));
        let mut payload = [0u8; 0x30];
        payload[..24].copy_from_slice(&RMA);
        payload[24..].fill(0xab);
        let view = RmaPacket::new_checked(&payload[..]).unwrap();
        assert_eq!(view.data(), &[0xab; 24]);
        assert!(!view.is_empty());
        let short = RmaRepr { len: 23, ..repr };
        assert_eq!(
            short.check_frame(&put),
            Err(WireError::RmaLengthMismatch {
                announced: 23,
                carried: 24
            })
        );
        let get = FrameRepr {
            kind: FrameType::Get,
            tag: 0,
            error: false,
            len: 24,
            id: 9,
        };
        assert_eq!(short.check_frame(&get), Ok(()));
    }

    #[test]
    fn rma_errors() {
        for n in 0..RMA_HEADER_LEN {
            assert_eq!(
                parse_rma(&RMA[..n]),
                Err(WireError::Truncated { needed: 24, got: n })
            );
        }
        let mut b = RMA;
        b[4] = 1;
        assert_eq!(parse_rma(&b), Err(WireError::ReservedNotZero { found: 1 }));
        let r = RmaRepr {
            region: 0,
            offset: u64::MAX,
            len: 1,
        };
        assert_eq!(
            parse_rma(&r.to_bytes()),
            Err(WireError::RmaRangeOverflow {
                offset: u64::MAX,
                len: 1
            })
        );
    }

    /// tag 5, total 0x0102030405.
    const CHUNK: [u8; 16] = [
        0x05, // tag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // reserved
        0x05, 0x04, 0x03, 0x02, 0x01, 0x00, 0x00, 0x00, // total
    ];

    fn parse_chunk(bytes: &[u8]) -> Result<ChunkRepr, WireError> {
        ChunkRepr::parse(&ChunkPacket::new_checked(bytes)?)
    }

    #[test]
    fn chunk_fixture() {
        let repr = parse_chunk(&CHUNK).unwrap();
        assert_eq!(
            repr,
            ChunkRepr {
                tag: 5,
                total: 0x01_0203_0405
            }
        );
        assert_eq!(repr.to_bytes(), CHUNK);
        assert_eq!(repr.buffer_len(), CHUNK_HEADER_LEN);
        let mut first = [0xcdu8; 20];
        first[..16].copy_from_slice(&CHUNK);
        let view = ChunkPacket::new_checked(&first[..]).unwrap();
        assert_eq!(
            (view.tag(), view.reserved(), view.total()),
            (5, 0, 0x01_0203_0405)
        );
        assert_eq!(view.data(), &[0xcd; 4]);
        assert_eq!(parse_chunk(&first), Ok(repr));
        for tag in [0, MAX_USER_TAG] {
            let r = ChunkRepr {
                tag,
                total: u64::MAX,
            };
            assert_eq!(parse_chunk(&r.to_bytes()), Ok(r));
        }
    }

    #[test]
    fn chunk_errors() {
        for n in 0..CHUNK_HEADER_LEN {
            assert_eq!(
                parse_chunk(&CHUNK[..n]),
                Err(WireError::Truncated { needed: 16, got: n })
            );
            assert!(ChunkPacket::new_checked(&CHUNK[..n]).is_err());
        }
        for tag in [MAX_USER_TAG + 1, TAG_BARRIER, TAG_CHUNK, u8::MAX] {
            let mut b = CHUNK;
            b[0] = tag;
            assert_eq!(parse_chunk(&b), Err(WireError::BadTag { found: tag }));
        }
        for i in 1..8 {
            let mut b = CHUNK;
            b[i] = 1;
            let found = 1u64 << ((i - 1) * 8);
            assert_eq!(
                parse_chunk(&b),
                Err(WireError::ReservedNotZero {
                    found: u32::try_from(found).unwrap_or(u32::MAX)
                })
            );
        }
        let mut view = ChunkPacket::new_unchecked([0u8; 16]);
        view.set_reserved(u64::MAX);
        assert_eq!(view.reserved(), (1 << 56) - 1);
        assert_eq!(view.total(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Every 1- and 2-byte variation of the fixtures at every position.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..if cfg!(miri) { 200 } else { 20_000 } {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut buf = [0u8; 24];
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (x >> ((i % 8) * 8)) as u8 ^ HANDSHAKE[i];
            }
            let n = (x % 25) as usize;
            let _ = parse_hs(&buf[..n]);
            let _ = parse_frame(&buf[..n.min(20)], (x >> 40) as u32);
            let _ = parse_rma(&buf[..n]);
            let _ = parse_chunk(&buf[..n.min(16)]);
            let _ = FrameType::try_from(buf[0]);
        }
    }

    #[test]
    fn errors_display() {
        use std::string::ToString;
        assert_eq!(
            WireError::FrameTooLarge { len: 5, max: 4 }.to_string(),
            "frame announces 5 payload bytes, limit is 4"
        );
        assert!(WireError::BadMagic { found: *b"HTTP" }
            .to_string()
            .contains("48545450"));
    }
}
