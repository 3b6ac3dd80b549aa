//! `rverbs devices` and `rverbs devinfo`: the devices and their attributes,
//! printed field for field as `ibv_devices` and `ibv_devinfo` print them, so
//! the output reads the same to anyone who knows those tools. Lines marked
//! "rverbs" are extra: where the software device's endpoint lives.

use std::io::Write;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use rverbs::{Device, DeviceCapFlags, Gid, GidType, LinkLayer, Mtu};

/// Options of `rverbs devinfo`, as ibv_devinfo's.
#[derive(Args, Debug)]
pub struct DevinfoArgs {
    /// Use this device (default: all devices).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub device: Option<String>,
    /// Use this port (default: all ports).
    #[arg(short = 'i', long = "ib-port", value_name = "PORT",
          value_parser = clap::value_parser!(u8).range(1..))]
    pub port: Option<u8>,
    /// Print only the device names.
    #[arg(short, long)]
    pub list: bool,
    /// Print all attributes.
    #[arg(short, long)]
    pub verbose: bool,
    /// One JSON array of devices (every attribute, ports and GIDs) instead
    /// of ibv_devinfo's text.
    #[arg(long)]
    pub json: bool,
}

/// `ibv_devices`: name and node GUID of every device.
pub fn devices(out: &mut impl Write) -> Result<()> {
    let list = rverbs::devices().context("Failed to get IB devices list")?;
    writeln!(out, "    {:<16}\t   node GUID", "device")?;
    writeln!(out, "    {:<16}\t----------------", "------")?;
    for d in &list {
        writeln!(out, "    {:<16}\t{:016x}", d.name(), d.guid())?;
    }
    // Each process has devices of its own: those of the programs running
    // now (this user's, this network namespace), from their counter
    // sockets.
    let mut running = rverbs::counters::running().unwrap_or_default();
    running.retain(|d| d.pid != std::process::id());
    if !running.is_empty() {
        writeln!(out)?;
        writeln!(out, "    {:<8}  {:<16}\taddress", "pid", "device")?;
        writeln!(out, "    {:<8}  {:<16}\t-------", "---", "------")?;
        for d in &running {
            writeln!(out, "    {:<8}  {:<16}\t{}", d.pid, d.device, d.addr)?;
        }
    }
    Ok(())
}

/// `ibv_devinfo`.
pub fn devinfo(args: &DevinfoArgs, out: &mut impl Write) -> Result<()> {
    let list = rverbs::devices().context("Failed to get IB devices list")?;
    if args.list {
        let n = list.len();
        writeln!(out, "{n} HCA{} found:", if n == 1 { "" } else { "s" })?;
        for d in &list {
            writeln!(out, "\t{}", d.name())?;
        }
        writeln!(out)?;
        return Ok(());
    }
    let chosen: Vec<&Device> = match &args.device {
        Some(name) => match list.iter().find(|d| d.name() == name) {
            Some(d) => vec![d],
            None => bail!("IB device '{name}' wasn't found"),
        },
        None if list.is_empty() => bail!("No IB devices found"),
        None => list.iter().collect(),
    };
    if args.json {
        let list = chosen
            .iter()
            .map(|d| device_json(d, args.port))
            .collect::<Result<Vec<_>>>()?;
        writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
        return Ok(());
    }
    for d in chosen {
        print_device(d, args, out)?;
    }
    Ok(())
}

/// One device as JSON: what `devinfo -v` prints, numbers as numbers.
fn device_json(dev: &Device, only_port: Option<u8>) -> Result<serde_json::Value> {
    use serde_json::json;
    let ctx = dev.open().context("Failed to open device")?;
    let a = ctx.query_device().context("Failed to query device props")?;
    if only_port.is_some_and(|p| p > a.phys_port_cnt) {
        bail!("Invalid port requested for device");
    }
    let caps: Vec<&str> = CAP_NAMES
        .iter()
        .filter(|(f, _)| a.device_cap_flags.contains(*f))
        .map(|(_, n)| *n)
        .collect();
    let gids: Vec<serde_json::Value> = ctx
        .query_gid_table()
        .context("Failed to query gid")?
        .iter()
        .filter(|e| !e.gid.is_zero())
        .map(|e| {
            json!({
                "index": e.gid_index,
                "gid": e.gid.to_string(),
                "type": match e.gid_type {
                    GidType::RoceV2 => "RoCE v2",
                    GidType::RoceV1 => "RoCE v1",
                    GidType::Ib => "IB",
                },
            })
        })
        .collect();
    let mut ports = Vec::new();
    for port in 1..=a.phys_port_cnt {
        if only_port.is_some_and(|p| p != port) {
            continue;
        }
        let p = ctx
            .query_port(port)
            .with_context(|| format!("Failed to query port {port} props"))?;
        ports.push(json!({
            "port": port,
            "state": p.state.name(),
            "max_mtu": p.max_mtu.bytes(),
            "active_mtu": p.active_mtu.bytes(),
            "link_layer": p.link_layer.name(),
            "lid": p.lid,
            "sm_lid": p.sm_lid,
            "max_msg_sz": p.max_msg_sz,
            "port_cap_flags": p.port_cap_flags.bits(),
            "bad_pkey_cntr": p.bad_pkey_cntr,
            "qkey_viol_cntr": p.qkey_viol_cntr,
            "pkey_tbl_len": p.pkey_tbl_len,
            "gid_tbl_len": p.gid_tbl_len,
            "active_width": width_str(p.active_width),
            "phys_state": phys_state_str(p.phys_state),
            "gids": gids,
        }));
    }
    Ok(json!({
        "hca_id": dev.name(),
        "transport": dev.transport_type().name(),
        "address": dev.addr().to_string(),
        "udp_port": rverbs::ROCE_V2_PORT,
        "interface": dev.interface(),
        "fw_ver": a.fw_ver,
        "node_guid": guid_str(a.node_guid),
        "sys_image_guid": guid_str(a.sys_image_guid),
        "vendor_id": a.vendor_id,
        "vendor_part_id": a.vendor_part_id,
        "hw_ver": a.hw_ver,
        "phys_port_cnt": a.phys_port_cnt,
        "max_mr_size": a.max_mr_size,
        "page_size_cap": a.page_size_cap,
        "max_qp": a.max_qp,
        "max_qp_wr": a.max_qp_wr,
        "device_cap_flags": a.device_cap_flags.bits(),
        "device_caps": caps,
        "max_sge": a.max_sge,
        "max_sge_rd": a.max_sge_rd,
        "max_cq": a.max_cq,
        "max_cqe": a.max_cqe,
        "max_mr": a.max_mr,
        "max_pd": a.max_pd,
        "max_qp_rd_atom": a.max_qp_rd_atom,
        "max_qp_init_rd_atom": a.max_qp_init_rd_atom,
        "max_res_rd_atom": a.max_res_rd_atom,
        "atomic_cap": a.atomic_cap.name(),
        "max_mw": a.max_mw,
        "max_mcast_grp": a.max_mcast_grp,
        "max_mcast_qp_attach": a.max_mcast_qp_attach,
        "max_total_mcast_qp_attach": a.max_total_mcast_qp_attach,
        "max_ah": a.max_ah,
        "max_srq": a.max_srq,
        "max_srq_wr": a.max_srq_wr,
        "max_srq_sge": a.max_srq_sge,
        "max_pkeys": a.max_pkeys,
        "local_ca_ack_delay": a.local_ca_ack_delay,
        "num_comp_vectors": ctx.num_comp_vectors(),
        "ports": ports,
    }))
}

fn guid_str(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

fn mtu_str(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m as u32)
}

fn width_str(w: u8) -> &'static str {
    match w {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

fn speed_str(s: u32) -> &'static str {
    match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        256 => "200.0 Gbps",
        _ => "invalid speed",
    }
}

fn vl_str(v: u8) -> &'static str {
    match v {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

fn phys_state_str(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

fn gid_line(gid: &Gid, index: u32, ty: GidType, link_layer: LinkLayer) -> String {
    let suffix = if link_layer == LinkLayer::Ethernet {
        match ty {
            GidType::RoceV2 => ", RoCE v2",
            GidType::RoceV1 | GidType::Ib => ", RoCE v1",
        }
    } else {
        ""
    };
    let text = match ty {
        GidType::RoceV2 => gid.to_string(),
        GidType::RoceV1 | GidType::Ib => gid
            .raw()
            .chunks(2)
            .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
            .collect::<Vec<_>>()
            .join(":"),
    };
    format!("\t\t\tGID[{index:>3}]:\t\t{text}{suffix}")
}

const CAP_NAMES: &[(DeviceCapFlags, &str)] = &[
    (DeviceCapFlags::RESIZE_MAX_WR, "RESIZE_MAX_WR"),
    (DeviceCapFlags::BAD_PKEY_CNTR, "BAD_PKEY_CNTR"),
    (DeviceCapFlags::BAD_QKEY_CNTR, "BAD_QKEY_CNTR"),
    (DeviceCapFlags::RAW_MULTI, "RAW_MULTI"),
    (DeviceCapFlags::AUTO_PATH_MIG, "AUTO_PATH_MIG"),
    (DeviceCapFlags::CHANGE_PHY_PORT, "CHANGE_PHY_PORT"),
    (DeviceCapFlags::UD_AV_PORT_ENFORCE, "UD_AV_PORT_ENFORCE"),
    (DeviceCapFlags::CURR_QP_STATE_MOD, "CURR_QP_STATE_MOD"),
    (DeviceCapFlags::SHUTDOWN_PORT, "SHUTDOWN_PORT"),
    (DeviceCapFlags::INIT_TYPE, "INIT_TYPE"),
    (DeviceCapFlags::PORT_ACTIVE_EVENT, "PORT_ACTIVE_EVENT"),
    (DeviceCapFlags::SYS_IMAGE_GUID, "SYS_IMAGE_GUID"),
    (DeviceCapFlags::RC_RNR_NAK_GEN, "RC_RNR_NAK_GEN"),
    (DeviceCapFlags::SRQ_RESIZE, "SRQ_RESIZE"),
    (DeviceCapFlags::N_NOTIFY_CQ, "N_NOTIFY_CQ"),
    (DeviceCapFlags::MEM_WINDOW, "MEM_WINDOW"),
    (DeviceCapFlags::UD_IP_CSUM, "UD_IP_CSUM"),
    (DeviceCapFlags::XRC, "XRC"),
    (DeviceCapFlags::MEM_MGT_EXTENSIONS, "MEM_MGT_EXTENSIONS"),
    (DeviceCapFlags::MEM_WINDOW_TYPE_2A, "MEM_WINDOW_TYPE_2A"),
    (DeviceCapFlags::MEM_WINDOW_TYPE_2B, "MEM_WINDOW_TYPE_2B"),
    (DeviceCapFlags::RC_IP_CSUM, "RC_IP_CSUM"),
    (DeviceCapFlags::RAW_IP_CSUM, "RAW_IP_CSUM"),
    (
        DeviceCapFlags::MANAGED_FLOW_STEERING,
        "MANAGED_FLOW_STEERING",
    ),
];

fn print_device(dev: &Device, args: &DevinfoArgs, out: &mut impl Write) -> Result<()> {
    let ctx = dev.open().context("Failed to open device")?;
    let a = ctx.query_device().context("Failed to query device props")?;
    if let Some(p) = args.port {
        if p > a.phys_port_cnt {
            bail!("Invalid port requested for device");
        }
    }
    writeln!(out, "hca_id:\t{}", dev.name())?;
    let t = dev.transport_type();
    writeln!(out, "\ttransport:\t\t\t{} ({})", t.name(), t as i32)?;
    writeln!(out, "\tfw_ver:\t\t\t\t{}", a.fw_ver)?;
    writeln!(out, "\tnode_guid:\t\t\t{}", guid_str(a.node_guid))?;
    writeln!(out, "\tsys_image_guid:\t\t\t{}", guid_str(a.sys_image_guid))?;
    writeln!(out, "\tvendor_id:\t\t\t0x{:04x}", a.vendor_id)?;
    writeln!(out, "\tvendor_part_id:\t\t\t{}", a.vendor_part_id)?;
    writeln!(out, "\thw_ver:\t\t\t\t0x{:X}", a.hw_ver)?;
    writeln!(out, "\tboard_id:\t\t\trverbs software RoCE")?;
    writeln!(out, "\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt)?;
    writeln!(
        out,
        "\tendpoint (rverbs):\t\t{}:{} UDP{}",
        dev.addr(),
        rverbs::ROCE_V2_PORT,
        dev.interface()
            .map(|i| format!(" on {i}"))
            .unwrap_or_default()
    )?;
    if args.verbose {
        writeln!(out, "\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size)?;
        writeln!(out, "\tpage_size_cap:\t\t\t0x{:x}", a.page_size_cap)?;
        writeln!(out, "\tmax_qp:\t\t\t\t{}", a.max_qp)?;
        writeln!(out, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr)?;
        writeln!(
            out,
            "\tdevice_cap_flags:\t\t0x{:08x}",
            a.device_cap_flags.bits()
        )?;
        for (flag, name) in CAP_NAMES {
            if a.device_cap_flags.contains(*flag) {
                writeln!(out, "\t\t\t\t\t{name}")?;
            }
        }
        writeln!(out, "\tmax_sge:\t\t\t{}", a.max_sge)?;
        writeln!(out, "\tmax_sge_rd:\t\t\t{}", a.max_sge_rd)?;
        writeln!(out, "\tmax_cq:\t\t\t\t{}", a.max_cq)?;
        writeln!(out, "\tmax_cqe:\t\t\t{}", a.max_cqe)?;
        writeln!(out, "\tmax_mr:\t\t\t\t{}", a.max_mr)?;
        writeln!(out, "\tmax_pd:\t\t\t\t{}", a.max_pd)?;
        writeln!(out, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom)?;
        writeln!(out, "\tmax_ee_rd_atom:\t\t\t{}", a.max_ee_rd_atom)?;
        writeln!(out, "\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom)?;
        writeln!(out, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom)?;
        writeln!(out, "\tmax_ee_init_rd_atom:\t\t{}", a.max_ee_init_rd_atom)?;
        writeln!(
            out,
            "\tatomic_cap:\t\t\t{} ({})",
            a.atomic_cap.name(),
            a.atomic_cap as u32
        )?;
        writeln!(out, "\tmax_ee:\t\t\t\t{}", a.max_ee)?;
        writeln!(out, "\tmax_rdd:\t\t\t{}", a.max_rdd)?;
        writeln!(out, "\tmax_mw:\t\t\t\t{}", a.max_mw)?;
        writeln!(out, "\tmax_raw_ipv6_qp:\t\t{}", a.max_raw_ipv6_qp)?;
        writeln!(out, "\tmax_raw_ethy_qp:\t\t{}", a.max_raw_ethy_qp)?;
        writeln!(out, "\tmax_mcast_grp:\t\t\t{}", a.max_mcast_grp)?;
        writeln!(out, "\tmax_mcast_qp_attach:\t\t{}", a.max_mcast_qp_attach)?;
        writeln!(
            out,
            "\tmax_total_mcast_qp_attach:\t{}",
            a.max_total_mcast_qp_attach
        )?;
        writeln!(out, "\tmax_ah:\t\t\t\t{}", a.max_ah)?;
        writeln!(out, "\tmax_fmr:\t\t\t{}", a.max_fmr)?;
        writeln!(out, "\tmax_srq:\t\t\t{}", a.max_srq)?;
        writeln!(out, "\tmax_srq_wr:\t\t\t{}", a.max_srq_wr)?;
        writeln!(out, "\tmax_srq_sge:\t\t\t{}", a.max_srq_sge)?;
        writeln!(out, "\tmax_pkeys:\t\t\t{}", a.max_pkeys)?;
        writeln!(out, "\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay)?;
        writeln!(out, "\tnum_comp_vectors:\t\t{}", ctx.num_comp_vectors())?;
    }
    for port in 1..=a.phys_port_cnt {
        if args.port.is_some_and(|p| p != port) {
            continue;
        }
        let p = ctx
            .query_port(port)
            .with_context(|| format!("Failed to query port {port} props"))?;
        writeln!(out, "\t\tport:\t{port}")?;
        writeln!(
            out,
            "\t\t\tstate:\t\t\t{} ({})",
            p.state.name(),
            p.state as u32
        )?;
        writeln!(out, "\t\t\tmax_mtu:\t\t{}", mtu_str(p.max_mtu))?;
        writeln!(out, "\t\t\tactive_mtu:\t\t{}", mtu_str(p.active_mtu))?;
        writeln!(out, "\t\t\tsm_lid:\t\t\t{}", p.sm_lid)?;
        writeln!(out, "\t\t\tport_lid:\t\t{}", p.lid)?;
        writeln!(out, "\t\t\tport_lmc:\t\t0x{:02x}", p.lmc)?;
        writeln!(out, "\t\t\tlink_layer:\t\t{}", p.link_layer.name())?;
        if args.verbose {
            writeln!(out, "\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz)?;
            writeln!(
                out,
                "\t\t\tport_cap_flags:\t\t0x{:08x}",
                p.port_cap_flags.bits()
            )?;
            writeln!(out, "\t\t\tport_cap_flags2:\t0x{:04x}", p.port_cap_flags2)?;
            writeln!(
                out,
                "\t\t\tmax_vl_num:\t\t{} ({})",
                vl_str(p.max_vl_num),
                p.max_vl_num
            )?;
            writeln!(out, "\t\t\tbad_pkey_cntr:\t\t0x{:x}", p.bad_pkey_cntr)?;
            writeln!(out, "\t\t\tqkey_viol_cntr:\t\t0x{:x}", p.qkey_viol_cntr)?;
            writeln!(out, "\t\t\tsm_sl:\t\t\t{}", p.sm_sl)?;
            writeln!(out, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len)?;
            writeln!(out, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len)?;
            writeln!(out, "\t\t\tsubnet_timeout:\t\t{}", p.subnet_timeout)?;
            writeln!(out, "\t\t\tinit_type_reply:\t{}", p.init_type_reply)?;
            writeln!(
                out,
                "\t\t\tactive_width:\t\t{}X ({})",
                width_str(p.active_width),
                p.active_width
            )?;
            let speed = if p.active_speed_ex != 0 {
                p.active_speed_ex
            } else {
                u32::from(p.active_speed)
            };
            writeln!(out, "\t\t\tactive_speed:\t\t{} ({speed})", speed_str(speed))?;
            writeln!(
                out,
                "\t\t\tphys_state:\t\t{} ({})",
                phys_state_str(p.phys_state),
                p.phys_state
            )?;
            for e in ctx.query_gid_table().context("Failed to query gid")? {
                if !e.gid.is_zero() {
                    writeln!(
                        out,
                        "{}",
                        gid_line(&e.gid, e.gid_index, e.gid_type, p.link_layer)
                    )?;
                }
            }
        }
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_str_groups_like_ibv_devinfo() {
        assert_eq!(guid_str(0x5256_45ff_7f00_0001), "5256:45ff:7f00:0001");
    }

    #[test]
    fn gid_lines_like_ibv_devinfo() {
        let gid = Gid::from_ip("127.0.0.1".parse().unwrap());
        assert_eq!(
            gid_line(&gid, 0, GidType::RoceV2, LinkLayer::Ethernet),
            "\t\t\tGID[  0]:\t\t::ffff:127.0.0.1, RoCE v2"
        );
        assert_eq!(
            gid_line(&gid, 1, GidType::RoceV1, LinkLayer::Ethernet),
            "\t\t\tGID[  1]:\t\t0000:0000:0000:0000:0000:ffff:7f00:0001, RoCE v1"
        );
    }

    #[test]
    fn mtu_and_speed_strings() {
        assert_eq!(mtu_str(Mtu::Mtu4096), "4096 (5)");
        assert_eq!(speed_str(32), "25.0 Gbps");
        assert_eq!(width_str(2), "4");
        assert_eq!(vl_str(1), "1");
        assert_eq!(phys_state_str(5), "LINK_UP");
    }
}
