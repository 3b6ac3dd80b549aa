//! The device context (`struct ibv_context`): queries, the factory of
//! channels, CQs and PDs, the async event descriptor, and resource accounting.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use crate::attr::{DeviceAttr, Gid, GidEntry, GidType, PortAttr};
use crate::error::{Error, ErrorKind, Rejected, Result, Verb};
use crate::resources::{LiveResource, ResourceCounts};
use crate::soft::context::ContextCore;
use crate::soft::device::{DEFAULT_PKEY, NUM_COMP_VECTORS, PORT_NUM};
use crate::soft::notify::Wait;
use crate::verbs::async_event::{pop_async, AsyncEvent};
use crate::verbs::channel::CompletionChannel;
use crate::verbs::cq::{CompletionQueue, CqBuilder};
use crate::verbs::device::Device;
use crate::verbs::pd::ProtectionDomain;

/// An open device context.
///
/// Every object made through a context — channels, CQs, PDs, MRs — holds the
/// context alive, so a Rust program cannot orphan them: dropping the
/// `Context` while children live only drops this handle, and the context is
/// released with its last child. This differs from C, where
/// `ibv_close_device` frees the context and nothing made through it (the C
/// ABI keeps that behaviour). [`close`](Self::close) makes the difference
/// visible: it refuses with EBUSY, naming what is still alive.
pub struct Context {
    pub(crate) core: Arc<ContextCore>,
}

impl Context {
    /// The device this context was opened on.
    pub fn device(&self) -> Device {
        Device {
            core: self.core.device.clone(),
        }
    }

    fn check_port(&self, verb: Verb, port: u8) -> Result<()> {
        self.core.device.check_alive(verb)?;
        if port != PORT_NUM {
            return Err(Error::invalid(
                verb,
                format!("port {port} does not exist; the device has port {PORT_NUM} only"),
            ));
        }
        Ok(())
    }

    /// Device attributes and limits (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        self.core.device.check_alive(Verb::QueryDevice)?;
        Ok(self.core.device.attr.clone())
    }

    /// Port attributes (`ibv_query_port`); the only port is 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.check_port(Verb::QueryPort, port)?;
        Ok(self.core.device.port_attr())
    }

    /// The GID at `index` of `port`'s table (`ibv_query_gid`).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        Ok(self.query_gid_entry(port, index)?.gid)
    }

    /// The whole GID table entry (`ibv_query_gid_ex`): GID, type RoCEv2,
    /// interface index.
    pub fn query_gid_entry(&self, port: u8, index: u32) -> Result<GidEntry> {
        self.check_port(Verb::QueryGid, port)?;
        let len = self.core.device.port.gid_tbl_len;
        if index >= len {
            return Err(Error::invalid(
                Verb::QueryGid,
                format!("GID index {index} is not below gid_tbl_len {len}"),
            ));
        }
        Ok(GidEntry {
            gid: self.core.device.gid,
            gid_index: index,
            port_num: u32::from(port),
            gid_type: GidType::RoceV2,
            ndev_ifindex: self.core.device.ifindex,
        })
    }

    /// Every non-empty GID entry of every port (`ibv_query_gid_table`).
    pub fn query_gid_table(&self) -> Result<Vec<GidEntry>> {
        let len = self.core.device.port.gid_tbl_len;
        (0..len)
            .map(|i| self.query_gid_entry(PORT_NUM, i))
            .collect()
    }

    /// The P_Key at `index` of `port`'s table (`ibv_query_pkey`).
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.check_port(Verb::QueryPkey, port)?;
        let len = self.core.device.port.pkey_tbl_len;
        if index >= len {
            return Err(Error::invalid(
                Verb::QueryPkey,
                format!("P_Key index {index} is not below pkey_tbl_len {len}"),
            ));
        }
        Ok(DEFAULT_PKEY)
    }

    /// Number of completion vectors (`context->num_comp_vectors`).
    pub fn num_comp_vectors(&self) -> u32 {
        NUM_COMP_VECTORS
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        CompletionChannel::create(&self.core)
    }

    /// Creates a CQ of at least `cqe` entries with no channel (`ibv_create_cq`).
    pub fn create_cq(&self, cqe: u32) -> Result<CompletionQueue> {
        self.cq_builder().cqe(cqe).build()
    }

    /// Builds a CQ with a channel, completion vector or user data.
    pub fn cq_builder(&self) -> CqBuilder<'_> {
        CqBuilder::new(&self.core)
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        ProtectionDomain::alloc(&self.core)
    }

    /// The async event descriptor (`context->async_fd`): poll it for
    /// readability; set `O_NONBLOCK` on it to make
    /// [`get_async_event`](Self::get_async_event) return `WouldBlock`.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.core.async_events.fd()
    }

    /// Waits for the next async event (`ibv_get_async_event`). With
    /// `O_NONBLOCK` set on [`async_fd`](Self::async_fd) and nothing pending it
    /// returns a `WouldBlock` error. After disassociation, once the
    /// `DEVICE_FATAL` event was read, it returns EIO.
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        pop_async(&self.core, Wait::Block)?.ok_or_else(|| {
            Error::new(
                Verb::GetAsyncEvent,
                ErrorKind::WouldBlock,
                "no async event pending",
            )
        })
    }

    /// As [`get_async_event`](Self::get_async_event), waiting at most `timeout`.
    pub fn get_async_event_timeout(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        pop_async(&self.core, Wait::timeout(timeout))
    }

    /// The next async event if one is pending, without waiting.
    pub fn try_get_async_event(&self) -> Result<Option<AsyncEvent>> {
        pop_async(&self.core, Wait::Poll)
    }

    /// How many objects of each kind made through this context are alive.
    pub fn resources(&self) -> ResourceCounts {
        self.core.ledger.counts()
    }

    /// The context's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// Every object made through this context still alive, with its handle.
    pub fn live_resources(&self) -> Vec<LiveResource> {
        self.core.ledger.list()
    }

    /// Closes the context (`ibv_close_device`). Refuses with EBUSY while
    /// objects made through it are alive (they hold the context; see the type
    /// docs), handing the context back.
    pub fn close(self) -> Result<(), Rejected<Context>> {
        let live = self.core.ledger.counts();
        if live.total() > 0 {
            let err = Error::busy(
                Verb::CloseDevice,
                format!("{live} made through this context still alive; destroy them first"),
            );
            return Err(Rejected::new(err, self));
        }
        Ok(())
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.core.device.name)
            .field("handle", &self.core.handle)
            .finish()
    }
}
