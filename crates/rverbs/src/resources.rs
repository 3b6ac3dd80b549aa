//! Per-context resource accounting: which verbs objects made through a context
//! are still alive. The C ABI's leak report and the stats command read it.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;

/// The kinds of objects a context owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ResourceKind {
    /// Protection domain.
    Pd,
    /// Memory region.
    Mr,
    /// Memory window.
    Mw,
    /// Completion queue.
    Cq,
    /// Queue pair.
    Qp,
    /// Shared receive queue.
    Srq,
    /// Address handle.
    Ah,
    /// Completion channel.
    CompChannel,
}

impl ResourceKind {
    /// Short name, as in a leak report.
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Pd => "PD",
            ResourceKind::Mr => "MR",
            ResourceKind::Mw => "MW",
            ResourceKind::Cq => "CQ",
            ResourceKind::Qp => "QP",
            ResourceKind::Srq => "SRQ",
            ResourceKind::Ah => "AH",
            ResourceKind::CompChannel => "completion channel",
        }
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One live object: its kind and its device-unique handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LiveResource {
    /// What it is.
    pub kind: ResourceKind,
    /// Its handle, unique on the device (the C struct's 32-bit `handle`
    /// field holds its low bits).
    pub handle: u64,
}

/// How many objects of each kind a context has alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceCounts {
    /// Protection domains.
    pub pds: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Memory windows.
    pub mws: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Address handles.
    pub ahs: usize,
    /// Completion channels.
    pub comp_channels: usize,
}

impl ResourceCounts {
    /// Total number of live objects.
    pub fn total(&self) -> usize {
        self.pds
            + self.mrs
            + self.mws
            + self.cqs
            + self.qps
            + self.srqs
            + self.ahs
            + self.comp_channels
    }

    fn slot(&mut self, kind: ResourceKind) -> &mut usize {
        match kind {
            ResourceKind::Pd => &mut self.pds,
            ResourceKind::Mr => &mut self.mrs,
            ResourceKind::Mw => &mut self.mws,
            ResourceKind::Cq => &mut self.cqs,
            ResourceKind::Qp => &mut self.qps,
            ResourceKind::Srq => &mut self.srqs,
            ResourceKind::Ah => &mut self.ahs,
            ResourceKind::CompChannel => &mut self.comp_channels,
        }
    }
}

impl fmt::Display for ResourceCounts {
    /// "1 PD, 2 CQs" style, or "nothing" when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            (self.pds, "PD", "PDs"),
            (self.mrs, "MR", "MRs"),
            (self.mws, "MW", "MWs"),
            (self.cqs, "CQ", "CQs"),
            (self.qps, "QP", "QPs"),
            (self.srqs, "SRQ", "SRQs"),
            (self.ahs, "AH", "AHs"),
            (
                self.comp_channels,
                "completion channel",
                "completion channels",
            ),
        ];
        let mut first = true;
        for (n, one, many) in parts {
            if n == 0 {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{n} {}", if n == 1 { one } else { many })?;
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

/// The set of live objects of one context.
#[derive(Debug, Default)]
pub(crate) struct ResourceLedger {
    live: Mutex<BTreeSet<LiveResource>>,
}

impl ResourceLedger {
    pub(crate) fn add(&self, kind: ResourceKind, handle: u64) {
        self.lock().insert(LiveResource { kind, handle });
    }

    pub(crate) fn remove(&self, kind: ResourceKind, handle: u64) {
        self.lock().remove(&LiveResource { kind, handle });
    }

    pub(crate) fn counts(&self) -> ResourceCounts {
        let mut counts = ResourceCounts::default();
        for r in self.lock().iter() {
            *counts.slot(r.kind) += 1;
        }
        counts
    }

    pub(crate) fn list(&self) -> Vec<LiveResource> {
        self.lock().iter().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<LiveResource>> {
        // The set is valid after any panic in another holder: nothing is half-updated.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_counts_and_lists() {
        let l = ResourceLedger::default();
        l.add(ResourceKind::Pd, 3);
        l.add(ResourceKind::Cq, 4);
        l.add(ResourceKind::Cq, 5);
        let c = l.counts();
        assert_eq!((c.pds, c.cqs, c.total()), (1, 2, 3));
        assert_eq!(c.to_string(), "1 PD, 2 CQs");
        l.remove(ResourceKind::Cq, 4);
        assert_eq!(
            l.list(),
            vec![
                LiveResource {
                    kind: ResourceKind::Pd,
                    handle: 3
                },
                LiveResource {
                    kind: ResourceKind::Cq,
                    handle: 5
                }
            ]
        );
        assert_eq!(ResourceCounts::default().to_string(), "nothing");
    }
}
