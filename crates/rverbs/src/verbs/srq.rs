//! Shared receive queues (`ibv_create_srq`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_post_srq_recv`, `ibv_destroy_srq`).

use std::fmt;
use std::sync::Arc;

use bitflags::bitflags;

use crate::error::{Error, ErrorDetail, ErrorKind, Rejected, Result, Verb};
use crate::soft::srq::SrqCore;
use crate::soft::transport::{RecvWqe, SgeList};
use crate::verbs::pd::ProtectionDomain;
use crate::wr::RecvWr;

/// Sizes and limit of an SRQ (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Most receive WRs the SRQ holds.
    pub max_wr: u32,
    /// Most SGEs per receive WR.
    pub max_sge: u32,
    /// The armed limit: once fewer WRs than this remain, the context gets
    /// one [`AsyncEventType::SrqLimitReached`](crate::AsyncEventType) and
    /// the limit disarms (reads back 0). 0 = not armed.
    pub srq_limit: u32,
}

bitflags! {
    /// `enum ibv_srq_attr_mask`: what a modify changes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// Resize to `max_wr`.
        const MAX_WR = 1;
        /// Arm `srq_limit`.
        const LIMIT = 1 << 1;
    }
}

/// A shared receive queue: QPs built with
/// [`QpBuilder::srq`](crate::QpBuilder::srq) take their receive WRs from it.
///
/// It keeps its PD and context alive; QPs using it keep it alive. Dropping
/// it destroys it once no QP uses it; [`destroy`](Self::destroy) reports
/// EBUSY while one does.
pub struct SharedReceiveQueue {
    pub(crate) core: Arc<SrqCore>,
}

impl ProtectionDomain {
    /// Creates a shared receive queue (`ibv_create_srq`). `max_wr` and
    /// `max_sge` above the device's `max_srq_wr` / `max_srq_sge`, or a
    /// `srq_limit` above `max_wr`, are EINVAL; more than `max_srq` SRQs is
    /// ENOMEM.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<SharedReceiveQueue> {
        self.create_srq_with(attr, 0)
    }

    /// The same, with a value returned in its async events (`srq_context`).
    pub fn create_srq_with(&self, attr: SrqAttr, user_data: u64) -> Result<SharedReceiveQueue> {
        let verb = Verb::CreateSrq;
        let pd = &self.core;
        let dev = &pd.ctx.device;
        dev.check_alive(verb)?;
        let a = &dev.attr;
        if attr.max_wr == 0 || attr.max_wr > a.max_srq_wr {
            return Err(Error::invalid(
                verb,
                format!(
                    "max_wr {} is not in 1..={} (max_srq_wr)",
                    attr.max_wr, a.max_srq_wr
                ),
            ));
        }
        if attr.max_sge == 0 || attr.max_sge > a.max_srq_sge {
            return Err(Error::invalid(
                verb,
                format!(
                    "max_sge {} is not in 1..={} (max_srq_sge)",
                    attr.max_sge, a.max_srq_sge
                ),
            ));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(Error::invalid(
                verb,
                format!(
                    "srq_limit {} exceeds max_wr {}",
                    attr.srq_limit, attr.max_wr
                ),
            ));
        }
        if !dev.srqs.try_acquire() {
            return Err(Error::new(
                verb,
                ErrorKind::OutOfMemory,
                format!(
                    "device {} has max_srq = {} SRQs already",
                    dev.name, a.max_srq
                ),
            ));
        }
        let core = SrqCore::new(
            &pd.ctx,
            pd,
            attr.max_wr,
            attr.max_sge,
            attr.srq_limit,
            user_data,
        );
        Ok(SharedReceiveQueue { core })
    }
}

impl SharedReceiveQueue {
    /// The SRQ's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// The user data it was created with.
    pub fn user_data(&self) -> u64 {
        self.core.user_data
    }

    /// QPs taking their receive WRs from it.
    pub fn users(&self) -> u32 {
        self.core.users.count()
    }

    /// Async events (reported, acknowledged) so far.
    pub fn async_events(&self) -> (u32, u32) {
        self.core.async_events.totals()
    }

    /// Resizes the SRQ and/or arms its limit (`ibv_modify_srq`). EINVAL for
    /// an unknown mask bit, a `max_wr` beyond the device's or below the WRs
    /// queued or the armed limit, or a limit above `max_wr`.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let verb = Verb::ModifySrq;
        let dev = &self.core.ctx.device;
        dev.check_alive(verb)?;
        let unknown = mask.difference(SrqAttrMask::all());
        if !unknown.is_empty() {
            return Err(Error::invalid(
                verb,
                format!("mask bits {:#x} are not SRQ attributes", unknown.bits()),
            ));
        }
        let mut q = self.core.queue.lock();
        let max_wr = if mask.contains(SrqAttrMask::MAX_WR) {
            if attr.max_wr == 0 || attr.max_wr > dev.attr.max_srq_wr {
                return Err(Error::invalid(
                    verb,
                    format!(
                        "max_wr {} is not in 1..={} (max_srq_wr)",
                        attr.max_wr, dev.attr.max_srq_wr
                    ),
                ));
            }
            if (attr.max_wr as usize) < q.occupied() {
                return Err(Error::invalid(
                    verb,
                    format!(
                        "max_wr {} is below the {} WRs queued",
                        attr.max_wr,
                        q.occupied()
                    ),
                ));
            }
            attr.max_wr
        } else {
            q.max_wr
        };
        let limit = if mask.contains(SrqAttrMask::LIMIT) {
            attr.srq_limit
        } else {
            q.limit
        };
        if limit > max_wr {
            return Err(Error::invalid(
                verb,
                format!("srq_limit {limit} exceeds max_wr {max_wr}"),
            ));
        }
        q.max_wr = max_wr;
        q.limit = limit;
        Ok(())
    }

    /// The SRQ's attributes (`ibv_query_srq`): `srq_limit` is 0 once the
    /// limit fired.
    pub fn query(&self) -> Result<SrqAttr> {
        self.core.ctx.device.check_alive(Verb::QuerySrq)?;
        let q = self.core.queue.lock();
        Ok(SrqAttr {
            max_wr: q.max_wr,
            max_sge: self.core.max_sge,
            srq_limit: q.limit,
        })
    }

    /// Receive WRs queued and not yet taken by a QP.
    pub fn len(&self) -> usize {
        self.core.queue.lock().wqes.len()
    }

    /// Whether no receive WR is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Posts one receive WR (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.post_recv_list(std::slice::from_ref(wr))
    }

    /// Posts receive WRs in order; a refused one carries
    /// [`ErrorDetail::BadWr`] (the ones before it were posted): ENOMEM when
    /// the SRQ is full, EINVAL with too many SGEs.
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let verb = Verb::PostSrqRecv;
        let core = &self.core;
        if core.ctx.device.is_disassociated() {
            return Err(Error::new(
                verb,
                ErrorKind::Io,
                format!("device {} was disassociated", core.ctx.device.name),
            ));
        }
        let mut q = core.queue.lock();
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |kind, msg: String| {
                Err(Error::new(verb, kind, msg).with_detail(ErrorDetail::BadWr { index }))
            };
            if q.occupied() >= q.max_wr as usize {
                return fail(
                    ErrorKind::OutOfMemory,
                    format!("SRQ full ({} WRs)", q.max_wr),
                );
            }
            if wr.sg_list.len() > core.max_sge as usize {
                return fail(
                    ErrorKind::InvalidArgument,
                    format!("{} SGEs exceed max_sge {}", wr.sg_list.len(), core.max_sge),
                );
            }
            q.wqes.push_back(RecvWqe {
                wr_id: wr.wr_id,
                sges: SgeList::from_slice(wr.sg_list),
                length: wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
                pd: core.pd.handle,
            });
        }
        Ok(())
    }

    /// Destroys the SRQ (`ibv_destroy_srq`). EBUSY, handing it back, while a
    /// QP uses it or an [`AsyncEvent`](crate::AsyncEvent) for it is
    /// unacknowledged.
    pub fn destroy(self) -> Result<(), Rejected<SharedReceiveQueue>> {
        let core = &self.core;
        let checked = core.ctx.device.may_destroy(Verb::DestroySrq, || {
            let users = core.users.count();
            if users > 0 {
                return Some(format!("{users} QP(s) still use SRQ {}", core.handle));
            }
            let srq = format_args!("SRQ {}", core.handle);
            core.async_events.unacked_reason("async", srq, "AsyncEvent")
        });
        if let Err(e) = checked {
            return Err(Rejected::new(e, self));
        }
        self.core.release();
        Ok(())
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // QPs using it hold the core: it is released when the last goes.
        if self.core.users.count() == 0 {
            self.core.release();
        }
    }
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("handle", &self.core.handle)
            .field("users", &self.core.users.count())
            .finish()
    }
}
