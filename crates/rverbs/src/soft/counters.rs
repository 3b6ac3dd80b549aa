//! A running program's device counters, for `rverbs counters`: each device
//! whose engine runs answers on an abstract UNIX socket named
//! `rverbs/<pid>/<device>` (in the network namespace the program runs in)
//! with one `name value` line per counter, to clients of the same user or
//! root; [`running`] finds and asks them all.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    connect, getsockopt, socket, sockopt::PeerCredentials, AddressFamily, SockFlag, SockType,
    UnixAddr,
};
use nix::unistd::geteuid;

use crate::soft::device::SoftDevice;

/// Prefix of every device's counter socket name.
const PREFIX: &str = "rverbs/";

/// The counters of one device of a running program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningDevice {
    /// The program's process ID.
    pub pid: u32,
    /// The device's name in that program.
    pub device: String,
    /// Its address (the IP of its first GID).
    pub addr: String,
    /// Every counter, by name, as [`NetStats::counters`](crate::NetStats::counters) lists them.
    pub counters: Vec<(String, u64)>,
}

/// Starts answering counter queries for `dev` (on a thread that sleeps in
/// `accept`, and ends at the first query after the device is gone). A socket that cannot be
/// made (another program of this pid in the namespace …) only costs the
/// feature: logged, not an error.
pub(crate) fn publish(dev: &Arc<SoftDevice>) {
    let name = format!("{PREFIX}{}/{}", std::process::id(), dev.name);
    let listener = match SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| UnixListener::bind_addr(&a))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!("no counter socket {name:?}: {e}");
            return;
        }
    };
    let dev = Arc::downgrade(dev);
    let spawned = std::thread::Builder::new()
        .name("rverbs-counters".into())
        .spawn(move || serve(&listener, &dev));
    if let Err(e) = spawned {
        tracing::debug!("no counter thread: {e}");
    }
}

/// Whether the other end of `stream` runs as this process's user or root
/// (and, when `pid` is given, is that process).
fn trusted(stream: &UnixStream, pid: Option<u32>) -> bool {
    let me = geteuid().as_raw();
    getsockopt(stream, PeerCredentials).is_ok_and(|c| {
        (c.uid() == 0 || c.uid() == me) && pid.is_none_or(|p| i64::from(c.pid()) == i64::from(p))
    })
}

/// Serves counter queries until a query finds the device gone (a removed
/// device keeps its thread, asleep, until the next query).
fn serve(listener: &UnixListener, dev: &Weak<SoftDevice>) {
    // The counters as last read, and when: queries closer together than
    // READ_EVERY get the same figures, so a program asked in a loop (`watch
    // rverbs stat`, a script) takes the engine's lock a few times a second
    // at most.
    let mut last: Option<(Instant, String)> = None;
    for stream in listener.incoming() {
        let Some(dev) = dev.upgrade() else { return };
        let Ok(mut stream) = stream else { continue };
        let allowed = trusted(&stream, None);
        if !allowed || dev.is_disassociated() {
            continue;
        }
        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
        let fresh = last
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < READ_EVERY);
        if !fresh {
            let mut text = format!("device {}\naddr {}\n", dev.name, dev.addr);
            for (name, value) in dev.net_stats().counters() {
                text += &format!("{name} {value}\n");
            }
            last = Some((Instant::now(), text));
        }
        if let Some((_, text)) = &last {
            let _ = stream.write_all(text.as_bytes());
        }
    }
}

/// The shortest time between two reads of a device's counters for
/// queries (see `serve`).
const READ_EVERY: Duration = Duration::from_millis(200);

/// The devices of every running program (of this user, or all as root)
/// in this network namespace that has an rverbs device with its engine
/// started, with their counters, by pid then name.
pub fn running() -> io::Result<Vec<RunningDevice>> {
    let table = std::fs::read_to_string("/proc/net/unix")?;
    let mut names: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|path| path.strip_prefix('@'))
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut found: Vec<RunningDevice> = names.into_iter().filter_map(|n| ask(n).ok()).collect();
    found.sort_by(|a, b| (a.pid, &a.device).cmp(&(b.pid, &b.device)));
    Ok(found)
}

/// How long one device may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// The most an answer may hold (a few dozen short lines are expected).
const ANSWER_LIMIT: u64 = 64 << 10;

/// Asks the device at abstract socket `name` for its counters: within
/// [`ASK_TIMEOUT`], at most [`ANSWER_LIMIT`] bytes, and only from the
/// process the name says, of this user or root (an abstract name has no
/// permissions: anyone could have bound it).
fn ask(name: &str) -> io::Result<RunningDevice> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let pid: u32 = name[PREFIX.len()..]
        .split('/')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| bad("no pid"))?;
    let stream = connect_within(name, ASK_TIMEOUT)?;
    if !trusted(&stream, Some(pid)) {
        return Err(bad("not the program the name says, or another user's"));
    }
    let deadline = Instant::now() + ASK_TIMEOUT;
    stream.set_read_timeout(Some(ASK_TIMEOUT))?;
    let mut dev = RunningDevice {
        pid,
        device: String::new(),
        addr: String::new(),
        counters: Vec::new(),
    };
    for line in BufReader::new(stream.take(ANSWER_LIMIT)).lines() {
        if Instant::now() > deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "answer too slow"));
        }
        let line = line?;
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        match key {
            "device" => dev.device = value.to_string(),
            "addr" => dev.addr = value.to_string(),
            _ => {
                if let Ok(v) = value.parse() {
                    dev.counters.push((key.to_string(), v));
                }
            }
        }
    }
    if dev.device.is_empty() {
        return Err(bad("no answer"));
    }
    Ok(dev)
}

/// Connects to the abstract socket `name`, giving up after `timeout` (a
/// stopped program's full backlog would block a plain connect for ever).
fn connect_within(name: &str, timeout: Duration) -> io::Result<UnixStream> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new_abstract(name.as_bytes())?;
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) => {}
        Err(nix::errno::Errno::EINPROGRESS | nix::errno::Errno::EAGAIN) => {
            let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
            if poll(&mut fds, PollTimeout::from(ms))? == 0 {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
            }
            let pending = getsockopt(&fd, nix::sys::socket::sockopt::SocketError)?;
            if pending != 0 {
                return Err(io::Error::from_raw_os_error(pending));
            }
        }
        Err(e) => return Err(e.into()),
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The counters of this process's devices, one `device: name value …`
/// line each (non-zero counters only), for a log or a failure message.
pub fn summary() -> String {
    crate::soft::device::created()
        .iter()
        .map(|dev| {
            let counters: Vec<String> = dev
                .engine
                .stats()
                .counters()
                .into_iter()
                .filter(|(_, v)| *v != 0)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            format!("{} ({}): {}\n", dev.name, dev.addr, counters.join(" "))
        })
        .collect()
}
