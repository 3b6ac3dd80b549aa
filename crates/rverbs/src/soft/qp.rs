//! Queue pair cores: identity, the objects a QP uses (PD, CQs, SRQ,
//! context), its capabilities and attributes, and where the engine's
//! completions and events for it go (`QpEvents`). The transport state
//! itself lives in the device's engine, keyed by QP number.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::event::AsyncEventType;
use crate::qp_attr::{QpAttr, QpCaps, QpType};
use crate::resources::ResourceKind;
use crate::soft::context::{AsyncSource, ContextCore};
use crate::soft::cq::{CqCore, EventCounts};
use crate::soft::engine::{CqFull, QpEvents};
use crate::soft::pd::PdCore;
use crate::soft::srq::SrqCore;
use crate::wc::WorkCompletion;

/// One queue pair.
pub(crate) struct QpCore {
    pub(crate) qpn: u32,
    pub(crate) handle: u64,
    pub(crate) qp_type: QpType,
    pub(crate) ctx: Arc<ContextCore>,
    pub(crate) pd: Arc<PdCore>,
    pub(crate) send_cq: Arc<CqCore>,
    pub(crate) recv_cq: Arc<CqCore>,
    /// The SRQ its receive WRs come from, if any.
    pub(crate) srq: Option<Arc<SrqCore>>,
    pub(crate) caps: QpCaps,
    pub(crate) sq_sig_all: bool,
    pub(crate) user_data: u64,
    /// The attributes modify_qp set last (state excluded: the engine has it).
    pub(crate) attr: Mutex<QpAttr>,
    pub(crate) async_events: EventCounts,
    released: AtomicBool,
    /// Itself, for the async events it posts (their source).
    me: Weak<QpCore>,
}

impl QpCore {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: u32,
        qp_type: QpType,
        ctx: &Arc<ContextCore>,
        pd: &Arc<PdCore>,
        send_cq: &Arc<CqCore>,
        recv_cq: &Arc<CqCore>,
        srq: Option<&Arc<SrqCore>>,
        caps: QpCaps,
        sq_sig_all: bool,
        user_data: u64,
    ) -> Arc<QpCore> {
        let qp = Arc::new_cyclic(|me| QpCore {
            qpn,
            handle: ctx.device.new_handle(),
            qp_type,
            ctx: ctx.clone(),
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq: srq.cloned(),
            caps,
            sq_sig_all,
            user_data,
            attr: Mutex::new(QpAttr {
                cap: caps,
                ..QpAttr::default()
            }),
            async_events: EventCounts::default(),
            released: AtomicBool::new(false),
            me: me.clone(),
        });
        pd.users.add();
        send_cq.users.add();
        recv_cq.users.add();
        if let Some(s) = srq {
            s.users.add();
        }
        ctx.ledger.add(ResourceKind::Qp, qp.handle);
        qp
    }

    pub(crate) fn attr(&self) -> MutexGuard<'_, QpAttr> {
        self.attr.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Takes the QP off the wire and releases what it uses; idempotent.
    pub(crate) fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        self.ctx.device.engine.remove_qp(self.qpn);
        let me: *const QpCore = self;
        self.ctx
            .async_events
            .retain(|e| !matches!(&e.source, AsyncSource::Qp(w) if w.as_ptr() == me));
        self.pd.users.remove();
        self.send_cq.users.remove();
        self.recv_cq.users.remove();
        if let Some(s) = &self.srq {
            s.users.remove();
        }
        self.ctx.ledger.remove(ResourceKind::Qp, self.handle);
        self.ctx.device.qps.release();
    }
}

/// The engine delivers the QP's completions to its CQs and its events to
/// its context (SRQ_LIMIT_REACHED to its SRQ's).
impl QpEvents for QpCore {
    fn send_completion(&self, wc: WorkCompletion) -> Result<(), CqFull> {
        self.send_cq.push(wc, false).map_err(|_| CqFull)
    }

    fn recv_completion(&self, wc: WorkCompletion, solicited: bool) -> Result<(), CqFull> {
        self.recv_cq.push(wc, solicited).map_err(|_| CqFull)
    }

    fn qp_event(&self, event: AsyncEventType) {
        self.ctx.post_async(event, AsyncSource::Qp(self.me.clone()));
    }

    fn srq_limit_reached(&self) {
        if let Some(srq) = &self.srq {
            srq.ctx.post_async(
                AsyncEventType::SrqLimitReached,
                AsyncSource::Srq(Arc::downgrade(srq)),
            );
        }
    }
}

impl Drop for QpCore {
    fn drop(&mut self) {
        self.release();
    }
}
