//! A device context as the engine sees it: the async event queue the device
//! posts to, the ledger of live objects, and the completion channels to
//! close when the device goes away.

use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, ErrorKind, Verb};
use crate::event::AsyncEventType;
use crate::resources::ResourceLedger;
use crate::soft::channel::ChannelCore;
use crate::soft::cq::CqCore;
use crate::soft::device::SoftDevice;
use crate::soft::notify::EventQueue;
use crate::soft::qp::QpCore;
use crate::soft::srq::SrqCore;

/// The object an async event is about. Objects are held weakly: an event
/// for an object destroyed before the event was read is dropped, as the
/// kernel drops it.
pub(crate) enum AsyncSource {
    Cq(Weak<CqCore>),
    Qp(Weak<QpCore>),
    Srq(Weak<SrqCore>),
    Port(u8),
    Device,
}

/// A queued async event.
pub(crate) struct AsyncEntry {
    pub(crate) event_type: AsyncEventType,
    pub(crate) source: AsyncSource,
}

/// One open context.
pub(crate) struct ContextCore {
    pub(crate) device: Arc<SoftDevice>,
    pub(crate) handle: u64,
    pub(crate) async_events: EventQueue<AsyncEntry>,
    pub(crate) ledger: ResourceLedger,
    channels: Mutex<Vec<Weak<ChannelCore>>>,
}

impl ContextCore {
    /// Opens a context on `device`.
    pub(crate) fn open(device: &Arc<SoftDevice>) -> Result<Arc<ContextCore>, Error> {
        let async_events = EventQueue::new()
            .map_err(|e| Error::from_errno(Verb::OpenDevice, e, "async event descriptor"))?;
        let ctx = Arc::new(ContextCore {
            device: device.clone(),
            handle: device.new_handle(),
            async_events,
            ledger: ResourceLedger::default(),
            channels: Mutex::new(Vec::new()),
        });
        if !device.register_context(&ctx) {
            return Err(Error::new(
                Verb::OpenDevice,
                ErrorKind::NoDevice,
                format!("device {} was disassociated", device.name),
            ));
        }
        // The engine thread watches the port for this context's events.
        if device.link_watch.is_some() {
            device.start_engine();
        }
        Ok(ctx)
    }

    /// Remembers a channel so disassociation can wake its readers.
    pub(crate) fn register_channel(&self, ch: &Arc<ChannelCore>) {
        let mut list = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(ch));
        if self.device.is_disassociated() {
            ch.queue.close();
        }
    }

    /// Queues an async event.
    pub(crate) fn post_async(&self, event_type: AsyncEventType, source: AsyncSource) {
        self.async_events.push(AsyncEntry { event_type, source });
    }

    /// The device went away: IBV_EVENT_DEVICE_FATAL, then every event reader
    /// of this context (async and completion channels) gets EIO once drained.
    pub(crate) fn device_fatal(&self) {
        self.post_async(AsyncEventType::DeviceFatal, AsyncSource::Device);
        self.async_events.close();
        let channels: Vec<_> = self
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for ch in channels {
            ch.queue.close();
        }
    }
}
