//! Address handles (`ibv_create_ah`, `ibv_create_ah_from_wc`,
//! `ibv_init_ah_from_wc`, `ibv_destroy_ah`): where a UD send goes.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::attr::Gid;
use crate::error::{Error, ErrorDetail, Rejected, Result, Verb};
use crate::qp_attr::AhAttr;
use crate::resources::ResourceKind;
use crate::soft::device::{SoftDevice, GID_TABLE_LEN, PORT_NUM};
use crate::soft::pd::PdCore;
use crate::soft::transport::ud::GRH_LEN;
use crate::verbs::pd::ProtectionDomain;
use crate::wc::{WcFlags, WorkCompletion};

/// One address handle.
pub(crate) struct AhCore {
    pub(crate) handle: u64,
    pub(crate) pd: Arc<PdCore>,
    pub(crate) attr: AhAttr,
    released: AtomicBool,
}

impl AhCore {
    fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        self.pd.users.remove();
        self.pd.ctx.ledger.remove(ResourceKind::Ah, self.handle);
        self.pd.ctx.device.ahs.release();
    }
}

impl Drop for AhCore {
    fn drop(&mut self) {
        self.release();
    }
}

/// An address handle: a destination for UD sends
/// ([`SendWr::to`](crate::SendWr::to)). It keeps its PD alive; dropping it
/// destroys it.
pub struct AddressHandle {
    pub(crate) core: Arc<AhCore>,
}

/// Checks an address vector against the device: EINVAL for a GID index
/// beyond the table, another port, a zero GID, and (with
/// [`ErrorDetail::Unreachable`]) one of the other IP family or, from a
/// device on loopback, of another host (not one of this host's addresses).
pub(crate) fn check_ah_attr(dev: &SoftDevice, verb: Verb, av: &AhAttr) -> Result<()> {
    if u32::from(av.sgid_index) >= GID_TABLE_LEN {
        return Err(Error::invalid(
            verb,
            format!(
                "sgid_index {} is not below gid_tbl_len {GID_TABLE_LEN}",
                av.sgid_index
            ),
        ));
    }
    if av.port_num != PORT_NUM {
        return Err(Error::invalid(
            verb,
            format!("port {} does not exist", av.port_num),
        ));
    }
    let ip = av.dgid.to_ip();
    if av.dgid.is_zero() || ip.is_unspecified() {
        return Err(Error::invalid(
            verb,
            format!("dgid {} is not a RoCEv2 address", av.dgid),
        ));
    }
    let unreachable = |why: String| {
        Err(Error::invalid(verb, format!("dgid {}: {why}", av.dgid))
            .with_detail(ErrorDetail::Unreachable))
    };
    if ip.is_ipv4() != dev.addr.is_ipv4() {
        return unreachable(format!(
            "not reachable from {} {} (another IP family)",
            dev.name, dev.addr
        ));
    }
    // (One of this host's own addresses is reachable from loopback.)
    if dev.addr.is_loopback()
        && !ip.is_loopback()
        && !ip.is_multicast()
        && !crate::soft::link::address_usable(ip)
    {
        return unreachable(format!(
            "another host, but {} is on the loopback address {} (the default when \
             RVERBS_ADDR and /etc/rverbs/rverbs.toml name no address): set RVERBS_ADDR \
             to this host's address on the network that reaches it",
            dev.name, dev.addr
        ));
    }
    Ok(())
}

impl ProtectionDomain {
    /// Creates an address handle (`ibv_create_ah`). A bad GID index, port
    /// or GID is EINVAL; more than `max_ah` is ENOMEM.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        let verb = Verb::CreateAh;
        let pd = &self.core;
        let dev = &pd.ctx.device;
        dev.check_alive(verb)?;
        check_ah_attr(dev, verb, attr)?;
        if !dev.ahs.try_acquire() {
            return Err(Error::new(
                verb,
                crate::ErrorKind::OutOfMemory,
                format!(
                    "device {} has max_ah = {} AHs already",
                    dev.name, dev.attr.max_ah
                ),
            ));
        }
        let core = Arc::new(AhCore {
            handle: dev.new_handle(),
            pd: pd.clone(),
            attr: *attr,
            released: AtomicBool::new(false),
        });
        pd.users.add();
        pd.ctx.ledger.add(ResourceKind::Ah, core.handle);
        Ok(AddressHandle { core })
    }

    /// Creates an address handle that answers the sender of a received UD
    /// message (`ibv_create_ah_from_wc`): `grh` is the first 40 bytes of
    /// the receive buffer.
    pub fn create_ah_from_wc(&self, wc: &WorkCompletion, grh: &[u8]) -> Result<AddressHandle> {
        let attr = AddressHandle::attr_from_wc_on(&self.core.ctx.device, wc, grh)?;
        self.create_ah(&attr)
    }
}

impl AddressHandle {
    /// The AH's handle (unique on the device).
    pub fn handle(&self) -> u64 {
        self.core.handle
    }

    /// The address vector it was created with.
    pub fn attr(&self) -> AhAttr {
        self.core.attr
    }

    /// The address vector that answers the sender of a received UD message
    /// (`ibv_init_ah_from_wc`): the destination is the GRH's source, the
    /// local GID the one the GRH was sent to, traffic class and flow label
    /// from the GRH, hop limit 255. EINVAL without `IBV_WC_GRH`, for a GRH
    /// shorter than 40 bytes, or one that holds neither a valid IPv4 header
    /// (in bytes 20..40) nor an IPv6 header.
    pub fn attr_from_wc(ctx: &crate::Context, wc: &WorkCompletion, grh: &[u8]) -> Result<AhAttr> {
        Self::attr_from_wc_on(&ctx.core.device, wc, grh)
    }

    pub(crate) fn attr_from_wc_on(
        dev: &SoftDevice,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AhAttr> {
        let verb = Verb::CreateAhFromWc;
        if !wc.wc_flags.contains(WcFlags::GRH) {
            return Err(Error::invalid(
                verb,
                "the completion has no GRH (IBV_WC_GRH): RoCE needs one",
            ));
        }
        let Some(grh) = grh.get(..GRH_LEN) else {
            return Err(Error::invalid(
                verb,
                format!("a GRH is {GRH_LEN} bytes, not {}", grh.len()),
            ));
        };
        let (src, dst, tclass, flow) = if let Some((s, d, tos)) = ipv4_in_grh(grh) {
            (IpAddr::V4(s), IpAddr::V4(d), tos, 0)
        } else if grh[0] >> 4 == 6 {
            let w = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&grh[8..24]);
            d.copy_from_slice(&grh[24..40]);
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                ((w >> 20) & 0xff) as u8,
                w & 0xf_ffff,
            )
        } else {
            return Err(Error::invalid(
                verb,
                "the GRH holds neither an IPv4 nor an IPv6 header",
            ));
        };
        // The local GID the message was sent to: ours (or a multicast
        // group, answered from ours too).
        let to = Gid::from_ip(dst);
        let mine = Gid::from_ip(dev.addr);
        if to != mine && !dst.is_multicast() {
            return Err(Error::invalid(
                verb,
                format!("the GRH's destination {to} is not a GID of {}", dev.name),
            ));
        }
        Ok(AhAttr {
            dgid: Gid::from_ip(src),
            sgid_index: 0,
            hop_limit: 0xff,
            traffic_class: tclass,
            flow_label: flow,
            sl: wc.sl,
            port_num: PORT_NUM,
        })
    }

    /// Destroys the AH (`ibv_destroy_ah`).
    pub fn destroy(self) -> Result<(), Rejected<AddressHandle>> {
        // No checks: nothing holds an AH but the WRs that used it, which
        // copied its address at post time.
        if let Err(e) = self
            .core
            .pd
            .ctx
            .device
            .may_destroy(Verb::DestroyAh, || None)
        {
            return Err(Rejected::new(e, self));
        }
        self.core.release();
        Ok(())
    }
}

/// The source, destination and TOS of the IPv4 header in bytes 20..40 of a
/// GRH, if it holds one whose checksum is right (how rdma-core tells the
/// two GRH forms apart).
fn ipv4_in_grh(grh: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, u8)> {
    let h = grh.get(20..40)?;
    if h[0] != 0x45 {
        return None;
    }
    if rverbs_wire::icrc::ones_complement_sum(h) != 0xffff {
        return None;
    }
    let s = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
    let d = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
    Some((s, d, h[1]))
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("handle", &self.core.handle)
            .field("dgid", &self.core.attr.dgid)
            .finish()
    }
}
