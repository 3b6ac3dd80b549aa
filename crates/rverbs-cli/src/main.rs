//! `rverbs`: the command-line face of rverbs — list and inspect the software
//! RoCE devices, measure them against TCP and UDP (`bench`), ping-pong over
//! RC, UC, UD and SRQs (`pingpong`), decode captures, show running
//! programs' device counters (`counters`), and run unmodified C
//! verbs and rdma_cm programs on the drop-in libibverbs and librdmacm
//! (`run`).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod log;

/// Inspect and use rverbs software RoCE devices.
#[derive(Parser)]
#[command(name = "rverbs", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List RDMA devices with their node GUIDs (like ibv_devices), then the
    /// devices of programs running now, with their PIDs and addresses.
    Devices,
    /// Print device and port attributes (like ibv_devinfo).
    Devinfo(cmd::devinfo::DevinfoArgs),
    /// Print the RoCEv2 packets of a pcap/pcapng capture and check their ICRCs.
    Decode(cmd::decode::DecodeArgs),
    /// Measure RDMA WRITE/READ/SEND bandwidth and latency against TCP and UDP.
    Bench(cmd::bench::BenchArgs),
    /// Ping-pong SENDs between a server and a client over RC, UC or UD QPs,
    /// optionally on an SRQ (like ibv_rc/uc/ud/srq_pingpong).
    Pingpong(cmd::pingpong::PingpongArgs),
    /// Show the device counters (packets, drops by reason, retransmissions,
    /// NAKs) of running programs: `rverbs stat [PID|DEVICE]`.
    #[command(visible_alias = "stat")]
    Counters(cmd::counters::CountersArgs),
    /// Run an unmodified C verbs or rdma_cm program (ibv_rc_pingpong,
    /// ib_write_bw, rping …) on rverbs' libibverbs.so.1 and librdmacm.so.1:
    /// `rverbs run -- PROGRAM ARGS…`.
    Run(cmd::run::RunArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    log::init();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match cli.command {
        Command::Devices => cmd::devinfo::devices(&mut out),
        Command::Devinfo(args) => cmd::devinfo::devinfo(&args, &mut out),
        Command::Bench(args) => cmd::bench::bench(&args, &mut out).map(|_| ()),
        Command::Pingpong(args) => cmd::pingpong::pingpong(&args, &mut out).map(|_| ()),
        Command::Run(args) => cmd::run::run(&args, &mut out),
        Command::Counters(args) => cmd::counters::counters(&args, &mut out),
        Command::Decode(args) => cmd::decode::decode(&args, &mut out).and_then(|s| {
            let _ = out.flush();
            let mads = if s.mads > 0 {
                format!("; {} MADs, {} malformed", s.mads, s.bad_mads)
            } else {
                String::new()
            };
            eprintln!(
                "{} frames: {} RoCE packets, {} with a bad ICRC, {} malformed or truncated, {} other frames skipped{mads}",
                s.frames, s.roce, s.bad_icrc, s.malformed, s.skipped
            );
            if args.strict && s.failures() > 0 {
                anyhow::bail!("--strict: {} RoCE packets failed their checks", s.failures());
            }
            Ok(())
        }),
    };
    let _ = out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`rverbs decode x | head`) is not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rverbs: {e:#}");
            ExitCode::FAILURE
        }
    }
}
