//! `rverbs`: the command-line face of rverbs — list and inspect the software
//! RoCE devices (more subcommands arrive with the transport, the C ABI and
//! the wire format).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// Inspect and use rverbs software RoCE devices.
#[derive(Parser)]
#[command(name = "rverbs", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List RDMA devices with their node GUIDs (like ibv_devices).
    Devices,
    /// Print device and port attributes (like ibv_devinfo).
    Devinfo(cmd::devinfo::DevinfoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match cli.command {
        Command::Devices => cmd::devinfo::devices(&mut out),
        Command::Devinfo(args) => cmd::devinfo::devinfo(&args, &mut out),
    };
    let _ = out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rverbs: {e:#}");
            ExitCode::FAILURE
        }
    }
}
