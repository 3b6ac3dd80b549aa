//! Completion queues (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`,
//! `ibv_resize_cq`, `ibv_destroy_cq`).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Rejected, Result, Verb};
use crate::soft::context::ContextCore;
use crate::soft::cq::CqCore;
use crate::soft::device::DestroyPath;
use crate::soft::engine::Parked;
use crate::verbs::channel::CompletionChannel;
use crate::wc::WorkCompletion;

/// Builds a CQ: size, optional completion channel, completion vector and
/// user data (`cq_context`).
#[must_use]
pub struct CqBuilder<'a> {
    ctx: &'a Arc<ContextCore>,
    cqe: u32,
    channel: Option<&'a CompletionChannel>,
    comp_vector: u32,
    user_data: u64,
}

impl<'a> CqBuilder<'a> {
    pub(crate) fn new(ctx: &'a Arc<ContextCore>) -> Self {
        CqBuilder {
            ctx,
            cqe: 1,
            channel: None,
            comp_vector: 0,
            user_data: 0,
        }
    }

    /// Minimum number of entries (1..=`max_cqe`; default 1).
    pub fn cqe(mut self, cqe: u32) -> Self {
        self.cqe = cqe;
        self
    }

    /// Deliver completion events to `channel` (same context).
    pub fn channel(mut self, channel: &'a CompletionChannel) -> Self {
        self.channel = Some(channel);
        self
    }

    /// Completion vector (below `num_comp_vectors`; default 0).
    pub fn comp_vector(mut self, comp_vector: u32) -> Self {
        self.comp_vector = comp_vector;
        self
    }

    /// A value returned with every event of this CQ (`cq_context`).
    pub fn user_data(mut self, user_data: u64) -> Self {
        self.user_data = user_data;
        self
    }

    /// Creates the CQ.
    pub fn build(self) -> Result<CompletionQueue> {
        Ok(CompletionQueue {
            core: CqCore::create(
                self.ctx,
                self.cqe,
                self.channel.map(|c| &c.core),
                self.comp_vector,
                self.user_data,
            )?,
        })
    }
}

/// A completion queue.
///
/// It keeps its context and channel alive. Destroy it explicitly with
/// [`destroy`](Self::destroy) to learn of EBUSY; dropping it releases it
/// once no QP uses it any more.
pub struct CompletionQueue {
    pub(crate) core: Arc<CqCore>,
}

impl CompletionQueue {
    /// The CQ's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// Its capacity (the `cqe` field).
    pub fn cqe(&self) -> u32 {
        self.core.capacity()
    }

    /// The user data it was created with.
    pub fn user_data(&self) -> u64 {
        self.core.user_data
    }

    /// Its completion vector.
    pub fn comp_vector(&self) -> u32 {
        self.core.comp_vector
    }

    /// Moves up to `wc.len()` completions, oldest first, into `wc`; returns
    /// how many (`ibv_poll_cq`). Completions already queued stay readable
    /// after a disassociation.
    ///
    /// A thread that polls an empty CQ again and again is waiting: after
    /// spinning for a while (as long as spinning has paid off on this CQ of
    /// late), it sleeps in the call until a packet arrives or a completion
    /// lands, a timer is due, or 12 ms have passed — so on a busy
    /// host it does not take the core from the peer it waits for. It never
    /// sleeps on the first empty poll after a completion (the end of a
    /// "poll until empty" loop), nor while completions land in other CQs of
    /// the device, and a program that polls now and then, between other
    /// work, never sleeps here. `RVERBS_POLL_PARK=0` turns sleeping off:
    /// pollers spin as they did before.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let core = &self.core;
        let engine = &core.ctx.device.engine;
        crate::soft::engine::note_poll(core.handle);
        let (n, armed) = core.poll_and_arm_state(wc);
        if n > 0 {
            crate::soft::engine::note_found();
        }
        if n > 0 || wc.is_empty() {
            // The clock is read only if a wait ends here.
            if n > 0 && core.wait.waiting() {
                core.wait.found(engine.nanos_at(Instant::now()));
            }
            return Ok(n);
        }
        let mut now = Instant::now();
        // A thread polling an empty CQ it has not armed counts as
        // busy-polling: the device's engine thread leaves the network to it
        // for a while.
        let polling = !armed;
        if polling {
            let t = engine.nanos_at(now);
            engine.note_busy_poll(t);
            if engine.may_park() && core.wait.empty(t, engine.pushed()) {
                if engine.park(now, core.handle, || core.len() > 0) != Parked::No {
                    core.wait.parking();
                }
                now = Instant::now();
                core.wait.woke(engine.nanos_at(now));
            }
        }
        // Nothing yet: drive the device's progress on this thread if no one
        // else is, so a busy-polling program needs no second spinning thread.
        engine.try_progress(polling, now);
        let n = core.poll(wc);
        if n > 0 {
            // Found by this call's own pass: at the time it began.
            core.wait.found(engine.nanos_at(now));
            crate::soft::engine::note_found();
        } else if polling {
            // Still nothing: a thread that may be waiting for this core
            // (the peer, on a crowded host) gets it now and then.
            engine.yield_while_spinning(now, &core.wait);
        }
        Ok(n)
    }

    /// Arms the notification: the next completion (or, with
    /// `solicited_only`, the next solicited or unsuccessful one) queues one
    /// event on the CQ's channel (`ibv_req_notify_cq`). Completions already
    /// in the CQ do not fire it: poll after arming.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let dev = &self.core.ctx.device;
        dev.check_alive(Verb::ReqNotifyCq)?;
        self.core.arm(solicited_only);
        // The application is about to sleep: the engine thread must watch
        // the network for it.
        dev.engine.app_will_sleep();
        Ok(())
    }

    /// Changes the capacity (`ibv_resize_cq`): 1..=`max_cqe` and not below
    /// the completions now queued, else EINVAL.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        self.core.resize(cqe)
    }

    /// Completion events (reported, acknowledged) so far.
    pub fn comp_events(&self) -> (u32, u32) {
        self.core.comp_events.totals()
    }

    /// Async events (reported, acknowledged) so far.
    pub fn async_events(&self) -> (u32, u32) {
        self.core.async_events.totals()
    }

    /// Destroys the CQ (`ibv_destroy_cq`). Fails with EBUSY, handing the CQ
    /// back, while a QP uses it or while a [`CqEvent`](crate::CqEvent) or
    /// [`AsyncEvent`](crate::AsyncEvent) for it is unacknowledged.
    pub fn destroy(self) -> Result<(), Rejected<CompletionQueue>> {
        let verb = Verb::DestroyCq;
        match self.core.ctx.device.destroy_path(verb) {
            Err(e) => return Err(Rejected::new(e, self)),
            Ok(DestroyPath::Forced) => {}
            Ok(DestroyPath::Checked) => {
                let core = &self.core;
                // Checked and released under the channel's lock: no reader
                // hands out an event for this CQ in between.
                let checked = core.release_if_idle(|| {
                    let users = core.users.count();
                    if users > 0 {
                        return Err(format!("{users} QP(s) use CQ {}", core.handle));
                    }
                    let handle = core.handle;
                    let why = core
                        .comp_events
                        .unacked_reason("completion", format_args!("CQ {handle}"), "CqEvent")
                        .or_else(|| {
                            let cq = format_args!("CQ {handle}");
                            core.async_events.unacked_reason("async", cq, "AsyncEvent")
                        });
                    why.map_or(Ok(()), Err)
                });
                if let Err(why) = checked {
                    return Err(Rejected::new(Error::busy(verb, why), self));
                }
                return Ok(());
            }
        }
        self.core.release();
        Ok(())
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("handle", &self.core.handle)
            .field("cqe", &self.core.capacity())
            .finish()
    }
}
