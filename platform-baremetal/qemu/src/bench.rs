//! The node's side of `btl bench` as rank 1 of 2 (btl-linux's
//! `bench::run_on`, platform-linux/src/bench.rs): for each size, a
//! ping-pong (answer every message with one of the same size) and a
//! windowed bandwidth run (acknowledge every window of 64 messages), each
//! between two barriers. Rank 0, on Linux, measures and prints.

use crate::job::{Job, JobError, TAG_ACK, TAG_DATA};
use crate::println;

/// Messages in flight in the bandwidth test (btl-linux's `WINDOW`).
const WINDOW: u64 = 64;

/// (ping-pong iterations, bandwidth windows) of btl-linux's `iterations`.
fn iterations(size: usize, quick: bool) -> (u64, u64) {
    let (lat, bw) = match size {
        0..=4096 => (20_000, 400),
        4097..=65_536 => (4_000, 100),
        65_537..=1_048_576 => (400, 20),
        _ => (100, 6),
    };
    if quick {
        ((lat / 20).max(4), (bw / 10).max(2))
    } else {
        (lat, bw)
    }
}

/// Answers rank 0's `btl bench` for every size in `sizes`; `buf` holds
/// the largest.
pub fn run(job: &mut Job, sizes: &[usize], quick: bool, buf: &[u8]) -> Result<(), JobError> {
    let peer = 0;
    let peers = [peer];
    job.await_peers(&peers)?;
    for &size in sizes {
        let data = buf
            .get(..size)
            .ok_or(JobError::Send(btl_baremetal::SendError::TooLarge {
                len: size,
                max: buf.len(),
            }))?;
        let (iters, windows) = iterations(size, quick);
        let warm = (iters / 10).max(2);
        job.barrier(&peers)?;
        job.st.data = 0;
        job.barrier(&peers)?;
        for i in 0..warm + iters {
            job.wait("the ping", &peers, |_, st| st.data > i)?;
            job.send(peer, TAG_DATA, data)?;
        }
        job.barrier(&peers)?;
        job.st.data = 0;
        job.st.acks = 0;
        job.barrier(&peers)?;
        for w in 0..windows {
            job.wait("a window of messages", &peers, |_, st| {
                st.data >= (w + 1) * WINDOW
            })?;
            job.send(peer, TAG_ACK, &[1])?;
        }
        println!("btl-qemu-node: bench: {size} B done ({iters} round trips, {windows} windows)");
    }
    job.barrier(&peers)?;
    job.flush()
}
