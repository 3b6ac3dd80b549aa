//! Two single-producer, single-consumer byte rings in one piece of shared
//! memory (a memfd), one for each direction between two devices on this
//! host. Each record is a packet, written whole in place by its producer
//! and read in place by its consumer; nothing is ever copied into the
//! ring that the wire would not carry.
//!
//! Layout of the shared memory: a page of metadata (magic, version, ring
//! size), then a control page per ring (the producer's `head`, the
//! consumer's `tail`, the consumer's sleeper count, each on its own cache
//! line), then the two data areas. `head` and `tail` count bytes since the
//! start, so the ring is empty when they are equal and full when they are
//! `capacity` apart. A record is an 8-byte header (`len`, `kind`) and its
//! bytes, padded to 8; one never wraps: when it does not fit before the
//! end, a pad record fills the rest and it starts at the beginning.
//!
//! Ordering: the producer writes a record, then publishes `head`; the
//! consumer reads `head`, then the record, then publishes `tail`. Sleeping
//! is a Dekker pair on `head` and `sleepers`: a consumer about to sleep
//! counts itself in `sleepers`, then looks at `head` once more; a producer
//! publishes `head`, then looks at `sleepers` — so one of them sees the
//! other, and a record is never left waiting for a sleeper that was not
//! woken (the producer then rings the peer's doorbell).
//!
//! The peer is a process of the same user (the handshake checked), which
//! could as well attach to this process with `ptrace`; it is trusted not
//! to scribble on the ring, but every length read from the ring is checked
//! against the mapping, so a bad one breaks the ring (it stops delivering)
//! and never makes an access outside it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::stat::fstat;
use nix::unistd::ftruncate;

/// Bytes of each ring's data area unless the device says otherwise.
pub(crate) const DEFAULT_RING_BYTES: usize = 16 << 20;
/// The smallest ring: room for a few of the largest packets.
const MIN_RING_BYTES: usize = 64 << 10;
/// The largest ring (each of the two).
const MAX_RING_BYTES: usize = 1 << 30;

const PAGE: usize = 4096;
const MAGIC: u64 = 0x7276_6572_6273_5231; // "rverbsR1"
const VERSION: u32 = 1;
/// A record's header: its length and kind, 4 bytes each.
const RECORD_HEADER: usize = 8;
const KIND_PACKET: u32 = 1;
const KIND_PAD: u32 = 2;

/// The first page.
#[repr(C)]
struct Meta {
    magic: AtomicU64,
    version: AtomicU32,
    _reserved: AtomicU32,
    /// Bytes of each data area (a power of two).
    capacity: AtomicU64,
}

/// One cache line holding one counter, so the two sides do not share a
/// line they both write.
#[repr(C, align(64))]
struct Line<T>(T);

/// A ring's control page.
#[repr(C)]
struct Control {
    /// Bytes the producer has published.
    head: Line<AtomicU64>,
    /// Bytes the consumer is done with.
    tail: Line<AtomicU64>,
    /// Consumer-side threads asleep (or about to be), waiting for records.
    sleepers: Line<AtomicU32>,
}

/// Makes the shared memory for a link whose rings hold `ring_bytes` each
/// (rounded up to a power of two, within bounds): a sealed-size memfd,
/// its metadata written. The side that connects makes it and passes it.
pub(crate) fn create_shm(ring_bytes: usize) -> io::Result<OwnedFd> {
    let capacity = ring_bytes
        .clamp(MIN_RING_BYTES, MAX_RING_BYTES)
        .next_power_of_two();
    let fd = memfd_create(
        c"rverbs-local-ring",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )?;
    let total = total_size(capacity);
    ftruncate(
        &fd,
        i64::try_from(total).map_err(|_| io::Error::other("ring too large"))?,
    )?;
    // Its size is fixed for good: a peer cannot shrink it under our
    // mapping (a SIGBUS), only scribble on it (a broken ring).
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )?;
    let map = Mapping::new(&fd, total)?;
    let meta = map.meta();
    meta.capacity.store(capacity as u64, Ordering::Relaxed);
    meta.version.store(VERSION, Ordering::Relaxed);
    meta.magic.store(MAGIC, Ordering::Release);
    Ok(fd)
}

/// Bytes of the whole shared memory for rings of `capacity` bytes.
fn total_size(capacity: usize) -> usize {
    3 * PAGE + 2 * capacity
}

/// A shared mapping, unmapped when the last ring end drops.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
    /// A record with a bad length was found: the link delivers nothing
    /// more.
    broken: AtomicBool,
}

// SAFETY: the mapping is plain shared memory; every access goes through
// atomics (control words) or through the ring protocol, under which only
// one side (and within it one thread, the engine lock holder) writes a
// given byte at a time.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        let size = std::num::NonZeroUsize::new(len).ok_or_else(|| io::Error::other("empty"))?;
        // SAFETY: a fresh shared mapping of a memfd at an address the
        // kernel picks: it aliases no Rust object.
        let base = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }?;
        Ok(Mapping {
            base: base.cast(),
            len,
            broken: AtomicBool::new(false),
        })
    }

    fn meta(&self) -> &Meta {
        // SAFETY: the first page is mapped, page-aligned, and only ever
        // accessed through these atomics.
        unsafe { &*self.base.as_ptr().cast::<Meta>() }
    }

    fn control(&self, ring: usize) -> &Control {
        // SAFETY: pages 1 and 2 are mapped, page-aligned, and only ever
        // accessed through these atomics.
        unsafe { &*self.base.as_ptr().add(PAGE * (1 + ring)).cast::<Control>() }
    }

    fn data(&self, ring: usize, capacity: usize) -> *mut u8 {
        // SAFETY: within the mapping: 3 pages then two areas of `capacity`
        // (checked against `len` when mapped).
        unsafe { self.base.as_ptr().add(3 * PAGE + ring * capacity) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, whose users (the ring ends) are gone.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

/// The two ends this side holds: it produces into one ring and consumes
/// the other.
pub(crate) struct RingPair {
    /// Records to the peer.
    pub(crate) tx: Producer,
    /// Records from the peer.
    pub(crate) rx: Consumer,
}

impl RingPair {
    /// Maps the shared memory `fd` made by [`create_shm`]; the side that
    /// made it (`initiator`) produces into ring 0. EINVAL if it is not such
    /// memory.
    pub(crate) fn map(fd: &OwnedFd, initiator: bool) -> io::Result<RingPair> {
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let len = usize::try_from(fstat(fd.as_fd())?.st_size).map_err(|_| invalid("bad size"))?;
        // Only memory whose size nobody can change is mapped.
        let seals = SealFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GET_SEALS)?);
        if !seals.contains(SealFlag::F_SEAL_SHRINK) {
            return Err(invalid(
                "shared ring memory is not sealed against shrinking",
            ));
        }
        if len < total_size(MIN_RING_BYTES) {
            return Err(invalid("shared ring memory too small"));
        }
        let map = Arc::new(Mapping::new(fd, len)?);
        let meta = map.meta();
        if meta.magic.load(Ordering::Acquire) != MAGIC
            || meta.version.load(Ordering::Relaxed) != VERSION
        {
            return Err(invalid("not an rverbs ring (magic or version)"));
        }
        let capacity = usize::try_from(meta.capacity.load(Ordering::Relaxed)).unwrap_or(0);
        if !capacity.is_power_of_two()
            || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&capacity)
            || total_size(capacity) != len
        {
            return Err(invalid("ring capacity does not match its memory"));
        }
        let (out, inp) = if initiator { (0, 1) } else { (1, 0) };
        Ok(RingPair {
            tx: Producer {
                data: map.data(out, capacity),
                capacity,
                ring: out,
                head: map.control(out).head.0.load(Ordering::Acquire),
                tail_seen: map.control(out).tail.0.load(Ordering::Acquire),
                map: Arc::clone(&map),
            },
            rx: Consumer {
                data: map.data(inp, capacity),
                capacity,
                ring: inp,
                tail: map.control(inp).tail.0.load(Ordering::Acquire),
                next: None,
                map,
            },
        })
    }
}

/// The producing end of a ring.
pub(crate) struct Producer {
    map: Arc<Mapping>,
    ring: usize,
    data: *mut u8,
    capacity: usize,
    /// Our copy of `head` (we are its only writer).
    head: u64,
    /// `tail` as last read.
    tail_seen: u64,
}

// SAFETY: the raw pointer is into the shared mapping the `Arc` keeps.
unsafe impl Send for Producer {}

/// A record's whole size in the ring: header and bytes, padded to 8.
fn record_size(len: usize) -> usize {
    (RECORD_HEADER + len).next_multiple_of(8)
}

impl Producer {
    /// The largest record (bytes) this ring takes.
    pub(crate) fn max_record(&self) -> usize {
        self.capacity / 4
    }

    /// Whether a record of `len` bytes fits now.
    pub(crate) fn has_room(&mut self, len: usize) -> bool {
        self.room_for(len).is_some()
    }

    /// Where a record of `len` bytes would start (its offset in the data
    /// area) and whether a pad must go before it, or `None` if it does not
    /// fit now.
    fn room_for(&mut self, len: usize) -> Option<(usize, bool)> {
        if len > self.max_record() {
            return None;
        }
        let size = record_size(len);
        let at = (self.head % self.capacity as u64) as usize;
        let to_end = self.capacity - at;
        let needed = if size <= to_end { size } else { to_end + size } as u64;
        // A tail past our head (a peer scribbling on the control page)
        // reads as a full ring, never as room.
        let fits = |tail: u64| {
            let used = self.head.wrapping_sub(tail);
            used <= self.capacity as u64 && used + needed <= self.capacity as u64
        };
        if !fits(self.tail_seen) {
            self.tail_seen = self.control().tail.0.load(Ordering::Acquire);
            if !fits(self.tail_seen) {
                return None;
            }
        }
        Some(if size <= to_end {
            (at, false)
        } else {
            (0, true)
        })
    }

    fn control(&self) -> &Control {
        self.map.control(self.ring)
    }

    /// Writes a record of `len` bytes, filled by `fill` in place, and
    /// publishes it. `false` (nothing written) if it does not fit now.
    pub(crate) fn push(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        let Some((at, pad)) = self.room_for(len) else {
            return false;
        };
        if pad {
            let here = (self.head % self.capacity as u64) as usize;
            self.write_header(
                here,
                (self.capacity - here - RECORD_HEADER) as u32,
                KIND_PAD,
            );
            self.head += (self.capacity - here) as u64;
        }
        self.write_header(at, len as u32, KIND_PACKET);
        // SAFETY: `room_for` found `record_size(len)` bytes free from `at`
        // within the data area: the consumer reads none of them until
        // `head` moves past them, and we are the only producer.
        let body =
            unsafe { std::slice::from_raw_parts_mut(self.data.add(at + RECORD_HEADER), len) };
        fill(body);
        self.head += record_size(len) as u64;
        // SeqCst: paired with the consumer's sleepers/head (see the module
        // docs), and a release of the record's bytes.
        self.control().head.0.store(self.head, Ordering::SeqCst);
        true
    }

    /// Writes `pieces` one after another as one record (see
    /// [`push`](Self::push)).
    pub(crate) fn push_pieces(&mut self, pieces: &[&[u8]]) -> bool {
        let len = pieces.iter().map(|p| p.len()).sum();
        self.push(len, |body| {
            let mut at = 0;
            for p in pieces {
                body[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        })
    }

    fn write_header(&mut self, at: usize, len: u32, kind: u32) {
        let mut h = [0u8; RECORD_HEADER];
        h[..4].copy_from_slice(&len.to_ne_bytes());
        h[4..].copy_from_slice(&kind.to_ne_bytes());
        // SAFETY: `at` is 8-aligned and at least RECORD_HEADER bytes from
        // the end of the data area (all sizes are multiples of 8); the bytes
        // are free (see `push`).
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), self.data.add(at), RECORD_HEADER) };
    }

    /// Whether a thread of the consumer's side sleeps (or is about to):
    /// it must be woken after a push. Reads after the push's `head`
    /// (both sequentially consistent).
    pub(crate) fn peer_sleeping(&self) -> bool {
        self.control().sleepers.0.load(Ordering::SeqCst) > 0
    }

    /// How far the consumer has got, to be watched without this end (see
    /// [`RingProgress::consumed`]), and where this end's records end now.
    pub(crate) fn progress(&self) -> (RingProgress, u64) {
        (
            RingProgress {
                map: Arc::clone(&self.map),
                ring: self.ring,
            },
            self.head,
        )
    }
}

/// The consuming end of a ring.
pub(crate) struct Consumer {
    map: Arc<Mapping>,
    ring: usize,
    data: *mut u8,
    capacity: usize,
    /// Our copy of `tail` (we are its only writer).
    tail: u64,
    /// The record [`peek`](Self::peek) returned: its offset and length.
    next: Option<(usize, usize)>,
}

// SAFETY: the raw pointer is into the shared mapping the `Arc` keeps.
unsafe impl Send for Consumer {}

impl Consumer {
    fn control(&self) -> &Control {
        self.map.control(self.ring)
    }

    /// Whether no record waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.broken.load(Ordering::Relaxed)
            || self.control().head.0.load(Ordering::SeqCst) == self.tail
    }

    /// The next record's bytes, in place, or `None` if none waits. It stays
    /// until [`consume`](Self::consume).
    pub(crate) fn peek(&mut self) -> Option<&[u8]> {
        if self.map.broken.load(Ordering::Relaxed) {
            return None;
        }
        loop {
            let head = self.control().head.0.load(Ordering::Acquire);
            if head == self.tail {
                return None;
            }
            let at = (self.tail % self.capacity as u64) as usize;
            let mut h = [0u8; RECORD_HEADER];
            // SAFETY: `at` is within the data area and 8-aligned, so the
            // header's 8 bytes are too; the producer published them.
            unsafe {
                std::ptr::copy_nonoverlapping(self.data.add(at), h.as_mut_ptr(), RECORD_HEADER)
            };
            let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
            let kind = u32::from_ne_bytes([h[4], h[5], h[6], h[7]]);
            let size = record_size(len);
            let published = head.wrapping_sub(self.tail);
            if size > self.capacity - at || size as u64 > published {
                tracing::warn!(
                    "a same-host ring holds a record of a bad length ({len}); the link is closed"
                );
                self.map.broken.store(true, Ordering::Relaxed);
                return None;
            }
            match kind {
                KIND_PAD => {
                    self.tail += size as u64;
                    self.control().tail.0.store(self.tail, Ordering::Release);
                }
                KIND_PACKET => {
                    self.next = Some((at + RECORD_HEADER, len));
                    // SAFETY: checked above to lie within the data area and
                    // within what the producer published; it writes none of
                    // it until `tail` moves past it.
                    return Some(unsafe {
                        std::slice::from_raw_parts(self.data.add(at + RECORD_HEADER), len)
                    });
                }
                _ => {
                    tracing::warn!("a same-host ring holds a record of unknown kind {kind}; the link is closed");
                    self.map.broken.store(true, Ordering::Relaxed);
                    return None;
                }
            }
        }
    }

    /// Gives the record [`peek`](Self::peek) returned back to the producer.
    pub(crate) fn consume(&mut self) {
        if let Some((_, len)) = self.next.take() {
            self.tail += record_size(len) as u64;
            self.control().tail.0.store(self.tail, Ordering::Release);
        }
    }

    /// A handle for threads that sleep waiting for this ring's records
    /// (outside the lock that guards the consumer).
    pub(crate) fn watch(&self) -> RingWatch {
        RingWatch {
            map: Arc::clone(&self.map),
            ring: self.ring,
        }
    }
}

/// A producer's view of how far its consumer has got.
pub(crate) struct RingProgress {
    map: Arc<Mapping>,
    ring: usize,
}

impl RingProgress {
    /// Bytes the consumer is done with (compare with a producer's head
    /// from [`Producer::progress`]).
    pub(crate) fn consumed(&self) -> u64 {
        self.map.control(self.ring).tail.0.load(Ordering::Acquire)
    }

    /// Whether `producer` fills the ring this watches.
    pub(crate) fn is_of(&self, producer: &Producer) -> bool {
        Arc::ptr_eq(&self.map, &producer.map) && self.ring == producer.ring
    }
}

/// What a thread about to sleep needs of a ring it consumes: to say it
/// sleeps, and to look once more whether records wait.
#[derive(Clone)]
pub(crate) struct RingWatch {
    map: Arc<Mapping>,
    ring: usize,
}

impl RingWatch {
    fn control(&self) -> &Control {
        self.map.control(self.ring)
    }

    /// A thread of ours is about to sleep: producers will wake it. Then
    /// look at [`has_records`](Self::has_records) once more before
    /// sleeping.
    pub(crate) fn sleep_begin(&self) {
        self.control().sleepers.0.fetch_add(1, Ordering::SeqCst);
    }

    /// The thread is up again.
    pub(crate) fn sleep_end(&self) {
        self.control().sleepers.0.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether records wait (published and not consumed).
    pub(crate) fn has_records(&self) -> bool {
        let c = self.control();
        !self.map.broken.load(Ordering::Relaxed)
            && c.head.0.load(Ordering::SeqCst) != c.tail.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(bytes: usize) -> (RingPair, RingPair) {
        let fd = create_shm(bytes).unwrap();
        let a = RingPair::map(&fd, true).unwrap();
        let b = RingPair::map(&fd, false).unwrap();
        (a, b)
    }

    #[test]
    fn records_arrive_in_order_across_wraps() {
        let (mut a, mut b) = pair(MIN_RING_BYTES);
        let mut sent = 0u32;
        let mut got = 0u32;
        // Sizes that do not divide the ring: records wrap with pads.
        for round in 0..2000u32 {
            let len = 4 + (round as usize * 7919) % 9000;
            while !a.tx.push(len, |b| {
                b.fill(sent as u8);
                b[..4].copy_from_slice(&sent.to_ne_bytes());
            }) {
                // Full: drain a few.
                for _ in 0..3 {
                    let Some(r) = b.rx.peek() else { break };
                    assert_eq!(r[..4], got.to_ne_bytes());
                    assert!(r[4..].iter().all(|&x| x == got as u8));
                    b.rx.consume();
                    got += 1;
                }
            }
            sent += 1;
        }
        while let Some(r) = b.rx.peek() {
            assert_eq!(r[..4], got.to_ne_bytes());
            b.rx.consume();
            got += 1;
        }
        assert_eq!(got, sent);
        assert!(b.rx.is_empty());
        let (progress, head) = a.tx.progress();
        assert_eq!(progress.consumed(), head, "all consumed");
    }

    #[test]
    fn both_directions_are_separate() {
        let (mut a, mut b) = pair(MIN_RING_BYTES);
        assert!(a.tx.push_pieces(&[b"from ", b"a"]));
        assert!(b.tx.push_pieces(&[b"from b"]));
        assert_eq!(b.rx.peek(), Some(&b"from a"[..]));
        b.rx.consume();
        assert_eq!(a.rx.peek(), Some(&b"from b"[..]));
        a.rx.consume();
        assert!(a.rx.is_empty() && b.rx.is_empty());
    }

    #[test]
    fn a_full_ring_refuses_and_an_oversized_record_never_fits() {
        let (mut a, mut b) = pair(MIN_RING_BYTES);
        assert!(!a.tx.push(a.tx.max_record() + 1, |_| {}));
        let mut n = 0;
        while a.tx.push(1000, |_| {}) {
            n += 1;
        }
        assert_eq!(n, MIN_RING_BYTES / record_size(1000));
        assert!(b.rx.peek().is_some());
        b.rx.consume();
        assert!(a.tx.push(1000, |_| {}), "room again after a consume");
    }

    #[test]
    fn a_bad_length_breaks_the_ring_without_reading_outside() {
        let (mut a, mut b) = pair(MIN_RING_BYTES);
        assert!(a.tx.push(16, |_| {}));
        // The peer scribbles a huge length over the record's header.
        a.tx.write_header(0, u32::MAX - 3, KIND_PACKET);
        assert_eq!(b.rx.peek(), None);
        assert!(b.rx.map.broken.load(Ordering::Relaxed));
        assert!(b.rx.is_empty());
    }

    #[test]
    fn memory_that_is_not_a_ring_is_refused() {
        let fd = memfd_create(c"not-a-ring", MFdFlags::MFD_CLOEXEC).unwrap();
        ftruncate(&fd, total_size(MIN_RING_BYTES) as i64).unwrap();
        assert!(RingPair::map(&fd, true).is_err(), "unsealed");
        // Sealed, the right size, but a capacity far out of bounds.
        let fd = create_shm(MIN_RING_BYTES).unwrap();
        let map = Mapping::new(&fd, total_size(MIN_RING_BYTES)).unwrap();
        map.meta().capacity.store(1 << 63, Ordering::Relaxed);
        assert!(RingPair::map(&fd, true).is_err(), "huge capacity");
    }

    #[test]
    fn a_sleeping_consumer_is_seen_by_the_producer() {
        let (mut a, b) = pair(MIN_RING_BYTES);
        let w = b.rx.watch();
        assert!(!a.tx.peer_sleeping());
        w.sleep_begin();
        assert!(a.tx.push(8, |_| {}));
        assert!(a.tx.peer_sleeping());
        assert!(w.has_records(), "the sleeper's second look finds it");
        w.sleep_end();
        assert!(!a.tx.peer_sleeping());
    }

    /// A producer and a consumer on two threads: every record arrives,
    /// whole and in order.
    #[test]
    fn threads_pass_records_whole() {
        let (mut a, mut b) = pair(MIN_RING_BYTES);
        const N: u64 = 50_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                let len = 8 + (i as usize % 300);
                while !a.tx.push(len, |body| {
                    body[..8].copy_from_slice(&i.to_le_bytes());
                    body[8..].fill(i as u8);
                }) {
                    std::thread::yield_now();
                }
            }
        });
        let mut want = 0u64;
        while want < N {
            let Some(r) = b.rx.peek() else {
                std::thread::yield_now();
                continue;
            };
            assert_eq!(r.len(), 8 + (want as usize % 300));
            assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), want);
            assert!(r[8..].iter().all(|&x| x == want as u8));
            b.rx.consume();
            want += 1;
        }
        t.join().unwrap();
    }
}
