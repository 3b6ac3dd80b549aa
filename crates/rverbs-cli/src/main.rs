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
    /// Print the shell completion script for SHELL (bash, zsh, fish,
    /// elvish, powershell): `rverbs completions bash > /etc/bash_completion.d/rverbs`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page of rverbs (rverbs.1), or with --dir write it and
    /// one per subcommand (rverbs-bench.1 …) into DIR.
    Man {
        /// Write rverbs.1 and rverbs-SUBCOMMAND.1 here instead of printing.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

/// `rverbs man`: rverbs.1 on `out`, or it and one page per subcommand in
/// `dir`.
fn man_pages(dir: Option<&std::path::Path>, out: &mut impl Write) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let cli = <Cli as clap::CommandFactory>::command();
    let Some(dir) = dir else {
        clap_mangen::Man::new(cli).render(out)?;
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, cmd: clap::Command| -> anyhow::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        clap_mangen::Man::new(cmd).render(&mut file)?;
        Ok(())
    };
    for sub in cli.get_subcommands() {
        // The page's title (clap names take &'static str: a few bytes per
        // page, once, in a process about to exit).
        let name: &'static str = Box::leak(format!("rverbs-{}", sub.get_name()).into_boxed_str());
        write(
            name,
            sub.clone().name(name).version(env!("CARGO_PKG_VERSION")),
        )?;
    }
    write("rverbs", cli)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    rverbs::log::init_from_env();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match cli.command {
        Command::Devices => cmd::devinfo::devices(&mut out),
        Command::Devinfo(args) => cmd::devinfo::devinfo(&args, &mut out),
        Command::Bench(args) => cmd::bench::bench(&args, &mut out).map(|_| ()),
        Command::Pingpong(args) => cmd::pingpong::pingpong(&args, &mut out).map(|_| ()),
        Command::Run(args) => cmd::run::run(&args, &mut out),
        Command::Completions { shell } => {
            let mut cli = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cli, "rverbs", &mut out);
            Ok(())
        }
        Command::Man { dir } => man_pages(dir.as_deref(), &mut out),
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
