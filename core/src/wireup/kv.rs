//! The key/value service's protocol, over any reliable byte stream
//! (TCP): length-prefixed frames, requests from ranks, one response
//! per request, in order.
//!
//! ```text
//! frame:     [ len u32 ][ body: len bytes, 1..=MAX_BODY ]
//! requests   (op, then fields; all integers little endian)
//!   HELLO 1  [ "BTLW" ][ version u16 ][ size u32 ][ rank u32 ][ job_len u8 ][ job ]
//!   PUT   2  [ key_len u8 ][ key ][ value: the rest ]
//!   FENCE 3
//!   GET   4  [ rank u32 ][ key_len u8 ][ key ]
//!   WHO   5  (which ranks the service still waits for in the fence)
//!   GET_ALL 6 [ first u32 ][ key_len u8 ][ key ]   (every rank's value from `first` on)
//! responses
//!   WELCOME 0x81 [ version u16 ]   STORED 0x82   FENCE_DONE 0x83
//!   VALUE   0x84 [ found u8 ][ value: the rest ]
//!   WAITING 0x85 [ count u32 ][ count × rank u32 ]   (count ≤ MAX_LIST)
//!   VALUES  0x86 [ first u32 ][ count u32 ][ count × ( len u32 (ABSENT: none) [ value ] ) ]
//!   REFUSED 0xFF [ code u8 ][ message: UTF-8, the rest ]
//! ```
//!
//! The service answers WHO at any time, even while the asking rank
//! waits in a fence (the WAITING answer comes before FENCE_DONE), so a
//! rank that gives up can name the ranks it waited for.
//!
//! GET_ALL answers with the values of ranks `first, first + 1, ...`, as
//! many as fit in one frame (at least one, as any value fits); the client
//! asks again from where the answer stopped. A job's every rank reading
//! every rank's record so costs n/⌊frame/record⌋ requests per rank instead
//! of n (docs/many-hosts.md: 256 ranks reading each other's node name).
//!
//! [`parse_request`] and [`parse_response`] validate every field and
//! never panic; [`split_frame`] cuts frames out of a read buffer;
//! [`Client`] checks that the service answers what was asked.

use super::{valid_key, valid_name, MAX_KEY, MAX_VALUE};
use core::fmt;

/// The HELLO magic.
pub const MAGIC: [u8; 4] = *b"BTLW";
/// The protocol version this code speaks.
pub const VERSION: u16 = 1;
/// Largest frame body.
pub const MAX_BODY: usize = 1 + 1 + MAX_KEY + MAX_VALUE;
/// Most ranks listed in a WAITING response (the rest are counted only).
pub const MAX_LIST: usize = 256;
/// A buffer of this size holds any frame.
pub const MAX_FRAME: usize = 4 + MAX_BODY;

const OP_HELLO: u8 = 1;
const OP_PUT: u8 = 2;
const OP_FENCE: u8 = 3;
const OP_GET: u8 = 4;
const OP_WHO: u8 = 5;
const OP_GET_ALL: u8 = 6;
const OP_WELCOME: u8 = 0x81;
const OP_STORED: u8 = 0x82;
const OP_FENCE_DONE: u8 = 0x83;
const OP_VALUE: u8 = 0x84;
const OP_WAITING: u8 = 0x85;
const OP_VALUES: u8 = 0x86;
/// The length of an absent value in VALUES.
const ABSENT: u32 = u32::MAX;
const OP_REFUSED: u8 = 0xFF;

/// A protocol violation or a misuse of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum KvError {
    /// A frame announced a body of this length (0 or above [`MAX_BODY`]).
    #[error("frame length {0} is not 1..={MAX_BODY}")]
    BadLength(u32),
    /// A body ended before its fields did, or had bytes left over.
    #[error("frame body does not match its fields")]
    Truncated,
    /// Unknown operation code.
    #[error("unknown operation {0:#04x}")]
    UnknownOp(u8),
    /// HELLO with the wrong magic.
    #[error("wrong magic (not a btl wire-up client)")]
    BadMagic,
    /// HELLO or WELCOME with a version this code does not speak.
    #[error("protocol version {0} (this is {VERSION})")]
    BadVersion(u16),
    /// A key is not 1–64 characters of `[A-Za-z0-9._-]`.
    #[error("key is not 1 to 64 characters of [A-Za-z0-9._-]")]
    BadKey,
    /// A job name is not 1–64 characters of `[A-Za-z0-9._-]`.
    #[error("job is not 1 to 64 characters of [A-Za-z0-9._-]")]
    BadJob,
    /// A value is longer than [`MAX_VALUE`].
    #[error("value longer than {MAX_VALUE} bytes")]
    ValueTooLarge,
    /// A rank is not below the job size, or the size is 0.
    #[error("rank not below the job size (or size 0)")]
    BadRank,
    /// A WAITING list longer than [`MAX_LIST`] or its count.
    #[error("malformed list of ranks")]
    BadList,
    /// A REFUSED message is not UTF-8.
    #[error("message is not UTF-8")]
    BadText,
    /// The output buffer is too small for the frame.
    #[error("output buffer too small")]
    BufferTooSmall,
    /// A response that does not answer the outstanding request.
    #[error("response {0:#04x} does not answer the request")]
    Unexpected(u8),
    /// A request while another is outstanding (or before HELLO).
    #[error("a request is already outstanding")]
    Busy,
}

/// Why the service refused a request (REFUSED's code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RefuseCode {
    /// The HELLO names another job.
    WrongJob,
    /// The HELLO's size differs from the job's.
    WrongSize,
    /// Another connection already speaks for this rank.
    RankTaken,
    /// A request before HELLO, or a malformed one.
    Protocol,
    /// The service keeps no more data for this rank.
    Full,
    /// Any other code (from a newer service).
    Other(u8),
}

impl RefuseCode {
    /// The byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            Self::WrongJob => 1,
            Self::WrongSize => 2,
            Self::RankTaken => 3,
            Self::Protocol => 4,
            Self::Full => 5,
            Self::Other(c) => c,
        }
    }

    /// From the byte on the wire.
    pub fn from_code(c: u8) -> Self {
        match c {
            1 => Self::WrongJob,
            2 => Self::WrongSize,
            3 => Self::RankTaken,
            4 => Self::Protocol,
            5 => Self::Full,
            c => Self::Other(c),
        }
    }
}

impl fmt::Display for RefuseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WrongJob => f.write_str("wrong job"),
            Self::WrongSize => f.write_str("wrong job size"),
            Self::RankTaken => f.write_str("rank already connected"),
            Self::Protocol => f.write_str("protocol error"),
            Self::Full => f.write_str("storage limit reached"),
            Self::Other(c) => write!(f, "code {c}"),
        }
    }
}

/// A request, as parsed by the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// The first request of a connection: who is speaking.
    Hello {
        /// Job identifier.
        job: &'a str,
        /// Job size.
        size: u32,
        /// The rank speaking (`< size`).
        rank: u32,
    },
    /// Publish a value.
    Put {
        /// Key.
        key: &'a str,
        /// Value (≤ [`MAX_VALUE`] bytes).
        value: &'a [u8],
    },
    /// Enter the fence.
    Fence,
    /// Read a rank's value.
    Get {
        /// Whose.
        rank: u32,
        /// Key.
        key: &'a str,
    },
    /// Which ranks has the fence not seen yet?
    Who,
    /// Read every rank's value of `key`, from rank `first` on.
    GetAll {
        /// The first rank to answer for.
        first: u32,
        /// Key.
        key: &'a str,
    },
}

/// A response, as parsed by a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response<'a> {
    /// HELLO accepted.
    Welcome,
    /// PUT stored.
    Stored,
    /// Every rank reached the fence.
    FenceDone,
    /// GET's answer: the value, or `None` if never published.
    Value(Option<&'a [u8]>),
    /// WHO's answer.
    Waiting(Waiting<'a>),
    /// GET_ALL's answer.
    Values(Values<'a>),
    /// The request was refused.
    Refused {
        /// Why.
        code: RefuseCode,
        /// The service's explanation.
        message: &'a str,
    },
}

/// The ranks a fence still waits for (WAITING).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Waiting<'a> {
    count: u32,
    list: &'a [u8],
}

impl Waiting<'_> {
    /// How many ranks the fence waits for.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The first of them (at most [`MAX_LIST`]).
    pub fn ranks(&self) -> impl Iterator<Item = u32> + '_ {
        self.list
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

impl fmt::Debug for Waiting<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiting")
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// Consecutive ranks' values (VALUES), checked when parsed: every entry
/// is complete, no value is longer than [`MAX_VALUE`], nothing follows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Values<'a> {
    first: u32,
    count: u32,
    entries: &'a [u8],
}

impl<'a> Values<'a> {
    /// Checks `count` entries in `entries`.
    fn parse(first: u32, count: u32, entries: &'a [u8]) -> Result<Self, KvError> {
        let mut r = Reader(entries);
        for _ in 0..count {
            entry(&mut r)?;
        }
        r.end()?;
        Ok(Self {
            first,
            count,
            entries,
        })
    }

    /// The rank of the first entry.
    pub fn first(&self) -> u32 {
        self.first
    }

    /// How many ranks' entries the answer holds.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// `(rank, value)` of each entry, `None` for a rank that did not
    /// publish the key.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Option<&'a [u8]>)> + 'a {
        let mut r = Reader(self.entries);
        let first = self.first;
        (0..self.count).map_while(move |i| Some((first.wrapping_add(i), entry(&mut r).ok()?)))
    }
}

impl fmt::Debug for Values<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Values")
            .field("first", &self.first)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// One VALUES entry.
fn entry<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, KvError> {
    match r.u32()? {
        ABSENT => Ok(None),
        n if n as usize > MAX_VALUE => Err(KvError::ValueTooLarge),
        n => r.take(n as usize).map(Some),
    }
}

/// Writes a VALUES frame into `out` (at least [`MAX_FRAME`] bytes): the
/// values of ranks `first, first + 1, ...` that `value_of` gives, until
/// rank `size` or the frame is full (at least one entry when
/// `first < size`). Returns the frame's length and the number of
/// entries. The service's side of GET_ALL.
pub fn encode_values<'v>(
    first: u32,
    size: u32,
    mut value_of: impl FnMut(u32) -> Option<&'v [u8]>,
    out: &mut [u8],
) -> Result<(usize, u32), KvError> {
    let mut count = 0u32;
    let n = frame(out, |w| {
        w.u8(OP_VALUES)?;
        w.u32(first)?;
        let count_at = w.at;
        w.u32(0)?;
        let mut rank = first;
        while rank < size {
            let v = value_of(rank);
            let need = 4 + v.map_or(0, <[u8]>::len);
            if v.is_some_and(|v| v.len() > MAX_VALUE) {
                return Err(KvError::ValueTooLarge);
            }
            if w.at + need > MAX_BODY {
                break;
            }
            match v {
                None => w.u32(ABSENT)?,
                Some(v) => {
                    w.u32(v.len() as u32)?;
                    w.bytes(v)?;
                }
            }
            count += 1;
            rank += 1;
        }
        w.buf[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        Ok(())
    })?;
    Ok((n, count))
}

/// Cuts the first frame out of `buf`: `Ok(Some((body, consumed)))` when
/// a whole frame is there, `Ok(None)` when more bytes are needed, an
/// error when the length prefix is impossible.
pub fn split_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, KvError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if len == 0 || len as usize > MAX_BODY {
        return Err(KvError::BadLength(len));
    }
    let end = 4 + len as usize;
    Ok(buf.get(4..end).map(|body| (body, end)))
}

/// A cursor over a body; every read is checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], KvError> {
        if self.0.len() < n {
            return Err(KvError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, KvError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, KvError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, KvError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn short_str(&mut self, bad: KvError) -> Result<&'a str, KvError> {
        let n = self.u8()? as usize;
        core::str::from_utf8(self.take(n)?).map_err(|_| bad)
    }
    fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.0)
    }
    fn end(&self) -> Result<(), KvError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(KvError::Truncated)
        }
    }
}

fn key_from<'a>(r: &mut Reader<'a>) -> Result<&'a str, KvError> {
    let key = r.short_str(KvError::BadKey)?;
    if valid_key(key) {
        Ok(key)
    } else {
        Err(KvError::BadKey)
    }
}

/// Parses a request body (the service's side).
pub fn parse_request(body: &[u8]) -> Result<Request<'_>, KvError> {
    let mut r = Reader(body);
    let req = match r.u8()? {
        OP_HELLO => {
            if r.take(4)? != MAGIC {
                return Err(KvError::BadMagic);
            }
            let version = r.u16()?;
            if version != VERSION {
                return Err(KvError::BadVersion(version));
            }
            let size = r.u32()?;
            let rank = r.u32()?;
            let job = r.short_str(KvError::BadJob)?;
            if !valid_name(job) {
                return Err(KvError::BadJob);
            }
            if rank >= size {
                return Err(KvError::BadRank);
            }
            Request::Hello { job, size, rank }
        }
        OP_PUT => {
            let key = key_from(&mut r)?;
            let value = r.rest();
            if value.len() > MAX_VALUE {
                return Err(KvError::ValueTooLarge);
            }
            Request::Put { key, value }
        }
        OP_FENCE => Request::Fence,
        OP_GET => {
            let rank = r.u32()?;
            Request::Get {
                rank,
                key: key_from(&mut r)?,
            }
        }
        OP_WHO => Request::Who,
        OP_GET_ALL => {
            let first = r.u32()?;
            Request::GetAll {
                first,
                key: key_from(&mut r)?,
            }
        }
        op => return Err(KvError::UnknownOp(op)),
    };
    r.end()?;
    Ok(req)
}

/// Parses a response body (the client's side).
pub fn parse_response(body: &[u8]) -> Result<Response<'_>, KvError> {
    let mut r = Reader(body);
    let resp = match r.u8()? {
        OP_WELCOME => {
            let version = r.u16()?;
            if version != VERSION {
                return Err(KvError::BadVersion(version));
            }
            Response::Welcome
        }
        OP_STORED => Response::Stored,
        OP_FENCE_DONE => Response::FenceDone,
        OP_VALUE => match r.u8()? {
            0 => Response::Value(None),
            1 => {
                let value = r.rest();
                if value.len() > MAX_VALUE {
                    return Err(KvError::ValueTooLarge);
                }
                Response::Value(Some(value))
            }
            _ => return Err(KvError::Truncated),
        },
        OP_WAITING => {
            let count = r.u32()?;
            let list = r.rest();
            if list.len() % 4 != 0 || list.len() / 4 > MAX_LIST || list.len() / 4 > count as usize {
                return Err(KvError::BadList);
            }
            Response::Waiting(Waiting { count, list })
        }
        OP_VALUES => {
            let first = r.u32()?;
            let count = r.u32()?;
            Response::Values(Values::parse(first, count, r.rest())?)
        }
        OP_REFUSED => {
            let code = RefuseCode::from_code(r.u8()?);
            let message = core::str::from_utf8(r.rest()).map_err(|_| KvError::BadText)?;
            Response::Refused { code, message }
        }
        op => return Err(KvError::UnknownOp(op)),
    };
    r.end()?;
    Ok(resp)
}

/// Writes one frame into `out`, its body made by `fill` (which returns
/// the body's length); returns the frame's length.
fn frame(
    out: &mut [u8],
    fill: impl FnOnce(&mut Writer<'_>) -> Result<(), KvError>,
) -> Result<usize, KvError> {
    let body = out.get_mut(4..).ok_or(KvError::BufferTooSmall)?;
    let mut w = Writer { buf: body, at: 0 };
    fill(&mut w)?;
    let len = w.at;
    if len == 0 || len > MAX_BODY {
        return Err(KvError::BadLength(len as u32));
    }
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(4 + len)
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) -> Result<(), KvError> {
        let end = self
            .at
            .checked_add(b.len())
            .ok_or(KvError::BufferTooSmall)?;
        self.buf
            .get_mut(self.at..end)
            .ok_or(KvError::BufferTooSmall)?
            .copy_from_slice(b);
        self.at = end;
        Ok(())
    }
    fn u8(&mut self, v: u8) -> Result<(), KvError> {
        self.bytes(&[v])
    }
    fn u32(&mut self, v: u32) -> Result<(), KvError> {
        self.bytes(&v.to_le_bytes())
    }
    fn short_str(&mut self, s: &str) -> Result<(), KvError> {
        self.u8(s.len() as u8)?;
        self.bytes(s.as_bytes())
    }
}

/// The body of a GET (`rank`: whose value) or a GET_ALL (`rank`: the
/// first rank answered): `op`, the rank and the key, once the key is seen
/// valid.
fn rank_and_key(w: &mut Writer<'_>, op: u8, rank: u32, key: &str) -> Result<(), KvError> {
    if !valid_key(key) {
        return Err(KvError::BadKey);
    }
    w.u8(op)?;
    w.u32(rank)?;
    w.short_str(key)
}

/// Writes a request frame into `out` (fields are validated as the
/// service will); returns the frame's length.
pub fn encode_request(req: &Request<'_>, out: &mut [u8]) -> Result<usize, KvError> {
    frame(out, |w| match *req {
        Request::Hello { job, size, rank } => {
            if !valid_name(job) {
                return Err(KvError::BadJob);
            }
            if rank >= size {
                return Err(KvError::BadRank);
            }
            w.u8(OP_HELLO)?;
            w.bytes(&MAGIC)?;
            w.bytes(&VERSION.to_le_bytes())?;
            w.u32(size)?;
            w.u32(rank)?;
            w.short_str(job)
        }
        Request::Put { key, value } => {
            if !valid_key(key) {
                return Err(KvError::BadKey);
            }
            if value.len() > MAX_VALUE {
                return Err(KvError::ValueTooLarge);
            }
            w.u8(OP_PUT)?;
            w.short_str(key)?;
            w.bytes(value)
        }
        Request::Fence => w.u8(OP_FENCE),
        Request::Get { rank, key } => rank_and_key(w, OP_GET, rank, key),
        Request::Who => w.u8(OP_WHO),
        Request::GetAll { first, key } => rank_and_key(w, OP_GET_ALL, first, key),
    })
}

/// Writes a response frame into `out`; returns the frame's length. A
/// WAITING list longer than [`MAX_LIST`] is cut to it; a REFUSED
/// message is cut to fit a frame (at a character boundary).
pub fn encode_response(resp: &Response<'_>, out: &mut [u8]) -> Result<usize, KvError> {
    frame(out, |w| match *resp {
        Response::Welcome => {
            w.u8(OP_WELCOME)?;
            w.bytes(&VERSION.to_le_bytes())
        }
        Response::Stored => w.u8(OP_STORED),
        Response::FenceDone => w.u8(OP_FENCE_DONE),
        Response::Value(v) => {
            w.u8(OP_VALUE)?;
            match v {
                None => w.u8(0),
                Some(v) if v.len() > MAX_VALUE => Err(KvError::ValueTooLarge),
                Some(v) => {
                    w.u8(1)?;
                    w.bytes(v)
                }
            }
        }
        Response::Waiting(list) => {
            w.u8(OP_WAITING)?;
            w.u32(list.count)?;
            let n = (list.list.len() / 4).min(MAX_LIST) * 4;
            w.bytes(&list.list[..n])
        }
        Response::Values(v) => {
            w.u8(OP_VALUES)?;
            w.u32(v.first)?;
            w.u32(v.count)?;
            w.bytes(v.entries)
        }
        Response::Refused { code, message } => {
            w.u8(OP_REFUSED)?;
            w.u8(code.code())?;
            let mut end = message.len().min(MAX_BODY - 2);
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            w.bytes(&message.as_bytes()[..end])
        }
    })
}

/// Builds a WAITING response from little-endian rank bytes (four per
/// rank) and the total count; `None` if `list` is not a whole number
/// of ranks.
pub fn waiting(count: u32, list: &[u8]) -> Option<Waiting<'_>> {
    (list.len() % 4 == 0 && list.len() / 4 <= count as usize).then_some(Waiting { count, list })
}

/// What a [`Client`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Pending {
    /// Nothing outstanding.
    Idle,
    /// WELCOME.
    Hello,
    /// STORED.
    Put,
    /// FENCE_DONE (WHO may be asked meanwhile).
    Fence,
    /// VALUE.
    Get,
    /// VALUES starting at this rank.
    GetAll(u32),
    /// WAITING, then FENCE_DONE.
    WhoInFence,
    /// WAITING.
    Who,
    /// The connection is unusable (a refusal or a protocol error).
    Failed,
}

/// The client's side of the protocol, sans IO: it writes request frames
/// into buffers the caller sends, and checks every response body the
/// caller reads against what is outstanding (one request at a time,
/// except WHO during a fence).
#[derive(Debug, Clone)]
pub struct Client {
    rank: u32,
    size: u32,
    pending: Pending,
    welcomed: bool,
}

impl Client {
    /// A client for `rank` of a job of `size` ranks.
    pub fn new(rank: u32, size: u32) -> Result<Self, KvError> {
        if rank >= size {
            return Err(KvError::BadRank);
        }
        Ok(Self {
            rank,
            size,
            pending: Pending::Idle,
            welcomed: false,
        })
    }

    /// What the client waits for.
    pub fn pending(&self) -> Pending {
        self.pending
    }

    fn start(&mut self, next: Pending, need_welcome: bool) -> Result<(), KvError> {
        if self.pending != Pending::Idle || (need_welcome && !self.welcomed) {
            return Err(KvError::Busy);
        }
        self.pending = next;
        Ok(())
    }

    fn encode(
        &mut self,
        req: Request<'_>,
        next: Pending,
        out: &mut [u8],
    ) -> Result<usize, KvError> {
        let need_welcome = !matches!(req, Request::Hello { .. });
        if !need_welcome && self.welcomed {
            return Err(KvError::Busy);
        }
        let n = encode_request(&req, out)?;
        self.start(next, need_welcome)?;
        Ok(n)
    }

    /// HELLO for `job`.
    pub fn hello(&mut self, job: &str, out: &mut [u8]) -> Result<usize, KvError> {
        let req = Request::Hello {
            job,
            size: self.size,
            rank: self.rank,
        };
        self.encode(req, Pending::Hello, out)
    }

    /// PUT.
    pub fn put(&mut self, key: &str, value: &[u8], out: &mut [u8]) -> Result<usize, KvError> {
        self.encode(Request::Put { key, value }, Pending::Put, out)
    }

    /// FENCE.
    pub fn fence(&mut self, out: &mut [u8]) -> Result<usize, KvError> {
        self.encode(Request::Fence, Pending::Fence, out)
    }

    /// GET of `rank`'s `key`.
    pub fn get(&mut self, rank: u32, key: &str, out: &mut [u8]) -> Result<usize, KvError> {
        if rank >= self.size {
            return Err(KvError::BadRank);
        }
        self.encode(Request::Get { rank, key }, Pending::Get, out)
    }

    /// GET_ALL of `key` from rank `first` on.
    pub fn get_all(&mut self, first: u32, key: &str, out: &mut [u8]) -> Result<usize, KvError> {
        if first >= self.size {
            return Err(KvError::BadRank);
        }
        self.encode(Request::GetAll { first, key }, Pending::GetAll(first), out)
    }

    /// WHO: allowed when idle and while waiting in a fence.
    pub fn who(&mut self, out: &mut [u8]) -> Result<usize, KvError> {
        if self.pending == Pending::Fence {
            let n = encode_request(&Request::Who, out)?;
            self.pending = Pending::WhoInFence;
            return Ok(n);
        }
        self.encode(Request::Who, Pending::Who, out)
    }

    /// Checks a response body against the outstanding request.
    /// A REFUSED answer is returned as such (and the client fails);
    /// anything that does not answer the request is an error.
    pub fn on_response<'a>(&mut self, body: &'a [u8]) -> Result<Response<'a>, KvError> {
        let resp = match parse_response(body) {
            Ok(r) => r,
            Err(e) => {
                self.pending = Pending::Failed;
                return Err(e);
            }
        };
        let next = match (self.pending, &resp) {
            (Pending::Failed, _) => return Err(KvError::Busy),
            (_, Response::Refused { .. }) => Pending::Failed,
            (Pending::Hello, Response::Welcome) => {
                self.welcomed = true;
                Pending::Idle
            }
            (Pending::Put, Response::Stored)
            | (Pending::Fence, Response::FenceDone)
            | (Pending::Get, Response::Value(_))
            | (Pending::Who, Response::Waiting(_)) => Pending::Idle,
            // At least one entry, none past the job, from where we asked.
            (Pending::GetAll(first), Response::Values(v))
                if v.first == first
                    && v.count >= 1
                    && u64::from(first) + u64::from(v.count) <= u64::from(self.size) =>
            {
                Pending::Idle
            }
            (Pending::WhoInFence, Response::Waiting(_)) => Pending::Fence,
            // The fence may complete before the service read WHO; its
            // WAITING answer then follows.
            (Pending::WhoInFence, Response::FenceDone) => Pending::Who,
            _ => {
                self.pending = Pending::Failed;
                return Err(KvError::Unexpected(body.first().copied().unwrap_or(0)));
            }
        };
        self.pending = next;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(frame: &[u8]) -> &[u8] {
        let (body, n) = split_frame(frame).unwrap().unwrap();
        assert_eq!(n, frame.len());
        body
    }

    #[test]
    fn requests_round_trip() {
        let mut buf = [0u8; 256];
        let reqs = [
            Request::Hello {
                job: "job-1.a",
                size: 4,
                rank: 3,
            },
            Request::Put {
                key: "tcp-addr",
                value: b"10.0.0.1:1024",
            },
            Request::Put {
                key: "k",
                value: b"",
            },
            Request::Fence,
            Request::Get {
                rank: 2,
                key: "node",
            },
            Request::Who,
            Request::GetAll {
                first: 7,
                key: "node",
            },
        ];
        for req in reqs {
            let n = encode_request(&req, &mut buf).unwrap();
            assert_eq!(parse_request(body_of(&buf[..n])).unwrap(), req);
        }
    }

    #[test]
    fn responses_round_trip() {
        let mut buf = [0u8; 256];
        let list = [1u8, 0, 0, 0, 7, 0, 0, 0];
        let resps = [
            Response::Welcome,
            Response::Stored,
            Response::FenceDone,
            Response::Value(None),
            Response::Value(Some(b"abc")),
            Response::Waiting(waiting(5, &list).unwrap()),
            Response::Refused {
                code: RefuseCode::RankTaken,
                message: "rank 3 is already connected",
            },
        ];
        for resp in resps {
            let n = encode_response(&resp, &mut buf).unwrap();
            assert_eq!(parse_response(body_of(&buf[..n])).unwrap(), resp);
        }
        let n = encode_response(&Response::Waiting(waiting(5, &list).unwrap()), &mut buf).unwrap();
        let Response::Waiting(w) = parse_response(body_of(&buf[..n])).unwrap() else {
            panic!()
        };
        assert_eq!(w.count(), 5);
        assert!(w.ranks().eq([1, 7]));
    }

    #[test]
    fn frames_split_anywhere() {
        let mut buf = [0u8; 64];
        let n = encode_request(
            &Request::Get {
                rank: 1,
                key: "abc",
            },
            &mut buf,
        )
        .unwrap();
        for cut in 0..n {
            assert_eq!(split_frame(&buf[..cut]).unwrap(), None);
        }
        assert!(split_frame(&buf[..n]).unwrap().is_some());
        assert_eq!(split_frame(&[0, 0, 0, 0]), Err(KvError::BadLength(0)));
        assert_eq!(
            split_frame(&u32::MAX.to_le_bytes()),
            Err(KvError::BadLength(u32::MAX))
        );
    }

    #[test]
    fn malformed_requests_are_refused() {
        let hello = |magic: &[u8], version: u16, size: u32, rank: u32, job: &[u8]| {
            let mut b = [0u8; 128];
            b[0] = OP_HELLO;
            b[1..5].copy_from_slice(magic);
            b[5..7].copy_from_slice(&version.to_le_bytes());
            b[7..11].copy_from_slice(&size.to_le_bytes());
            b[11..15].copy_from_slice(&rank.to_le_bytes());
            b[15] = job.len() as u8;
            b[16..16 + job.len()].copy_from_slice(job);
            (b, 16 + job.len())
        };
        let (b, n) = hello(b"BTLX", 1, 2, 0, b"j");
        assert_eq!(parse_request(&b[..n]), Err(KvError::BadMagic));
        let (b, n) = hello(b"BTLW", 9, 2, 0, b"j");
        assert_eq!(parse_request(&b[..n]), Err(KvError::BadVersion(9)));
        let (b, n) = hello(b"BTLW", 1, 2, 2, b"j");
        assert_eq!(parse_request(&b[..n]), Err(KvError::BadRank));
        let (b, n) = hello(b"BTLW", 1, 2, 1, b"a/b");
        assert_eq!(parse_request(&b[..n]), Err(KvError::BadJob));
        let (b, n) = hello(b"BTLW", 1, 2, 1, b"ok");
        assert_eq!(parse_request(&b[..n - 1]), Err(KvError::Truncated));
        assert!(parse_request(&b[..n]).is_ok());
        assert_eq!(parse_request(&[OP_FENCE, 0]), Err(KvError::Truncated));
        assert_eq!(parse_request(&[9]), Err(KvError::UnknownOp(9)));
        assert_eq!(parse_request(&[]), Err(KvError::Truncated));
        assert_eq!(
            parse_request(&[OP_PUT, 2, b'a', b'/']),
            Err(KvError::BadKey)
        );
        assert_eq!(parse_request(&[OP_PUT, 0]), Err(KvError::BadKey));
        assert_eq!(parse_request(&[OP_GET, 0, 0]), Err(KvError::Truncated));
        assert_eq!(parse_response(&[OP_VALUE, 2]), Err(KvError::Truncated));
        assert_eq!(
            parse_response(&[OP_WAITING, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]),
            Err(KvError::BadList)
        );
        assert_eq!(
            parse_response(&[OP_REFUSED, 1, 0xff]),
            Err(KvError::BadText)
        );
    }

    #[test]
    fn client_checks_answers() {
        let mut buf = [0u8; 256];
        let mut resp = [0u8; 64];
        let mut c = Client::new(1, 2).unwrap();
        assert_eq!(c.put("k", b"v", &mut buf), Err(KvError::Busy));
        c.hello("job", &mut buf).unwrap();
        assert_eq!(c.fence(&mut buf), Err(KvError::Busy));
        let n = encode_response(&Response::Welcome, &mut resp).unwrap();
        assert_eq!(c.on_response(&resp[4..n]), Ok(Response::Welcome));
        assert_eq!(c.hello("job", &mut buf), Err(KvError::Busy));
        c.fence(&mut buf).unwrap();
        c.who(&mut buf).unwrap();
        let n = encode_response(&Response::FenceDone, &mut resp).unwrap();
        assert_eq!(c.on_response(&resp[4..n]), Ok(Response::FenceDone));
        assert_eq!(c.pending(), Pending::Who);
        let w = waiting(0, &[]).unwrap();
        let n = encode_response(&Response::Waiting(w), &mut resp).unwrap();
        assert!(matches!(
            c.on_response(&resp[4..n]),
            Ok(Response::Waiting(_))
        ));
        assert_eq!(c.pending(), Pending::Idle);
        assert_eq!(c.get(2, "k", &mut buf), Err(KvError::BadRank));
        c.get(0, "k", &mut buf).unwrap();
        // A STORED does not answer a GET.
        let n = encode_response(&Response::Stored, &mut resp).unwrap();
        assert_eq!(
            c.on_response(&resp[4..n]),
            Err(KvError::Unexpected(OP_STORED))
        );
        assert_eq!(c.pending(), Pending::Failed);
        assert_eq!(c.put("k", b"v", &mut buf), Err(KvError::Busy));
    }

    #[test]
    fn values_fill_frames_and_the_client_checks_them() {
        // Three ranks, rank 1 absent: one frame holds all.
        let mut frame = [0u8; MAX_FRAME];
        let vals: [Option<&[u8]>; 3] = [Some(b"n0"), None, Some(b"")];
        let (n, count) = encode_values(0, 3, |r| vals[r as usize], &mut frame).unwrap();
        assert_eq!(count, 3);
        let (body, _) = split_frame(&frame[..n]).unwrap().unwrap();
        let Response::Values(v) = parse_response(body).unwrap() else {
            panic!("not VALUES")
        };
        let got: [(u32, Option<&[u8]>); 3] = [(0, Some(b"n0")), (1, None), (2, Some(b""))];
        assert!(v.iter().eq(got));
        // Big values: as many as fit, then the client asks from there.
        let big = [7u8; MAX_VALUE];
        let (_, count) = encode_values(5, 9, |_| Some(&big[..]), &mut frame).unwrap();
        assert_eq!(count, 1);
        let (_, count) = encode_values(0, 4000, |_| Some(&big[..60]), &mut frame).unwrap();
        assert_eq!(count as usize, (MAX_BODY - 9) / 64);
        // The client takes only an answer from where it asked, within the job.
        let mut buf = [0u8; 256];
        let mut c = Client::new(0, 3).unwrap();
        c.hello("job", &mut buf).unwrap();
        let n = encode_response(&Response::Welcome, &mut buf).unwrap();
        c.on_response(&buf[4..n]).unwrap();
        assert_eq!(c.get_all(3, "k", &mut buf), Err(KvError::BadRank));
        c.get_all(1, "k", &mut buf).unwrap();
        assert_eq!(c.pending(), Pending::GetAll(1));
        let (n, _) = encode_values(1, 3, |r| vals[r as usize], &mut frame).unwrap();
        assert!(matches!(c.on_response(&frame[4..n]), Ok(Response::Values(v)) if v.count() == 2));
        c.get_all(1, "k", &mut buf).unwrap();
        let (n, _) = encode_values(0, 3, |r| vals[r as usize], &mut frame).unwrap();
        assert_eq!(
            c.on_response(&frame[4..n]),
            Err(KvError::Unexpected(OP_VALUES))
        );
        // An entry cut short, or too long, does not parse.
        let (n, _) = encode_values(0, 1, |_| Some(b"abc"), &mut frame).unwrap();
        assert_eq!(parse_response(&frame[4..n - 1]), Err(KvError::Truncated));
        let mut long = frame[4..n].to_vec();
        long[9..13].copy_from_slice(&(MAX_VALUE as u32 + 1).to_le_bytes());
        assert_eq!(parse_response(&long), Err(KvError::ValueTooLarge));
    }

    #[test]
    fn refusal_fails_the_client() {
        let mut buf = [0u8; 256];
        let mut c = Client::new(0, 1).unwrap();
        c.hello("j", &mut buf).unwrap();
        let r = Response::Refused {
            code: RefuseCode::WrongJob,
            message: "this service serves job x",
        };
        let n = encode_response(&r, &mut buf).unwrap();
        assert_eq!(c.on_response(&buf[4..n]), Ok(r));
        assert_eq!(c.pending(), Pending::Failed);
    }

    #[test]
    fn buffers_too_small_are_errors() {
        let mut small = [0u8; 8];
        assert_eq!(
            encode_request(
                &Request::Put {
                    key: "key",
                    value: b"value"
                },
                &mut small
            ),
            Err(KvError::BufferTooSmall)
        );
        assert_eq!(
            encode_request(&Request::Fence, &mut [0u8; 3]),
            Err(KvError::BufferTooSmall)
        );
    }
}
