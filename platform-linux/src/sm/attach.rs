//! Start-up: the segment rendezvous and attaching the engine (the seed's
//! `create_rndv_file` / `create_and_attach`; see the module docs of
//! [`super`]).

use std::path::PathBuf;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use btl_core::params::Params as _;
use btl_core::shm::Region;
use btl_core::sm::control::{Control, ControlError, RANK_READY};
use btl_core::sm::engine::{self, FragDesc, PeerSlot};
use btl_core::sm::layout::calc_sm_max_procs;
use btl_core::sm::layout::{segment_layout, SegmentLayout, PART_ALIGN};
use btl_core::sm::params::SmParams;
use btl_core::sync::{AtomicU64, Ordering};

use super::recv::State;
use super::*;
use crate::cma;
use crate::job::JobEnv;
use crate::segment::{self, Segment};

impl Sm {
    /// Joins the job's shared-memory transport on this node (see the module
    /// docs for the start-up sequence).
    pub fn init(job: &JobEnv, mut params: SmParams) -> Result<Sm, SmError> {
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
        let uid = rustix::process::getuid().as_raw();
        let dir = segment::segment_dir(Some(&job.session_dir))?;
        let path: PathBuf = dir.join(segment::segment_file_name(uid, &job.job, &job.node)?);
        let (pid, start) = segment::current_process_identity();

        let (mut seg, layout) = if me == 0 {
            for stale in segment::remove_stale(&dir, uid)? {
                log::warn!("removed stale segment {}", stale.display());
            }
            let max_procs = calc_sm_max_procs(&params, nprocs)?;
            let layout = segment_layout(&params, max_procs)?;
            let seg = Segment::create(&path, layout.total_bytes)?;
            let control = Control::new(seg.region())?;
            control.publish(
                &params,
                nprocs,
                max_procs,
                layout.total_bytes as u64,
                u64::from(pid),
                start,
            );
            (seg, layout)
        } else {
            let seg = Segment::open(&path, PART_ALIGN, attach_timeout)?;
            let deadline = Instant::now() + attach_timeout;
            let control = Control::new(seg.region())?;
            while !control.is_ready() {
                if Instant::now() > deadline {
                    return Err(SmError::AttachTimeout {
                        waited: attach_timeout,
                        missing: vec![0],
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let (p, n, max_procs) = control.read_params(&params)?;
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
            (seg, layout)
        };
        match Self::attach(
            &mut seg,
            layout,
            params,
            me,
            nprocs,
            pid,
            start,
            attach_timeout,
        ) {
            Ok(parts) => Ok(Sm {
                engine: parts.engine,
                control: parts.control,
                state: parts.state,
                segment: seg,
                _probe: parts.probe,
                params,
                me,
                nprocs,
                oversubscribed: crate::progress::oversubscribed(nprocs),
                failed: Vec::new(),
                departed: Vec::new(),
                to_report: Vec::new(),
                last_liveness: Instant::now(),
                timeout,
                rates: vec![BulkRates::default(); nprocs as usize],
                out: (0..nprocs).map(|_| PeerOut::default()).collect(),
                busy_peers: 0,
                limits: DEFAULT_QUEUE_LIMITS,
                unpins: Vec::new(),
                next_cookie: 0,
                next_req: 0,
            }),
            Err(e) => {
                // Never leave the file behind on a failed start.
                let _ = seg.unlink();
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attach(
        seg: &mut Segment,
        layout: SegmentLayout,
        params: SmParams,
        me: u32,
        nprocs: u32,
        pid: u32,
        start: u64,
        attach_timeout: Duration,
    ) -> Result<Parts, SmError> {
        let base = NonNull::new(seg.as_ptr()).ok_or(SmError::Unsupported("null mapping"))?;
        // SAFETY: the mapping (base, len) is owned by the `Segment` that the
        // returned `Sm` holds in its last-dropped field, so it outlives every
        // reference built from this region (engine, control); moving the
        // `Segment` value does not move the mapping. All access goes through
        // btl-core's atomics and byte copies.
        let region: Region<'static> = unsafe { Region::from_raw_parts(base, seg.len()) };
        let control = Control::new(region)?;

        // Our part, then our record.
        // SAFETY: no peer touches our part before our record says READY
        // (below); this process initialises it once.
        unsafe { engine::init_part(&region, &layout, &params, me) }?;
        let probe = Box::new(AtomicU64::new(0x6274_6c5f_7072_6f62 ^ u64::from(pid)));
        let rec = control.record(me)?;
        rec.pid.store(u64::from(pid), Ordering::Relaxed);
        rec.start.store(start, Ordering::Relaxed);
        rec.probe_addr
            .store(&*probe as *const AtomicU64 as u64, Ordering::Relaxed);
        rec.probe_value
            .store(probe.load(Ordering::Relaxed), Ordering::Relaxed);
        // Release: pairs with the Acquire loads of peers waiting for READY.
        rec.state.store(RANK_READY, Ordering::Release);

        // Wait for everyone.
        let deadline = Instant::now() + attach_timeout;
        let mut pids = vec![0u64; nprocs as usize];
        loop {
            let mut missing = Vec::new();
            for r in 0..nprocs {
                let rec = control.record(r)?;
                if rec.state.load(Ordering::Acquire) >= RANK_READY {
                    let p = rec.pid.load(Ordering::Relaxed);
                    let s = rec.start.load(Ordering::Relaxed);
                    pids[r as usize] = p;
                    if r != me && !segment::process_alive(p as u32, s) {
                        return Err(SmError::PeerDiedAtStart { rank: r, pid: p });
                    }
                } else {
                    missing.push(r);
                }
            }
            if missing.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(SmError::AttachTimeout {
                    waited: attach_timeout,
                    missing,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }

        let sizes = Engine::storage_sizes(&layout, nprocs)
            .ok_or(SmError::Unsupported("storage sizes overflow"))?;
        let engine = Engine::attach(
            &region,
            &layout,
            &params,
            me,
            nprocs,
            (0..sizes.peers).map(|_| PeerSlot::new()).collect(),
            (0..sizes.consumers).map(|_| None).collect(),
            vec![FragDesc::new(); sizes.descs],
            vec![0; sizes.pending],
        )?;

        // Single copy: permission probe against every peer.
        let mut cma_ok = vec![false; nprocs as usize];
        if params.use_cma {
            cma::allow_ptrace_from_any();
            let mut refused = Vec::new();
            for r in (0..nprocs).filter(|&r| r != me) {
                let rec = control.record(r)?;
                let addr = rec.probe_addr.load(Ordering::Relaxed) as usize;
                let want = rec.probe_value.load(Ordering::Relaxed);
                let mut got = [0u8; 8];
                match cma::read_remote(pids[r as usize] as u32, addr, &mut got) {
                    Ok(()) if u64::from_ne_bytes(got) == want => cma_ok[r as usize] = true,
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

        // The last rank to attach unlinks the file.
        let attached = control.header().attached.fetch_add(1, Ordering::AcqRel) + 1;
        if attached == nprocs {
            seg.unlink()?;
        }

        let state = State::new(nprocs, params.max_send_size as usize, pids, cma_ok);
        Ok(Parts {
            engine,
            control,
            state,
            probe,
        })
    }
}
