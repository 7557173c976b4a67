//! Start-up: the segment rendezvous, identifying the local ranks, and
//! attaching the engine (the seed's `create_rndv_file` /
//! `create_and_attach`; see the module docs of [`super`]).

use std::time::{Duration, Instant};

use btl_core::params::Params as _;
use btl_core::shm::Region;
use btl_core::sm::control::{Control, ControlError, RankInfo};
use btl_core::sm::engine;
use btl_core::sm::layout::calc_sm_max_procs;
use btl_core::sm::layout::{segment_layout, SegmentLayout, PART_ALIGN};
use btl_core::sm::params::SmParams;
use btl_core::sm::regtab::RegionTable;
use btl_core::sync::{AtomicU64, Ordering};

use super::recv::{PeerId, State};
use super::*;
use crate::cma;
use crate::job::JobEnv;
use crate::segment::{self, Attached, Offer, Segment};
use crate::wait::Deadline;

/// What start-up produces besides the views of the segment.
struct Rest {
    state: State,
    probe: Box<AtomicU64>,
}

impl Sm {
    /// Joins the job's shared-memory transport on this node, on its own
    /// (without the job API): the local ranks' identities come from their
    /// control records only, which any process that maps the segment can
    /// write, so **single copy is off** (every large transfer takes the
    /// pipelined copy) and the segment's creator is checked by uid only.
    /// Liveness still works (pid and start time read at start-up and
    /// checked against `/proc`). With identities from a wire-up, use
    /// [`Sm::init_with_pids`]. See the module docs for the start-up
    /// sequence.
    pub fn init(job: &JobEnv, params: SmParams) -> Result<Sm, SmError> {
        Self::start(job, params, None)
    }

    /// Joins the job's shared-memory transport on this node with the
    /// process id of every local rank (indexed by local rank, ours
    /// included) as the ranks published them through the job's wire-up
    /// (what [`crate::world`] does). Each peer's control record must name
    /// the same pid, and the kernel that process's start time; our own pid
    /// is refused for a peer. Single copy then reads only from those
    /// processes.
    pub fn init_with_pids(job: &JobEnv, params: SmParams, pids: &[u32]) -> Result<Sm, SmError> {
        Self::start(job, params, Some(pids))
    }

    fn start(job: &JobEnv, mut params: SmParams, pids: Option<&[u32]>) -> Result<Sm, SmError> {
        if !crate::shared_memory_supported() {
            return Err(SmError::Unsupported(
                "this target has no lock-free 64-bit atomics",
            ));
        }
        params.verify()?;
        let attach_timeout = env_secs("BTL_ATTACH_TIMEOUT", DEFAULT_ATTACH_TIMEOUT)?;
        let timeout = env_secs("BTL_TIMEOUT", Duration::from_secs(300))?;
        let me = job.local_rank;
        let nprocs = job.local_size;
        let (pid, start) = segment::current_process_identity();
        if let Some(p) = pids {
            check_wireup_pids(p, me, nprocs, pid)?;
        }
        let uid = rustix::process::geteuid().as_raw();
        let name = segment::segment_name(uid, &job.job, &job.node)?;

        let (seg, layout, offer) = if me == 0 {
            let max_procs = calc_sm_max_procs(&params, nprocs)?;
            let layout = segment_layout(&params, max_procs)?;
            // Reserved now: the control area. Each rank reserves its own
            // part's pieces as it first uses them (`attach`, the engine's
            // `Reserve`); the job needs at least every part's head and
            // first fragments, checked here.
            let first = first_part_bytes(&layout, &params)?;
            let needed = (layout.control_bytes as u64)
                .saturating_add(first.saturating_mul(u64::from(nprocs)));
            let seg = Segment::create_lazy(
                &name,
                layout.total_bytes,
                layout.control_bytes as u64,
                needed,
            )?;
            let offer = Offer::new(&name)?;
            Control::new(seg.region())?.publish(
                &params,
                nprocs,
                max_procs,
                layout.total_bytes as u64,
                u64::from(pid),
                start,
            );
            (seg, layout, Some(offer))
        } else {
            let creator = pids.map(|p| p[0]);
            let fd = segment::fetch(&name, creator, attach_timeout)?;
            let seg = Segment::from_fd(fd, &name, PART_ALIGN)?;
            let (p, n, max_procs) = {
                let control = Control::new(seg.region())?;
                let ready = Deadline::new(attach_timeout)
                    .pauses(Duration::from_millis(1), Duration::from_millis(1))
                    .poll(|| Ok::<_, SmError>(control.is_ready().then_some(())))?;
                if ready.is_none() {
                    return Err(SmError::AttachTimeout {
                        waited: attach_timeout,
                        missing: vec![0],
                    });
                }
                control.read_params(&params)?
            };
            if n != nprocs {
                return Err(SmError::Control(ControlError::Corrupted {
                    what: "nprocs (differs from BTL_LOCAL_SIZE)",
                }));
            }
            if p.fifo_size != params.fifo_size
                || p.eager_limit != params.eager_limit
                || p.max_send_size != params.max_send_size
            {
                log::warn!("local rank 0 created the segment with different sm parameters; using its values");
            }
            params = p;
            let layout = segment_layout(&params, max_procs)?;
            if seg.len() < layout.total_bytes {
                return Err(SmError::Control(ControlError::Corrupted {
                    what: "segment shorter than its layout",
                }));
            }
            (seg, layout, None)
        };
        let mut rest = None;
        let shm = Attached::<ShmView>::new(seg, |region, seg| {
            let (view, r) = attach(
                region,
                seg,
                offer.as_ref(),
                &layout,
                &params,
                (me, nprocs),
                (pid, start),
                pids,
                attach_timeout,
            )?;
            rest = Some(r);
            Ok::<_, SmError>(view)
        })?;
        // Every rank has the segment: stop offering it.
        drop(offer);
        let Some(Rest { state, probe }) = rest else {
            return Err(SmError::Unsupported("start-up produced no state"));
        };
        Ok(Sm {
            shm,
            state,
            _probe: probe,
            params,
            me,
            nprocs,
            oversubscribed: crate::progress::oversubscribed(nprocs),
            failed: Vec::new(),
            departed: Vec::new(),
            to_report: Vec::new(),
            accusations: Vec::new(),
            last_liveness: Instant::now(),
            timeout,
            rates: vec![[BulkRates::default(); super::bulk::RATE_CLASSES]; nprocs as usize],
            out: (0..nprocs).map(|_| PeerOut::default()).collect(),
            busy_peers: 0,
            limits: DEFAULT_QUEUE_LIMITS,
            unpins: Vec::new(),
            pump_pieces: Vec::new(),
            large_sent: (0, 0, 0),
            next_cookie: 0,
            split_seq: vec![0; nprocs as usize],
            next_req: 0,
        })
    }
}

/// How far the max-size pool grows when single copy reaches every peer, in
/// payload bytes: it then carries only messages between `eager_limit` and
/// `min_rdma_pipeline_size` (4–68 KiB by default, one or two fragments
/// each), so 128 KiB keep two of them in flight — two fragments of the
/// default 64 KiB (four of 32 KiB) — and are most of what a rank's part
/// costs (issue 13: 64 ranks of a stress test within 32 MiB).
const MAX_POOL_BYTES_WITH_SINGLE_COPY: u64 = 128 * 1024;

/// [`MAX_POOL_BYTES_WITH_SINGLE_COPY`] in fragments of `max_send_size`
/// payload bytes: at least two.
fn max_pool_with_single_copy(max_send_size: u32) -> u32 {
    let n = MAX_POOL_BYTES_WITH_SINGLE_COPY / u64::from(max_send_size.max(1));
    u32::try_from(n).unwrap_or(u32::MAX).max(2)
}

/// Bytes of a part a rank reserves at start: its head (rings, box
/// directory) and the first fragments of each pool.
fn first_part_bytes(layout: &SegmentLayout, params: &SmParams) -> Result<u64, SmError> {
    let first = u64::try_from(params.free_list_num).unwrap_or(0).max(1);
    let head = layout.head_bytes().map_err(engine::SetupError::from)? as u64;
    let eager = first.min(u64::from(layout.eager_frags)) * layout.eager_frag_bytes as u64;
    let max = layout.max_frag_bytes as u64;
    Ok(head + eager + max)
}

/// The wire-up's pids: one per local rank, ours at our index, the others
/// non-zero, distinct and not ours.
fn check_wireup_pids(pids: &[u32], me: u32, nprocs: u32, own: u32) -> Result<(), SmError> {
    let bad = |rank: u32, what: String| Err(SmError::Identity { rank, what });
    if pids.len() != nprocs as usize {
        return bad(
            me,
            format!(
                "the wire-up gave {} pids for {nprocs} local ranks",
                pids.len()
            ),
        );
    }
    for (r, &p) in pids.iter().enumerate() {
        let r = r as u32;
        if r == me && p != own {
            return bad(
                r,
                format!("the wire-up says our pid is {p}, but it is {own}"),
            );
        }
        if r != me && p == own {
            return bad(r, format!("the wire-up names our own pid {own} for it"));
        }
        if p == 0 {
            return bad(r, "the wire-up names pid 0 for it".into());
        }
        if pids[..r as usize].contains(&p) {
            return bad(
                r,
                format!("the wire-up names pid {p} for it and for another rank"),
            );
        }
    }
    Ok(())
}

/// Initialises our part, publishes our record, waits for every rank (the
/// creator meanwhile hands out the segment), identifies them, attaches the
/// engine and probes single copy.
#[allow(clippy::too_many_arguments)]
fn attach<'r>(
    region: Region<'r>,
    seg: &Segment,
    offer: Option<&Offer>,
    layout: &SegmentLayout,
    params: &SmParams,
    (me, nprocs): (u32, u32),
    (pid, start): (u32, u64),
    pids: Option<&[u32]>,
    attach_timeout: Duration,
) -> Result<(Shm<'r>, Rest), SmError> {
    let mut control = Control::new(region)?;
    control.fix_nprocs(nprocs);

    // Our part (its head reserved first), then our record.
    seg.reserve(
        layout.part_offset(me).map_err(engine::SetupError::from)? as u64,
        layout.head_bytes().map_err(engine::SetupError::from)? as u64,
    )?;
    // SAFETY: no peer touches our part before our record says READY
    // (below); this process initialises it once.
    unsafe { engine::init_part(&region, layout, params, me) }?;
    // Our region table, empty before any peer can look at it.
    RegionTable::resolve(
        &region,
        layout.regtab_offset(me).map_err(engine::SetupError::from)? as u64,
    )
    .map_err(engine::SetupError::from)?
    .clear();
    let probe = Box::new(AtomicU64::new(0x6274_6c5f_7072_6f62 ^ u64::from(pid)));
    control.record(me)?.publish(&RankInfo {
        pid: u64::from(pid),
        start,
        probe_addr: &*probe as *const AtomicU64 as u64,
        probe_value: probe.load(Ordering::Relaxed),
    });

    // Wait for everyone (handing out the segment meanwhile, if we made it).
    let mut infos = vec![None; nprocs as usize];
    let mut missing = Vec::new();
    let all = Deadline::new(attach_timeout)
        .pauses(Duration::from_micros(200), Duration::from_micros(200))
        .poll(|| {
            if let Some(o) = offer {
                o.serve(seg);
            }
            missing.clear();
            for r in 0..nprocs {
                match control.record(r)?.read() {
                    Some(info) => {
                        // The wire-up's pid if there is one: a record can lie.
                        let p = pids.map_or(info.pid, |p| u64::from(p[r as usize]));
                        if r != me && !segment::process_alive(p as u32, info.start) {
                            return Err(SmError::PeerDiedAtStart { rank: r, pid: p });
                        }
                        infos[r as usize] = Some(info);
                    }
                    None => missing.push(r),
                }
            }
            Ok(missing.is_empty().then_some(()))
        })?;
    if all.is_none() {
        return Err(SmError::AttachTimeout {
            waited: attach_timeout,
            missing,
        });
    }
    let peers = identify(&infos, me, pid, start, pids)?;

    let engine = Engine::attach_collected(&region, layout, params, me, nprocs, seg.reserver()?)?;

    // Single copy: only towards processes the wire-up identified, and only
    // where the kernel lets us (the probe).
    let mut cma_ok = vec![false; nprocs as usize];
    if params.use_cma && pids.is_none() {
        log::info!(
            "single copy (CMA) off: the local ranks' pids come from the shared segment only \
             (no wire-up); using the pipelined copy"
        );
    } else if params.use_cma {
        cma::allow_ptrace_from_any();
        let mut refused = Vec::new();
        for r in (0..nprocs).filter(|&r| r != me) {
            let p = &peers[r as usize];
            let mut got = [0u8; 8];
            // SAFETY: `p.pid` is another process (identify() refused ours);
            // `got` is our own buffer.
            match unsafe { cma::read_remote(p.pid, p.probe_addr as usize, &mut got) } {
                Ok(()) if u64::from_ne_bytes(got) == p.probe_value => cma_ok[r as usize] = true,
                Ok(()) => refused.push((r, "probe value mismatch".to_string())),
                Err(e) => refused.push((r, e.to_string())),
            }
        }
        if let Some((r, why)) = refused.first() {
            log::warn!(
                "single copy (CMA) refused for {} of {} local peers (rank {r}: {why}); \
                 using the pipelined copy through shared fragments for them",
                refused.len(),
                nprocs - 1
            );
        }
    }

    // With single copy to every peer, large messages (from
    // min_rdma_pipeline_size on) do not travel through fragments: the
    // max-size pool then stays small (for the mid-size messages), unless
    // free_list_max asks for more — and until a large message does go
    // through fragments after all (measured faster, or single copy
    // refused: `enqueue_large` lifts the limit). Without single copy, the
    // pool grows by use to its room, the pipeline's depth.
    let mut engine = engine;
    let single_copy_everywhere = (0..nprocs).all(|r| r == me || cma_ok[r as usize]);
    if single_copy_everywhere && params.free_list_max < 0 {
        engine.set_pool_limits(
            layout.eager_frags,
            max_pool_with_single_copy(params.max_send_size),
        );
    }
    let mut state = State::new(nprocs, peers, cma_ok);
    // Splitting a copy between two processes pays only when each has a
    // core of its own: on an oversubscribed node the two copies take
    // turns on the same cores, and the receiver waits for a sender that
    // may not be running (measured: 8 ranks on 2 cores, `btl stress
    // --max-size 8M`, 1.5–2.1 s split against 1.4 s not).
    let oversubscribed = crate::progress::oversubscribed(nprocs);
    state.split_min = if oversubscribed {
        0
    } else {
        params.cma_split_min as usize
    };
    let regtabs = (0..nprocs)
        .map(|r| {
            let at = layout.regtab_offset(r).map_err(engine::SetupError::from)?;
            RegionTable::resolve(&region, at as u64).map_err(engine::SetupError::from)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((
        Shm {
            engine,
            control,
            regtabs,
        },
        Rest { state, probe },
    ))
}

/// Who every local rank is: its pid (the wire-up's, which its record must
/// name, or the record's on its own), its start time (from the kernel, which
/// the record must match) and what its record said for the single-copy
/// probe. Our own pid is refused for a peer.
fn identify(
    infos: &[Option<RankInfo>],
    me: u32,
    pid: u32,
    start: u64,
    pids: Option<&[u32]>,
) -> Result<Vec<PeerId>, SmError> {
    let bad = |rank: u32, what: String| Err(SmError::Identity { rank, what });
    let mut peers = Vec::with_capacity(infos.len());
    for (r, info) in infos.iter().enumerate() {
        let r = r as u32;
        let Some(info) = info else {
            return bad(r, "no control record".into());
        };
        if r == me {
            peers.push(PeerId {
                pid,
                start,
                probe_addr: info.probe_addr,
                probe_value: info.probe_value,
            });
            continue;
        }
        let p = match pids {
            Some(p) => p[r as usize],
            None => match u32::try_from(info.pid) {
                Ok(p) if p != 0 => p,
                _ => return bad(r, format!("its control record names pid {}", info.pid)),
            },
        };
        if u64::from(p) != info.pid {
            return bad(
                r,
                format!(
                    "its control record names pid {}, but the wire-up says {p}",
                    info.pid
                ),
            );
        }
        if p == pid {
            return bad(r, format!("it claims our own pid {pid}"));
        }
        if peers.iter().any(|q: &PeerId| q.pid == p) {
            return bad(r, format!("it claims pid {p}, as another rank does"));
        }
        let kernel_start = match segment::process_start_time(p) {
            Some(t) => t,
            // No /proc here (our own start time is unknown too): only the
            // record's can be used.
            None if start == 0 && segment::process_alive(p, info.start) => info.start,
            None => {
                return Err(SmError::PeerDiedAtStart {
                    rank: r,
                    pid: u64::from(p),
                })
            }
        };
        if kernel_start != info.start {
            return bad(
                r,
                format!(
                    "its control record says pid {p} started at tick {}, the kernel says {kernel_start}",
                    info.start
                ),
            );
        }
        peers.push(PeerId {
            pid: p,
            start: kernel_start,
            probe_addr: info.probe_addr,
            probe_value: info.probe_value,
        });
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    #[test]
    fn the_single_copy_pool_keeps_128_kib_of_max_size_fragments() {
        assert_eq!(max_pool_with_single_copy(64 * 1024), 2);
        assert_eq!(max_pool_with_single_copy(32 * 1024), 4);
        assert_eq!(max_pool_with_single_copy(4096), 32);
        assert_eq!(max_pool_with_single_copy(1 << 20), 2);
        assert_eq!(max_pool_with_single_copy(0), 131_072);
    }

    /// A live process of ours to name as a peer, and its start time.
    fn peer() -> (Child, u32, u64) {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let start = segment::process_start_time(pid).unwrap();
        (child, pid, start)
    }

    fn info(pid: u32, start: u64) -> Option<RankInfo> {
        Some(RankInfo {
            pid: u64::from(pid),
            start,
            probe_addr: 0x1000,
            probe_value: 7,
        })
    }

    #[test]
    fn records_must_match_the_wireup_and_the_kernel() {
        let (mut child, cpid, cstart) = peer();
        let (me, mstart) = segment::current_process_identity();
        let wireup = [me, cpid];
        let ok = [info(me, mstart), info(cpid, cstart)];
        let peers = identify(&ok, 0, me, mstart, Some(&wireup)).unwrap();
        assert_eq!((peers[1].pid, peers[1].start), (cpid, cstart));
        assert_eq!((peers[1].probe_addr, peers[1].probe_value), (0x1000, 7));
        // Without a wire-up, the record alone (still checked by the kernel).
        assert_eq!(identify(&ok, 0, me, mstart, None).unwrap(), peers);

        let refused = |infos: [Option<RankInfo>; 2], pids: Option<&[u32]>, want: &str| {
            let err = identify(&infos, 0, me, mstart, pids)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}");
            assert!(err.contains("local rank 1"), "{err}");
        };
        // A record naming another process than the wire-up says.
        refused(
            [info(me, mstart), info(1, 1)],
            Some(&wireup),
            &format!("names pid 1, but the wire-up says {cpid}"),
        );
        // A record claiming our own pid (which would make single copy read
        // our own memory at addresses a peer chose).
        refused(
            [info(me, mstart), info(me, mstart)],
            None,
            &format!("claims our own pid {me}"),
        );
        // A record whose start time is not the process's (a recycled pid, or
        // a forgery).
        refused(
            [info(me, mstart), info(cpid, cstart + 1)],
            Some(&wireup),
            "the kernel says",
        );
        refused([info(me, mstart), info(0, 0)], None, "names pid 0");
        let _ = child.kill();
        let _ = child.wait();
        // A peer that is gone.
        let err = identify(&ok, 0, me, mstart, Some(&wireup)).unwrap_err();
        assert!(
            matches!(err, SmError::PeerDiedAtStart { rank: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn wireup_pids_are_checked() {
        let own = std::process::id();
        assert!(check_wireup_pids(&[own, own + 1], 0, 2, own).is_ok());
        for (pids, want) in [
            (vec![own], "gave 1 pids for 2"),
            (vec![own + 1, own + 2], "says our pid is"),
            (vec![own, own], "names our own pid"),
            (vec![own, 0], "names pid 0"),
        ] {
            let err = check_wireup_pids(&pids, 0, 2, own).unwrap_err().to_string();
            assert!(err.contains(want), "{pids:?}: {err}");
        }
        let err = check_wireup_pids(&[own, own + 1, own + 1], 0, 3, own).unwrap_err();
        assert!(err.to_string().contains("and for another rank"), "{err}");
    }
}
