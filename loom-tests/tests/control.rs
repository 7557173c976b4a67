//! loom models of the control area: a rank's record published with
//! btl-core's real `RankRecord::publish` is seen by a peer's `read` whole
//! (every field, or not ready at all), and verdicts written with `accuse`
//! by two accusers at once are each taken exactly once by `take_verdict`.
#![cfg(loom)]

use btl_core::shm::Region;
use btl_core::sm::control::{Control, ControlHeader, RankInfo, RankRecord, Structure, Verdict};
use btl_core::sm::layout::{CONTROL_HEADER, CONTROL_RECORD};
use btl_core::sync::{AtomicU32, AtomicU64};
use btl_loom_tests::SegmentMemory;
use loom::sync::Arc;
use loom::thread;

const RANKS: u32 = 3;

/// Memory holding a control header and `RANKS` records, initialised in
/// place (loom's atomics must be constructed), `nprocs` set.
fn control_memory() -> Arc<SegmentMemory> {
    let mem = Arc::new(SegmentMemory::new(
        CONTROL_HEADER + RANKS as usize * CONTROL_RECORD,
    ));
    // SAFETY: no other thread yet; `mem` outlives the region.
    let region = unsafe { mem.region() };
    let u32s = || AtomicU32::new(0);
    let u64s = || AtomicU64::new(0);
    let header = ControlHeader {
        magic: u64s(),
        creator_pid: u64s(),
        creator_start: u64s(),
        version: u32s(),
        state: u32s(),
        nprocs: AtomicU32::new(RANKS),
        fbox_size: u32s(),
        fifo_size: u32s(),
        num_fifos: u32s(),
        lazy_free: u32s(),
        eager_limit: u32s(),
        max_send_size: u32s(),
        free_list_num: u32s(),
        free_list_inc: u32s(),
        max_procs: u32s(),
        fbox_max: u32s(),
        free_list_max: u32s(),
        total_bytes: u64s(),
    };
    // SAFETY: nothing else accesses the memory yet.
    unsafe { region.write_in_place(0, header) }.unwrap();
    for r in 0..RANKS as usize {
        let rec = RankRecord {
            pid: u64s(),
            start: u64s(),
            state: u32s(),
            flags: u32s(),
            probe_addr: u64s(),
            probe_value: u64s(),
            verdict: u64s(),
        };
        let at = (CONTROL_HEADER + r * CONTROL_RECORD) as u64;
        // SAFETY: as above.
        unsafe { region.write_in_place(at, rec) }.unwrap();
    }
    mem
}

fn control(region: Region<'_>) -> Control<'_> {
    let mut c = Control::new(region).unwrap();
    c.fix_nprocs(RANKS);
    c
}

const INFO: RankInfo = RankInfo {
    pid: 4242,
    start: 77,
    probe_addr: 0x7f00_0000_1000,
    probe_value: 0x6274_6c5f,
};

#[test]
fn a_record_seen_ready_is_seen_whole() {
    loom::model(|| {
        let mem = control_memory();
        let publisher = {
            let mem = mem.clone();
            thread::spawn(move || {
                // SAFETY: `mem` outlives the region; only atomics are used.
                let region = unsafe { mem.region() };
                control(region).record(1).unwrap().publish(&INFO);
            })
        };
        // SAFETY: as above.
        let region = unsafe { mem.region() };
        let c = control(region);
        let rec = c.record(1).unwrap();
        for _ in 0..3 {
            match rec.read() {
                Some(info) => {
                    assert_eq!(info, INFO, "a field of the record was not visible");
                    break;
                }
                None => thread::yield_now(),
            }
        }
        publisher.join().unwrap();
        assert_eq!(rec.read(), Some(INFO));
        // Leaving keeps the record readable, whole.
        rec.leave();
        assert_eq!(rec.read(), Some(INFO));
    });
}

#[test]
fn two_accusers_each_verdict_is_taken_once() {
    loom::model(|| {
        let mem = control_memory();
        let accusers: Vec<_> = [(0u32, Structure::RingSlot), (2, Structure::FragmentHeader)]
            .into_iter()
            .map(|(accuser, structure)| {
                let mem = mem.clone();
                thread::spawn(move || {
                    // SAFETY: `mem` outlives the region; only atomics.
                    let region = unsafe { mem.region() };
                    let c = control(region);
                    // Tries twice, as a liveness check retries.
                    (0..2).any(|_| {
                        let ok = c.record(1).unwrap().accuse(accuser, structure);
                        if !ok {
                            thread::yield_now();
                        }
                        ok
                    })
                })
            })
            .collect();
        // SAFETY: as above.
        let region = unsafe { mem.region() };
        let c = control(region);
        let rec = c.record(1).unwrap();
        let mut taken = Vec::new();
        let take = |taken: &mut Vec<(u32, Structure)>| {
            if let Some(v) = rec.take_verdict(1, RANKS) {
                match v {
                    Verdict::Accused { accuser, structure } => taken.push((accuser, structure)),
                    Verdict::Garbage { raw } => panic!("garbage verdict {raw:#x}"),
                }
            }
        };
        for _ in 0..2 {
            take(&mut taken);
            thread::yield_now();
        }
        let delivered: Vec<bool> = accusers.into_iter().map(|a| a.join().unwrap()).collect();
        take(&mut taken);
        let mut want = Vec::new();
        if delivered[0] {
            want.push((0, Structure::RingSlot));
        }
        if delivered[1] {
            want.push((2, Structure::FragmentHeader));
        }
        taken.sort_by_key(|t| t.0);
        assert_eq!(taken, want, "each delivered verdict taken exactly once");
        assert!(
            delivered.iter().any(|&d| d),
            "the first accuser always gets in"
        );
    });
}
