//! `rverbs counters`: the device counters of running programs — packets,
//! drops by reason, retransmissions, NAKs — asked of each program's
//! devices over their counter sockets (`rverbs::counters`), so a
//! program that hangs or fails can be looked into while it runs.

use std::io::Write;

use anyhow::{bail, Result};
use clap::Args;

/// Options of `rverbs counters` (alias `rverbs stat`).
#[derive(Args, Debug)]
pub struct CountersArgs {
    /// Only this process (a number) or this device (a name, as `rverbs0`,
    /// or an address), as `rdma statistic` takes a device.
    #[arg(value_name = "PID|DEVICE")]
    pub target: Option<String>,
    /// Only this process.
    #[arg(short, long)]
    pub pid: Option<u32>,
    /// Print counters that are 0 too.
    #[arg(short, long)]
    pub all: bool,
    /// One JSON array of devices instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Prints the counters of every running program's devices (this network
/// namespace; this user's programs, or all as root).
pub fn counters(args: &CountersArgs, out: &mut impl Write) -> Result<()> {
    let mut found = rverbs::counters::running()?;
    found.retain(|d| args.pid.is_none_or(|p| p == d.pid));
    let target_pid = args.target.as_deref().and_then(|t| t.parse::<u32>().ok());
    if let Some(t) = &args.target {
        found.retain(|d| match target_pid {
            Some(p) => d.pid == p,
            None => &d.device == t || &d.addr == t,
        });
    }
    if !args.all {
        for d in &mut found {
            d.counters.retain(|(_, v)| *v != 0);
        }
    }
    if args.json {
        let list: Vec<serde_json::Value> = found
            .iter()
            .map(|d| {
                let counters: serde_json::Map<String, serde_json::Value> = d
                    .counters
                    .iter()
                    .map(|(n, v)| (n.clone(), (*v).into()))
                    .collect();
                serde_json::json!({
                    "pid": d.pid,
                    "device": d.device,
                    "addr": d.addr,
                    "counters": counters,
                })
            })
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
        return Ok(());
    }
    if found.is_empty() {
        match (args.pid.or(target_pid), &args.target) {
            (Some(p), _) => bail!("process {p} has no rverbs device with a context open"),
            (None, Some(t)) => bail!("no running program has an rverbs device {t}"),
            (None, None) => {
                writeln!(
                    out,
                    "no running program has an rverbs device with a context open"
                )?;
                return Ok(());
            }
        }
    }
    for d in &found {
        writeln!(out, "pid {} device {} ({})", d.pid, d.device, d.addr)?;
        for (name, value) in &d.counters {
            writeln!(out, "    {name:<24}{value}")?;
        }
    }
    Ok(())
}
