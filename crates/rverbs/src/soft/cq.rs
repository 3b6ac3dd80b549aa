//! Completion queues as the engine sees them: the bounded queue of work
//! completions the transport pushes into, the notification arm (next /
//! solicited only) that fires the completion channel, and the event counters
//! destroy checks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, ErrorKind, Verb};
use crate::event::AsyncEventType;
use crate::resources::ResourceKind;
use crate::soft::channel::ChannelCore;
use crate::soft::context::{AsyncSource, ContextCore};
use crate::soft::device::NUM_COMP_VECTORS;
use crate::soft::engine::PollerWait;
use crate::soft::Users;
use crate::wc::{WcStatus, WorkCompletion};

/// Events handed to the user and events the user acknowledged.
#[derive(Default)]
pub(crate) struct EventCounts {
    reported: AtomicU32,
    acked: AtomicU32,
}

impl EventCounts {
    pub(crate) fn report(&self) {
        self.reported.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn ack(&self) {
        self.acked.fetch_add(1, Ordering::AcqRel);
    }

    /// Events reported and not yet acknowledged.
    pub(crate) fn unacked(&self) -> u32 {
        let acked = self.acked.load(Ordering::Acquire);
        self.reported.load(Ordering::Acquire).wrapping_sub(acked)
    }

    /// Why a destroy of `object` must wait while some of these events
    /// (`kind`: "async", "completion") are unacknowledged — until the
    /// program drops the `handle`s it holds; `None` when none are.
    pub(crate) fn unacked_reason(
        &self,
        kind: &str,
        object: std::fmt::Arguments<'_>,
        handle: &str,
    ) -> Option<String> {
        let n = self.unacked();
        (n > 0).then(|| {
            format!("{n} {kind} event(s) of {object} not acknowledged (drop the {handle})")
        })
    }

    /// (reported, acked).
    pub(crate) fn totals(&self) -> (u32, u32) {
        (
            self.reported.load(Ordering::Acquire),
            self.acked.load(Ordering::Acquire),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    Disarmed,
    NextCompletion,
    SolicitedOnly,
}

struct CqState {
    entries: VecDeque<WorkCompletion>,
    capacity: u32,
    arm: Arm,
    overrun: bool,
}

/// The CQ was full: the completion was lost and the CQ is in error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CqOverrun;

/// One completion queue.
pub(crate) struct CqCore {
    pub(crate) handle: u64,
    pub(crate) ctx: Arc<ContextCore>,
    pub(crate) channel: Option<Arc<ChannelCore>>,
    /// `cq_context`: a value the user gets back with every event.
    pub(crate) user_data: u64,
    pub(crate) comp_vector: u32,
    state: Mutex<CqState>,
    pub(crate) comp_events: EventCounts,
    pub(crate) async_events: EventCounts,
    pub(crate) users: Users,
    released: AtomicBool,
    /// How threads that find it empty wait: spin, then park.
    pub(crate) wait: PollerWait,
}

fn check_cqe(ctx: &ContextCore, verb: Verb, cqe: u32) -> Result<(), Error> {
    let max = ctx.device.attr.max_cqe;
    if cqe == 0 || cqe > max {
        return Err(Error::invalid(
            verb,
            format!("cqe {cqe} is not in 1..={max} (max_cqe)"),
        ));
    }
    Ok(())
}

impl CqCore {
    pub(crate) fn create(
        ctx: &Arc<ContextCore>,
        cqe: u32,
        channel: Option<&Arc<ChannelCore>>,
        comp_vector: u32,
        user_data: u64,
    ) -> Result<Arc<CqCore>, Error> {
        let verb = Verb::CreateCq;
        let dev = &ctx.device;
        dev.check_alive(verb)?;
        check_cqe(ctx, verb, cqe)?;
        if comp_vector >= NUM_COMP_VECTORS {
            return Err(Error::invalid(
                verb,
                format!(
                    "comp_vector {comp_vector} is not below num_comp_vectors {NUM_COMP_VECTORS}"
                ),
            ));
        }
        if let Some(ch) = channel {
            if !Arc::ptr_eq(&ch.ctx, ctx) {
                return Err(Error::invalid(
                    verb,
                    format!(
                        "completion channel {} belongs to another context",
                        ch.handle
                    ),
                ));
            }
        }
        if !dev.cqs.try_acquire() {
            return Err(Error::new(
                verb,
                ErrorKind::OutOfMemory,
                format!(
                    "device {} has max_cq = {} CQs already",
                    dev.name, dev.attr.max_cq
                ),
            ));
        }
        if let Some(ch) = channel {
            // Attached only if the channel is not destroyed meanwhile: a
            // destroy racing with this either sees the CQ (EBUSY) or
            // refuses it here.
            if !ch.try_attach_cq() {
                dev.cqs.release();
                return Err(Error::invalid(
                    verb,
                    format!("completion channel {} was destroyed", ch.handle),
                ));
            }
        }
        let cq = Arc::new(CqCore {
            handle: dev.new_handle(),
            ctx: ctx.clone(),
            channel: channel.cloned(),
            user_data,
            comp_vector,
            state: Mutex::new(CqState {
                entries: VecDeque::new(),
                capacity: cqe,
                arm: Arm::Disarmed,
                overrun: false,
            }),
            comp_events: EventCounts::default(),
            async_events: EventCounts::default(),
            users: Users::default(),
            released: AtomicBool::new(false),
            wait: PollerWait::default(),
        });
        ctx.ledger.add(ResourceKind::Cq, cq.handle);
        Ok(cq)
    }

    fn lock(&self) -> MutexGuard<'_, CqState> {
        // CqState updates cannot be interrupted half-way by a panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a completion (the transport's entry point). A full CQ loses the
    /// completion, goes to error and raises IBV_EVENT_CQ_ERR once.
    /// `solicited`: the completion is for a message with the SE bit.
    pub(crate) fn push(
        self: &Arc<Self>,
        wc: WorkCompletion,
        solicited: bool,
    ) -> Result<(), CqOverrun> {
        let mut st = self.lock();
        if st.entries.len() >= st.capacity as usize {
            let first = !st.overrun;
            st.overrun = true;
            drop(st);
            if first {
                self.ctx
                    .post_async(AsyncEventType::CqErr, AsyncSource::Cq(Arc::downgrade(self)));
            }
            return Err(CqOverrun);
        }
        st.entries.push_back(wc);
        // An unsuccessful completion also fires a solicited-only arm (IBTA 11.4.2.2).
        let fire = match st.arm {
            Arm::Disarmed => false,
            Arm::NextCompletion => true,
            Arm::SolicitedOnly => solicited || wc.status != WcStatus::Success,
        };
        if fire {
            st.arm = Arm::Disarmed;
        }
        drop(st);
        // A thread parked while polling (this CQ or another of the device)
        // wakes up to look.
        self.ctx.device.engine.ring();
        if fire {
            if let Some(ch) = &self.channel {
                ch.queue.push(Arc::downgrade(self));
            }
        }
        Ok(())
    }

    /// Drops every completion of QP `qpn` still queued (the QP went to
    /// RESET); the others keep their order.
    pub(crate) fn purge_qp(&self, qpn: u32) {
        self.lock().entries.retain(|wc| wc.qp_num != qpn);
    }

    /// Moves up to `out.len()` completions into `out`, oldest first.
    pub(crate) fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.poll_and_arm_state(out).0
    }

    /// [`poll`](Self::poll), and whether the CQ is armed, under one lock.
    pub(crate) fn poll_and_arm_state(&self, out: &mut [WorkCompletion]) -> (usize, bool) {
        let mut st = self.lock();
        let n = out.len().min(st.entries.len());
        for (slot, wc) in out.iter_mut().zip(st.entries.drain(..n)) {
            *slot = wc;
        }
        (n, st.arm != Arm::Disarmed)
    }

    /// Arms the notification for the next completion (or the next solicited
    /// or unsuccessful one). Arming "next" over "solicited only" widens it.
    pub(crate) fn arm(&self, solicited_only: bool) {
        let mut st = self.lock();
        st.arm = match (st.arm, solicited_only) {
            (Arm::NextCompletion, _) | (_, false) => Arm::NextCompletion,
            (_, true) => Arm::SolicitedOnly,
        };
    }

    /// Changes the capacity; never below the completions now queued.
    pub(crate) fn resize(&self, cqe: u32) -> Result<(), Error> {
        let verb = Verb::ResizeCq;
        self.ctx.device.check_alive(verb)?;
        check_cqe(&self.ctx, verb, cqe)?;
        let mut st = self.lock();
        if (cqe as usize) < st.entries.len() {
            return Err(Error::invalid(
                verb,
                format!(
                    "cqe {cqe} is smaller than the {} completions waiting in the CQ",
                    st.entries.len()
                ),
            ));
        }
        st.capacity = cqe;
        Ok(())
    }

    /// Capacity (the `cqe` field).
    pub(crate) fn capacity(&self) -> u32 {
        self.lock().capacity
    }

    /// Completions waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether a completion was lost to a full CQ.
    #[cfg(test)]
    pub(crate) fn overrun(&self) -> bool {
        self.lock().overrun
    }

    /// Whether the CQ was destroyed.
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Releases the CQ: detaches it from its channel (dropping its pending
    /// notifications), drops its pending async events, returns the quota.
    /// Idempotent.
    pub(crate) fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        self.finish_release();
    }

    /// Releases the CQ if `idle` says nothing holds it, atomically with
    /// respect to its channel's readers: a reader cannot report a new
    /// completion event between the check and the release. `Err` carries
    /// what `idle` found.
    pub(crate) fn release_if_idle<E>(&self, idle: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mark = || {
            idle()?;
            Ok(!self.released.swap(true, Ordering::AcqRel))
        };
        let first = match &self.channel {
            Some(ch) => ch.queue.locked(mark)?,
            None => mark()?,
        };
        if first {
            self.finish_release();
        }
        Ok(())
    }

    fn finish_release(&self) {
        let me: *const CqCore = self;
        if let Some(ch) = &self.channel {
            ch.detach_cq(me);
        }
        self.ctx
            .async_events
            .retain(|e| !matches!(&e.source, AsyncSource::Cq(w) if w.as_ptr() == me));
        self.ctx.ledger.remove(ResourceKind::Cq, self.handle);
        self.ctx.device.cqs.release();
    }
}

impl Drop for CqCore {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::device;
    use crate::soft::notify::Wait;

    fn ctx() -> Arc<ContextCore> {
        let dev = device::list().unwrap().into_iter().next().unwrap();
        ContextCore::open(&dev).unwrap()
    }

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            ..Default::default()
        }
    }

    fn take_event(ch: &ChannelCore) -> Option<Arc<CqCore>> {
        ch.queue.pop_with(Wait::Poll, |w| w.upgrade()).unwrap()
    }

    #[test]
    fn push_poll_in_order_and_partial() {
        let ctx = ctx();
        let cq = CqCore::create(&ctx, 8, None, 0, 0).unwrap();
        for i in 0..5 {
            cq.push(wc(i), false).unwrap();
        }
        let mut out = [WorkCompletion::default(); 3];
        assert_eq!(cq.poll(&mut out), 3);
        assert_eq!(out.map(|w| w.wr_id), [0, 1, 2]);
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!(out[..2].iter().map(|w| w.wr_id).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(cq.poll(&mut out), 0);
    }

    #[test]
    fn overrun_loses_the_completion_and_raises_cq_err_once() {
        let ctx = ctx();
        let cq = CqCore::create(&ctx, 2, None, 0, 0).unwrap();
        cq.push(wc(1), false).unwrap();
        cq.push(wc(2), false).unwrap();
        assert_eq!(cq.push(wc(3), false), Err(CqOverrun));
        assert_eq!(cq.push(wc(4), false), Err(CqOverrun));
        assert!(cq.overrun());
        let events: Vec<_> = std::iter::from_fn(|| {
            ctx.async_events
                .pop_with(Wait::Poll, |e| Some(e.event_type))
                .unwrap()
        })
        .collect();
        assert_eq!(events, vec![AsyncEventType::CqErr]);
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut out), 2);
    }

    #[test]
    fn notification_fires_once_per_arm() {
        let ctx = ctx();
        let ch = ChannelCore::create(&ctx).unwrap();
        let cq = CqCore::create(&ctx, 16, Some(&ch), 0, 0).unwrap();
        cq.push(wc(1), false).unwrap();
        assert!(take_event(&ch).is_none(), "not armed: no event");
        cq.arm(false);
        cq.push(wc(2), false).unwrap();
        cq.push(wc(3), false).unwrap();
        assert!(Arc::ptr_eq(&take_event(&ch).unwrap(), &cq));
        assert!(take_event(&ch).is_none(), "one event per arm");
    }

    #[test]
    fn solicited_only_arm_ignores_unsolicited_successes() {
        let ctx = ctx();
        let ch = ChannelCore::create(&ctx).unwrap();
        let cq = CqCore::create(&ctx, 16, Some(&ch), 0, 0).unwrap();
        cq.arm(true);
        cq.push(wc(1), false).unwrap();
        assert!(take_event(&ch).is_none());
        cq.push(wc(2), true).unwrap();
        assert!(take_event(&ch).is_some());
        // An error completion fires a solicited-only arm too.
        cq.arm(true);
        let mut err = wc(3);
        err.status = WcStatus::RemAccessErr;
        cq.push(err, false).unwrap();
        assert!(take_event(&ch).is_some());
        // Arming "next" over "solicited only" widens it.
        cq.arm(true);
        cq.arm(false);
        cq.push(wc(4), false).unwrap();
        assert!(take_event(&ch).is_some());
    }

    #[test]
    fn release_detaches_from_channel_and_drops_pending_notifications() {
        let ctx = ctx();
        let ch = ChannelCore::create(&ctx).unwrap();
        let cq = CqCore::create(&ctx, 4, Some(&ch), 0, 0).unwrap();
        assert_eq!(ch.cq_count(), 1);
        cq.arm(false);
        cq.push(wc(1), false).unwrap();
        assert_eq!(ch.queue.len(), 1);
        cq.release();
        assert_eq!(ch.cq_count(), 0);
        assert_eq!(ch.queue.len(), 0);
        cq.release();
        assert_eq!(ch.cq_count(), 0, "release is idempotent");
    }

    /// Attaching a CQ and destroying the channel are one atomic step each:
    /// a destroyed channel takes no CQ, and one with a CQ is not destroyed.
    #[test]
    fn a_destroyed_channel_takes_no_cq_and_one_with_a_cq_stays() {
        let ctx = ctx();
        let ch = ChannelCore::create(&ctx).unwrap();
        let cq = CqCore::create(&ctx, 4, Some(&ch), 0, 0).unwrap();
        assert_eq!(ch.try_release(), Err(Some(1)));
        assert!(!ch.is_released());
        cq.release();
        assert_eq!(ch.try_release(), Ok(()));
        assert_eq!(ch.try_release(), Err(None), "released once");
        let cqs_before = ctx.device.cqs.used();
        let Err(err) = CqCore::create(&ctx, 4, Some(&ch), 0, 0) else {
            panic!("a CQ on a destroyed channel");
        };
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(ch.cq_count(), 0);
        assert_eq!(
            ctx.device.cqs.used(),
            cqs_before,
            "the CQ quota is returned"
        );
    }

    #[test]
    fn resize_bounds() {
        let ctx = ctx();
        let cq = CqCore::create(&ctx, 4, None, 0, 0).unwrap();
        for i in 0..3 {
            cq.push(wc(i), false).unwrap();
        }
        assert_eq!(cq.resize(2).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(cq.resize(0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        cq.resize(3).unwrap();
        assert_eq!(cq.capacity(), 3);
        assert_eq!(cq.push(wc(9), false), Err(CqOverrun));
        cq.resize(100).unwrap();
        cq.push(wc(10), false).unwrap();
        assert_eq!(cq.len(), 4);
    }
}
