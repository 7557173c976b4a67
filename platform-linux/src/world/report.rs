//! The world's one-line reports for people ([`Report`]): what moves the
//! bytes (`World::describe`) and a run's counters (`World::summary`), read
//! from a borrowed view of the transports and the routes.

use super::Route;
use crate::sm::Sm;
use crate::tcp::Tcp;

/// What the reports read: a view of the world, borrowed for one report.
pub(super) struct Report<'a> {
    /// Number of ranks.
    pub(super) size: u32,
    /// Number of nodes the job spans.
    pub(super) nodes: usize,
    /// Ranks on our node, ourselves included.
    pub(super) local: usize,
    /// How each rank is reached.
    pub(super) route: &'a [Route],
    /// The shared-memory transport, if any peer uses it.
    pub(super) sm: Option<&'a Sm>,
    /// The TCP transport, if any peer uses it.
    pub(super) tcp: Option<&'a Tcp>,
}

impl Report<'_> {
    /// Ranks reached over TCP.
    fn tcp_peers(&self) -> usize {
        self.route.iter().filter(|r| **r == Route::Tcp).count()
    }

    /// `World::describe`'s line.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(sm) = self.sm {
            let how = if !sm.params().use_cma {
                "pipelined copy (use_cma=0)"
            } else if (0..sm.size()).any(|p| p != sm.rank() && sm.single_copy_to(p)) {
                "single copy (CMA) or pipelined, chosen by measurement"
            } else {
                "single copy refused by the kernel: pipelined copy"
            };
            parts.push(format!("sm to {} local rank(s), {how}", self.local - 1));
        }
        if let Some(t) = self.tcp {
            let remote = self.tcp_peers();
            parts.push(format!(
                "tcp to {remote} rank(s), listening on {}",
                t.published_addrs()
            ));
        }
        if parts.is_empty() {
            parts.push("no peers".into());
        }
        format!(
            "{} ranks on {} node(s); {}",
            self.size,
            self.nodes,
            parts.join("; ")
        )
    }

    /// `World::summary`'s line.
    pub(super) fn summary(&self) -> String {
        let sm_peers = self.local.saturating_sub(1);
        let tcp_peers = self.tcp_peers();
        let mut s = format!(
            "on {} node(s): shared memory to {sm_peers} rank(s), TCP to {tcp_peers} rank(s)",
            self.nodes
        );
        if let Some(sm) = self.sm {
            let cma = (0..sm.size())
                .filter(|&p| p != sm.rank() && sm.single_copy_to(p))
                .count();
            let (eager, max) = sm.pool_sizes();
            let (split, written) = sm.split_copies();
            let (msg_in, msg_alone, msg_out) = sm.split_messages();
            let (large_single, large_pipelined, large_timed) = sm.large_messages();
            s += &format!(
                " (sm: single copy to {cma}, {large_single} large message(s) sent by single \
                 copy, {large_pipelined} pipelined, {large_timed} pipelined to time it, {} \
                 one-sided transfer(s) by single copy ({} get(s) without asking), {split} \
                 get(s) split with the target, {written} B written into peers' split gets, \
                 {msg_in} message(s) received split with the sender, {msg_alone} split but read \
                 alone after waiting, {msg_out} sent split, {} \
                 sends queued behind a full ring, {} messages sent by fast box, {} box(es) \
                 handed out, fragments carved {eager} eager + {max} max-size, segment {} KiB \
                 reserved)",
                sm.rma_single_copies(),
                sm.direct_gets(),
                sm.queued_total(),
                sm.fbox_sent(),
                sm.boxes_handed_out(),
                sm.reserved_bytes().map_or(0, |b| b / 1024)
            );
        }
        if let Some(t) = self.tcp {
            s += &format!(
                " (tcp: {} connection(s) from strangers dropped)",
                t.rejected_connections()
            );
        }
        s
    }
}
