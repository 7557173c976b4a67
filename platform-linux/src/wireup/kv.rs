//! The key/value wire-up service over TCP ([`KvServer`]) and its blocking
//! client ([`KvWireup`]), both speaking the core's
//! [`btl_core::wireup::kv`] protocol.
//!
//! The service serves one job: it accepts one connection per rank (the
//! HELLO names job, size and rank, all checked), stores each rank's values
//! (at most [`MAX_BYTES_PER_RANK`] bytes per rank), and completes the n-th
//! fence when every rank has entered it. A client that breaks the protocol
//! gets a REFUSED answer and is disconnected (logged once); the other ranks
//! are served on. Reads and writes have timeouts, so a client that stops
//! reading cannot stall the service; a connection must say HELLO within
//! 10 s, and at most one connection per rank plus 64 are served at once
//! (more are closed on arrival), so a flood of strangers cannot exhaust
//! the launcher's threads.
//!
//! `btl run` runs the service in the launcher; with a user-given rendezvous
//! (`BTL_WIREUP=tcp://HOST:PORT`) rank 0 runs it in a thread.

use btl_core::sync::{AtomicBool, Ordering};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use btl_core::wireup::kv::{
    self as proto, Client, KvError, RefuseCode, Request, Response, MAX_FRAME,
};

use super::{check_key, check_put, copy_value, Identity, Wireup, WireupError};

/// Most bytes of values the service keeps for one rank.
pub const MAX_BYTES_PER_RANK: usize = 1 << 20;
/// A client that sends nothing for this long (outside a fence) is dropped.
const IDLE_LIMIT: Duration = Duration::from_secs(600);
/// A connection that has not said HELLO after this long is dropped.
const HELLO_LIMIT: Duration = Duration::from_secs(10);
/// Connections served at once beyond one per rank (strangers, retries).
const EXTRA_CONNECTIONS: usize = 64;
/// Write timeout of the service's answers.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often blocked threads look at the stop flag.
const TICK: Duration = Duration::from_millis(100);

/// Resolves `HOST:PORT` (the first address).
pub fn resolve(addr: &str) -> Result<SocketAddr, WireupError> {
    let bad = |why: String| WireupError::Config {
        var: super::ENV_WIREUP,
        value: addr.into(),
        accepts: format!("HOST:PORT with a resolvable host ({why})"),
    };
    addr.to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("no address".into()))
}

/// What the service knows of the job.
#[derive(Debug)]
struct Store {
    job: String,
    size: u32,
    /// The answer stream of each connected rank.
    writers: Vec<Option<TcpStream>>,
    values: HashMap<(u32, String), Vec<u8>>,
    bytes: Vec<usize>,
    /// Fences entered, per rank.
    entered: Vec<u64>,
    /// Fences answered, per rank.
    answered: Vec<u64>,
    /// Where answers are encoded ([`MAX_FRAME`] bytes, made once).
    out: Vec<u8>,
}

impl Store {
    fn completed(&self) -> u64 {
        self.entered.iter().copied().min().unwrap_or(0)
    }

    /// Ranks that have not entered fence `k`.
    fn waiting_for(&self, k: u64) -> Vec<u32> {
        (0..self.size)
            .filter(|&r| self.entered[r as usize] < k)
            .collect()
    }

    fn answer(&mut self, rank: u32, resp: &Response<'_>) -> io::Result<()> {
        let n = proto::encode_response(resp, &mut self.out).map_err(io::Error::other)?;
        self.send(rank, n)
    }

    /// Sends the first `n` bytes of `out` to `rank`.
    fn send(&mut self, rank: u32, n: usize) -> io::Result<()> {
        match self.writers.get_mut(rank as usize).and_then(Option::as_mut) {
            Some(w) => w.write_all(&self.out[..n]),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// GET_ALL: the values of `key` from rank `first` on, as many as one
    /// frame holds.
    fn answer_values(&mut self, rank: u32, first: u32, key: &str) -> io::Result<()> {
        // One owned key for every lookup: only its rank changes.
        let mut k = (first, key.to_owned());
        let (values, out) = (&self.values, &mut self.out);
        let (n, _) = proto::encode_values(
            first,
            self.size,
            |r| {
                k.0 = r;
                values.get(&k).map(Vec::as_slice)
            },
            out,
        )
        .map_err(io::Error::other)?;
        self.send(rank, n)
    }

    /// Sends FENCE_DONE to every rank whose fences are now complete.
    fn release_fences(&mut self) {
        let done = self.completed();
        for r in 0..self.size {
            while self.answered[r as usize] < done.min(self.entered[r as usize]) {
                self.answered[r as usize] += 1;
                if let Err(e) = self.answer(r, &Response::FenceDone) {
                    log::warn!("wire-up service: cannot answer rank {r}: {e}");
                }
            }
        }
    }
}

/// The key/value service of one job, running in background threads until
/// dropped.
#[derive(Debug)]
pub struct KvServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KvServer {
    /// Listens on `bind` (port 0 picks a free port) and serves job `job`
    /// of `size` ranks.
    pub fn start(bind: SocketAddr, job: &str, size: u32) -> io::Result<KvServer> {
        if size == 0 || !crate::job::is_valid_name(job) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the service needs a valid job name and a size above 0",
            ));
        }
        let listener = TcpListener::bind(bind)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Mutex::new(Store {
            job: job.into(),
            size,
            writers: (0..size).map(|_| None).collect(),
            values: HashMap::new(),
            bytes: vec![0; size as usize],
            entered: vec![0; size as usize],
            answered: vec![0; size as usize],
            out: vec![0; MAX_FRAME],
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("btl-wireup".into())
            .spawn(move || accept_loop(listener, store, stop2))?;
        Ok(KvServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address the service listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for KvServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop (it waits in poll up to `TICK` otherwise).
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(100));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, store: Arc<Mutex<Store>>, stop: Arc<AtomicBool>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    // One thread per connection, at most this many at once: a flood of
    // connections cannot exhaust the launcher's threads.
    let size = store.lock().map_or(0, |s| s.size as usize);
    let cap = size + EXTRA_CONNECTIONS;
    let mut refused = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok(_) if stop.load(Ordering::Relaxed) => break,
            Ok((s, peer)) => {
                workers.retain(|h| !h.is_finished());
                if workers.len() >= cap {
                    refused += 1;
                    if refused.is_power_of_two() {
                        log::warn!(
                            "wire-up service: {cap} connections open, refusing {peer} \
                             ({refused} refused so far)"
                        );
                    }
                    drop(s);
                    continue;
                }
                let (store, stop) = (store.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name("btl-wireup-conn".into())
                    .stack_size(256 * 1024)
                    .spawn(move || serve(s, peer, store, stop));
                match spawned {
                    Ok(h) => workers.push(h),
                    Err(e) => log::warn!("wire-up service: cannot serve {peer}: {e}"),
                }
                workers.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Sleep in the kernel until a rank connects (or `TICK`, to
                // look at `stop`; dropping the server also connects to wake
                // us): on a machine whose cores all run spinning ranks,
                // every wake-up of this thread preempts one of them.
                let mut fds = [rustix::event::PollFd::new(
                    &listener,
                    rustix::event::PollFlags::IN,
                )];
                let tick = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: TICK.as_nanos() as i64,
                };
                let _ = rustix::event::poll(&mut fds, Some(&tick));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("wire-up service: accept failed: {e}");
                std::thread::sleep(TICK);
            }
        }
    }
    for h in workers {
        let _ = h.join();
    }
}

/// Serves one connection until it closes, breaks the protocol or the
/// service stops.
fn serve(s: TcpStream, peer: SocketAddr, store: Arc<Mutex<Store>>, stop: Arc<AtomicBool>) {
    let mut rank: Option<u32> = None;
    let result = serve_inner(&s, peer, &store, &stop, &mut rank);
    let mut st = store.lock().unwrap_or_else(|e| e.into_inner());
    if let Err((code, why)) = result {
        log::warn!("wire-up service: dropping {peer} (rank {rank:?}): {why}");
        // Tell the client why, best effort (under the lock: no other
        // thread writes to this stream meanwhile).
        let mut buf = vec![0u8; 512];
        let resp = Response::Refused {
            code,
            message: &why,
        };
        if let Ok(n) = proto::encode_response(&resp, &mut buf) {
            let mut w = &s;
            let _ = w.write_all(&buf[..n]);
        }
    }
    if let Some(r) = rank {
        st.writers[r as usize] = None;
    }
    drop(st);
    let _ = s.shutdown(Shutdown::Both);
}

type Refusal = (RefuseCode, String);

fn serve_inner(
    s: &TcpStream,
    peer: SocketAddr,
    store: &Mutex<Store>,
    stop: &AtomicBool,
    rank: &mut Option<u32>,
) -> Result<(), Refusal> {
    let io_err = |e: io::Error| (RefuseCode::Protocol, format!("connection error: {e}"));
    s.set_read_timeout(Some(TICK)).map_err(io_err)?;
    s.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(io_err)?;
    let _ = s.set_nodelay(true);
    let lock = || store.lock().unwrap_or_else(|e| e.into_inner());
    let mut buf = vec![0u8; MAX_FRAME];
    let mut filled = 0usize;
    let mut last = Instant::now();
    let mut r = s;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match r.read(&mut buf[filled..]) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                filled += n;
                last = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                let in_fence = rank.is_some_and(|me| {
                    let st = lock();
                    st.entered[me as usize] > st.answered[me as usize]
                });
                if rank.is_none() && last.elapsed() > HELLO_LIMIT {
                    return Err((RefuseCode::Protocol, "no HELLO in time".into()));
                }
                if !in_fence && last.elapsed() > IDLE_LIMIT {
                    return Err((RefuseCode::Protocol, "idle for too long".into()));
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(e)),
        }
        // Every whole frame in the buffer.
        let mut at = 0;
        while let Some((body, used)) = proto::split_frame(&buf[at..filled])
            .map_err(|e| (RefuseCode::Protocol, format!("bad frame: {e}")))?
        {
            let req = proto::parse_request(body)
                .map_err(|e| (RefuseCode::Protocol, format!("bad request: {e}")))?;
            handle(req, peer, s, store, rank)?;
            at += used;
        }
        buf.copy_within(at..filled, 0);
        filled -= at;
    }
}

fn handle(
    req: Request<'_>,
    peer: SocketAddr,
    s: &TcpStream,
    store: &Mutex<Store>,
    rank: &mut Option<u32>,
) -> Result<(), Refusal> {
    let mut st = store.lock().unwrap_or_else(|e| e.into_inner());
    let answer_err = |e: io::Error| (RefuseCode::Protocol, format!("cannot answer: {e}"));
    let Some(me) = *rank else {
        let Request::Hello { job, size, rank: r } = req else {
            return Err((
                RefuseCode::Protocol,
                "the first request must be HELLO".into(),
            ));
        };
        if job != st.job {
            return Err((
                RefuseCode::WrongJob,
                format!("this service serves job {:?}, not {job:?}", st.job),
            ));
        }
        if size != st.size {
            return Err((
                RefuseCode::WrongSize,
                format!("job {job} has {} ranks, not {size}", st.size),
            ));
        }
        if st.writers[r as usize].is_some() {
            return Err((
                RefuseCode::RankTaken,
                format!("rank {r} is already connected"),
            ));
        }
        let w = s.try_clone().map_err(answer_err)?;
        st.writers[r as usize] = Some(w);
        *rank = Some(r);
        log::debug!("wire-up service: rank {r} connected from {peer}");
        return st.answer(r, &Response::Welcome).map_err(answer_err);
    };
    let in_fence = st.entered[me as usize] > st.answered[me as usize];
    match req {
        Request::Hello { .. } => Err((RefuseCode::Protocol, "HELLO twice".into())),
        Request::Who => {
            let k = st.entered[me as usize].max(st.completed() + 1);
            let missing = st.waiting_for(k);
            let list: Vec<u8> = missing
                .iter()
                .take(proto::MAX_LIST)
                .flat_map(|r| r.to_le_bytes())
                .collect();
            let w = proto::waiting(missing.len() as u32, &list)
                .ok_or((RefuseCode::Protocol, "internal: bad list".into()))?;
            st.answer(me, &Response::Waiting(w)).map_err(answer_err)
        }
        _ if in_fence => Err((
            RefuseCode::Protocol,
            "a request other than WHO during a fence".into(),
        )),
        Request::Put { key, value } => {
            let old = st
                .values
                .get(&(me, key.to_owned()))
                .map_or(0, |v| v.len() + key.len());
            let new = st.bytes[me as usize] - old + value.len() + key.len();
            if new > MAX_BYTES_PER_RANK {
                return Err((
                    RefuseCode::Full,
                    format!("rank {me} would keep more than {MAX_BYTES_PER_RANK} bytes"),
                ));
            }
            st.bytes[me as usize] = new;
            st.values.insert((me, key.to_owned()), value.to_vec());
            st.answer(me, &Response::Stored).map_err(answer_err)
        }
        Request::Fence => {
            st.entered[me as usize] += 1;
            st.release_fences();
            Ok(())
        }
        Request::Get { rank: r, key } => {
            if r >= st.size {
                return Err((
                    RefuseCode::Protocol,
                    format!("GET of rank {r} in a job of {}", st.size),
                ));
            }
            let v = st.values.get(&(r, key.to_owned())).cloned();
            st.answer(me, &Response::Value(v.as_deref()))
                .map_err(answer_err)
        }
        Request::GetAll { first, key } => {
            if first >= st.size {
                return Err((
                    RefuseCode::Protocol,
                    format!("GET_ALL from rank {first} in a job of {}", st.size),
                ));
            }
            st.answer_values(me, first, key).map_err(answer_err)
        }
    }
}

/// A rank's connection to the key/value service.
#[derive(Debug)]
pub struct KvWireup {
    addr: SocketAddr,
    stream: TcpStream,
    client: Client,
    rank: u32,
    size: u32,
    timeout: Duration,
    buf: Vec<u8>,
    filled: usize,
    out: Vec<u8>,
    /// The service, when this rank runs it (rendezvous rank 0).
    server: Option<KvServer>,
}

impl KvWireup {
    /// Connects to the service at `addr` (retrying until `timeout`, as the
    /// service may start after us) and says HELLO.
    pub fn connect(
        addr: SocketAddr,
        id: &Identity,
        timeout: Duration,
    ) -> Result<KvWireup, WireupError> {
        let mut wait = crate::wait::Deadline::new(timeout)
            .pauses(Duration::from_millis(5), Duration::from_millis(200));
        let deadline = wait.at();
        let mut last = None;
        let stream = wait.poll(|| {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
                Ok(s) => Ok::<_, WireupError>(Some(s)),
                Err(e) => {
                    last = Some(e);
                    Ok(None)
                }
            }
        })?;
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, source) => {
                return Err(WireupError::Service {
                    addr,
                    what: "connect",
                    source: source.unwrap_or_else(|| io::ErrorKind::TimedOut.into()),
                })
            }
        };
        let io = |what| move |source| WireupError::Service { addr, what, source };
        stream
            .set_nodelay(true)
            .map_err(io("configure the socket"))?;
        stream
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .map_err(io("configure the socket"))?;
        let client =
            Client::new(id.rank, id.size).map_err(|error| WireupError::Protocol { addr, error })?;
        let mut w = KvWireup {
            addr,
            stream,
            client,
            rank: id.rank,
            size: id.size,
            timeout,
            buf: vec![0; MAX_FRAME],
            filled: 0,
            out: vec![0; MAX_FRAME],
            server: None,
        };
        let n = w.client.hello(&id.job, &mut w.out).map_err(w.proto())?;
        w.send(n)?;
        let len = w.expect("the service's welcome", deadline)?;
        w.consume(len);
        Ok(w)
    }

    /// Keeps `server` running as long as this connection lives.
    pub fn serving(mut self, server: Option<KvServer>) -> Self {
        self.server = server;
        self
    }

    fn proto(&self) -> impl Fn(KvError) -> WireupError {
        let addr = self.addr;
        move |error| WireupError::Protocol { addr, error }
    }

    fn send(&mut self, n: usize) -> Result<(), WireupError> {
        let addr = self.addr;
        self.stream
            .write_all(&self.out[..n])
            .map_err(|source| WireupError::Service {
                addr,
                what: "send a request",
                source,
            })
    }

    /// Reads the next response body's length (its bytes stay at the start
    /// of `buf`), waiting until `deadline`; `Ok(None)` on timeout.
    fn read_response(&mut self, deadline: Instant) -> Result<Option<usize>, WireupError> {
        let addr = self.addr;
        let io = |what| move |source| WireupError::Service { addr, what, source };
        loop {
            if let Some((body, used)) =
                proto::split_frame(&self.buf[..self.filled]).map_err(self.proto())?
            {
                let len = body.len();
                // Move the body to the front; keep what follows.
                self.buf.copy_within(4..used, 0);
                self.buf.copy_within(used..self.filled, len);
                self.filled -= 4;
                return Ok(Some(len));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream
                .set_read_timeout(Some(left.min(TICK)))
                .map_err(io("configure the socket"))?;
            match self.stream.read(&mut self.buf[self.filled..]) {
                Ok(0) => {
                    return Err(WireupError::Service {
                        addr,
                        what: "read an answer",
                        source: io::ErrorKind::UnexpectedEof.into(),
                    })
                }
                Ok(n) => self.filled += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(io("read an answer")(e)),
            }
        }
    }

    /// Consumes a response of `len` bytes at the start of `buf`.
    fn consume(&mut self, len: usize) {
        self.buf.copy_within(len..self.filled, 0);
        self.filled -= len;
    }

    /// Sends the request of `n` bytes in `out`, waits for its answer and
    /// hands it to `take`; an answer `take` does not take (`None`) is a
    /// protocol error.
    fn ask<T>(
        &mut self,
        n: usize,
        what: &str,
        take: impl FnOnce(Response<'_>) -> Option<T>,
    ) -> Result<T, WireupError> {
        self.send(n)?;
        let len = self.expect(what, Instant::now() + self.timeout)?;
        let resp = proto::parse_response(&self.buf[..len]).map_err(self.proto())?;
        let result = take(resp).ok_or(WireupError::Protocol {
            addr: self.addr,
            error: KvError::Unexpected(self.buf[0]),
        });
        self.consume(len);
        result
    }

    /// Waits for the answer to the outstanding request; returns its body
    /// length (the body stays at the start of `buf` until consumed).
    fn expect(&mut self, what: &str, deadline: Instant) -> Result<usize, WireupError> {
        let Some(len) = self.read_response(deadline)? else {
            return Err(WireupError::Timeout {
                what: what.into(),
                missing: Vec::new(),
                count: 0,
                waited: self.timeout,
            });
        };
        let addr = self.addr;
        let resp = self
            .client
            .on_response(&self.buf[..len])
            .map_err(|error| WireupError::Protocol { addr, error })?;
        if let Response::Refused { code, message } = resp {
            return Err(WireupError::Refused {
                addr,
                code,
                message: message.into(),
            });
        }
        Ok(len)
    }
}

impl Wireup for KvWireup {
    type Error = WireupError;
    crate::wireup_rank_size!();

    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), WireupError> {
        check_put(self.rank, key, value)?;
        let n = self
            .client
            .put(key, value, &mut self.out)
            .map_err(self.proto())?;
        self.send(n)?;
        let len = self.expect(
            "the service to store a value",
            Instant::now() + self.timeout,
        )?;
        self.consume(len);
        Ok(())
    }

    /// Enters the fence; at the timeout, asks the service which ranks are
    /// missing and names them in the error.
    fn fence(&mut self) -> Result<(), WireupError> {
        let start = Instant::now();
        let n = self.client.fence(&mut self.out).map_err(self.proto())?;
        self.send(n)?;
        let deadline = start + self.timeout;
        if let Some(len) = self.read_response(deadline)? {
            let addr = self.addr;
            let outcome = match self.client.on_response(&self.buf[..len]) {
                Ok(Response::FenceDone) => Ok(()),
                Ok(Response::Refused { code, message }) => Err(WireupError::Refused {
                    addr,
                    code,
                    message: message.into(),
                }),
                Ok(_) => Err(WireupError::Protocol {
                    addr,
                    error: KvError::Unexpected(0),
                }),
                Err(error) => Err(WireupError::Protocol { addr, error }),
            };
            self.consume(len);
            return outcome;
        }
        // Timed out: who is missing?
        let n = self.client.who(&mut self.out).map_err(self.proto())?;
        self.send(n)?;
        let grace = Instant::now() + Duration::from_secs(5);
        let mut completed = false;
        loop {
            let len = self.expect("the service's list of missing ranks", grace)?;
            let resp = proto::parse_response(&self.buf[..len]).map_err(self.proto())?;
            match resp {
                Response::Waiting(w) => {
                    let missing: Vec<u32> = w.ranks().collect();
                    let count = w.count();
                    self.consume(len);
                    if completed {
                        // The fence completed before the service read WHO.
                        return Ok(());
                    }
                    return Err(WireupError::Timeout {
                        what: "every rank to reach the fence".into(),
                        missing,
                        count,
                        waited: start.elapsed(),
                    });
                }
                Response::FenceDone => {
                    completed = true;
                    self.consume(len);
                }
                _ => self.consume(len),
            }
        }
    }

    fn get(&mut self, rank: u32, key: &str, out: &mut [u8]) -> Result<Option<usize>, WireupError> {
        check_key(key)?;
        let n = self
            .client
            .get(rank, key, &mut self.out)
            .map_err(self.proto())?;
        self.ask(n, "a value from the service", |resp| match resp {
            Response::Value(v) => Some(copy_value(rank, key, v, out)),
            _ => None,
        })?
    }

    fn get_each(
        &mut self,
        key: &str,
        _buf: &mut [u8],
        each: &mut dyn FnMut(u32, Option<&[u8]>),
    ) -> Result<(), WireupError> {
        check_key(key)?;
        let mut first = 0;
        while first < self.size() {
            let n = self
                .client
                .get_all(first, key, &mut self.out)
                .map_err(self.proto())?;
            // The client checked: at least one entry, none past the job.
            first += self.ask(n, "values from the service", |resp| match resp {
                Response::Values(v) => {
                    for (r, value) in v.iter() {
                        each(r, value);
                    }
                    Some(v.count())
                }
                _ => None,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wireup::MAX_VALUE;
    use std::net::{IpAddr, Ipv4Addr};

    fn loopback() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
    }

    fn id(rank: u32, size: u32) -> Identity {
        Identity {
            job: "kvtest".into(),
            rank,
            size,
            node: "n".into(),
        }
    }

    /// Runs `rank` for every rank of a job of `size`, each on its own
    /// thread with its own connection to one service; a rank's panic fails
    /// the caller.
    fn run_ranks(size: u32, rank: impl Fn(u32, KvWireup) + Sync) {
        let server = KvServer::start(loopback(), "kvtest", size).unwrap();
        let addr = server.addr();
        std::thread::scope(|s| {
            for r in 0..size {
                let rank = &rank;
                s.spawn(move || {
                    let w = KvWireup::connect(addr, &id(r, size), Duration::from_secs(10)).unwrap();
                    rank(r, w);
                });
            }
        });
    }

    #[test]
    fn ranks_exchange_values_through_fences() {
        run_ranks(4, |r, mut w| {
            w.put("addr", format!("value-of-{r}").as_bytes()).unwrap();
            w.fence().unwrap();
            let mut buf = [0u8; 64];
            for p in 0..4 {
                let n = w.get(p, "addr", &mut buf).unwrap().unwrap();
                assert_eq!(&buf[..n], format!("value-of-{p}").as_bytes());
            }
            assert_eq!(w.get(0, "nothing", &mut buf).unwrap(), None);
            // A second round (a new key: a value may be replaced before
            // slower ranks read it).
            w.put("round2", b"x").unwrap();
            w.fence().unwrap();
            assert_eq!(w.get((r + 1) % 4, "round2", &mut buf).unwrap(), Some(1));
        });
    }

    #[test]
    fn every_rank_reads_every_value_in_few_requests() {
        // 6 ranks of 20 KiB values: three to a frame, so GET_ALL takes
        // two answers; rank 4 publishes nothing.
        let value = |r: u32| vec![r as u8; 20 << 10];
        run_ranks(6, |r, mut w| {
            if r != 4 {
                w.put("big", &value(r)).unwrap();
            }
            w.fence().unwrap();
            let mut seen = Vec::new();
            w.get_each("big", &mut [], &mut |p, v| {
                seen.push((p, v.map(<[u8]>::to_vec)));
            })
            .unwrap();
            let want: Vec<_> = (0..6).map(|p| (p, (p != 4).then(|| value(p)))).collect();
            assert!(seen == want, "rank {r} read {} values", seen.len());
        });
    }

    #[test]
    fn fence_timeout_names_missing_ranks() {
        let server = KvServer::start(loopback(), "kvtest", 3).unwrap();
        let mut w =
            KvWireup::connect(server.addr(), &id(0, 3), Duration::from_millis(300)).unwrap();
        let _w2 = KvWireup::connect(server.addr(), &id(2, 3), Duration::from_secs(5)).unwrap();
        match w.fence() {
            Err(WireupError::Timeout { missing, count, .. }) => {
                // Rank 2 connected but did not enter the fence; 1 never came.
                assert_eq!((missing, count), (vec![1, 2], 2));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn impostors_are_refused_and_others_served() {
        let server = KvServer::start(loopback(), "kvtest", 2).unwrap();
        let addr = server.addr();
        let mut good = KvWireup::connect(addr, &id(0, 2), Duration::from_secs(5)).unwrap();
        // Same rank again.
        match KvWireup::connect(addr, &id(0, 2), Duration::from_secs(5)) {
            Err(WireupError::Refused { code, .. }) => assert_eq!(code, RefuseCode::RankTaken),
            other => panic!("{other:?}"),
        }
        // Wrong job.
        let mut other = id(1, 2);
        other.job = "elsewhere".into();
        match KvWireup::connect(addr, &other, Duration::from_secs(5)) {
            Err(WireupError::Refused { code, message, .. }) => {
                assert_eq!(code, RefuseCode::WrongJob);
                assert!(message.contains("kvtest"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Garbage, then a frame announcing 4 GiB.
        for junk in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            &[0xff, 0xff, 0xff, 0xff, 1][..],
        ] {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(junk).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            let (body, _) = proto::split_frame(&answer).unwrap().unwrap();
            assert!(matches!(
                proto::parse_response(body).unwrap(),
                Response::Refused {
                    code: RefuseCode::Protocol,
                    ..
                }
            ));
        }
        // The honest ranks are still served.
        let mut second = KvWireup::connect(addr, &id(1, 2), Duration::from_secs(5)).unwrap();
        good.put("k", b"v").unwrap();
        let t = std::thread::spawn(move || {
            second.fence().unwrap();
            let mut b = [0u8; 8];
            second.get(0, "k", &mut b).unwrap()
        });
        good.fence().unwrap();
        assert_eq!(t.join().unwrap(), Some(1));
    }

    #[test]
    fn a_service_that_is_not_there_is_named() {
        let port = {
            let l = TcpListener::bind(loopback()).unwrap();
            l.local_addr().unwrap()
        };
        match KvWireup::connect(port, &id(0, 1), Duration::from_millis(200)) {
            Err(e @ WireupError::Service { .. }) => {
                assert!(e.to_string().contains(&port.to_string()), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_flood_of_connections_is_capped_and_the_rank_still_served() {
        let server = KvServer::start(loopback(), "kvtest", 1).unwrap();
        let addr = server.addr();
        // One per rank plus EXTRA_CONNECTIONS are served; more are closed
        // at once.
        let idle: Vec<TcpStream> = (0..=EXTRA_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut extra = TcpStream::connect(addr).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 8];
        assert_eq!(extra.read(&mut b).unwrap_or(0), 0, "not closed");
        // Once the strangers go, the real rank gets in.
        drop(idle);
        std::thread::sleep(Duration::from_millis(300));
        let mut w = KvWireup::connect(addr, &id(0, 1), Duration::from_secs(5)).unwrap();
        w.fence().unwrap();
    }

    #[test]
    fn storage_is_bounded_per_rank() {
        let server = KvServer::start(loopback(), "kvtest", 1).unwrap();
        let mut w = KvWireup::connect(server.addr(), &id(0, 1), Duration::from_secs(5)).unwrap();
        let big = vec![7u8; MAX_VALUE];
        let mut refused = None;
        for i in 0..20 {
            if let Err(e) = w.put(&format!("k{i}"), &big) {
                refused = Some((i, e));
                break;
            }
        }
        match refused {
            Some((i, WireupError::Refused { code, .. })) => {
                assert_eq!(code, RefuseCode::Full);
                assert_eq!(i, MAX_BYTES_PER_RANK / (MAX_VALUE + 2));
            }
            other => panic!("{other:?}"),
        }
    }
}
