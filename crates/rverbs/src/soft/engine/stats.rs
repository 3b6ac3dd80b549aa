//! The engine's counters: [`NetStats`], what it adds up from the QPs'
//! transports, and the drop reasons it counts.

use crate::soft::transport::rc::RcCounters;
use crate::soft::transport::ud::UdCounters;
use crate::soft::transport::RxDrop;

/// Defines the counters struct and its `counters()` listing from one list
/// of fields, so the two cannot drift apart.
macro_rules! counters_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[doc = $doc:expr])* pub $field:ident: u64,)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl $name {
            /// Every counter with its field name, in declaration order (what
            /// `rverbs counters` prints).
            pub fn counters(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field)),*]
            }
        }
    };
}

counters_struct! {
    /// Counters of a device's network engine.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct NetStats {
        /// RoCE packets sent.
        pub tx_packets: u64,
        /// Packets that could not be sent (full socket buffer, network error);
        /// the transport retransmits them.
        pub tx_errors: u64,
        /// Sends handed to the kernel (single packets or GSO batches).
        pub tx_sends: u64,
        /// Packets the kernel refused as larger than the link's MTU allows (a
        /// path MTU above the port's active MTU), lost; the transport retries
        /// and, if the path MTU stays too big, ends in RETRY_EXC_ERR.
        pub tx_too_big: u64,
        /// RoCE packets received on port 4791.
        pub rx_packets: u64,
        /// Receive calls that returned data (single packets or GRO batches).
        pub rx_recvs: u64,
        /// Received packets whose ICRC matched for no IPv4 ID (corrupt), or
        /// did not match (IPv6), or too short to hold one (an empty
        /// datagram too), dropped.
        pub rx_icrc_errors: u64,
        /// Received IPv4 packets accepted with an ID found by solving the ICRC
        /// for it (`Ipv4IdSolver`): not the 0 or GSO numbering an rverbs peer
        /// writes, but the counting IDs of kernel Soft-RoCE, a NIC, or any
        /// other sender. The check of these is 16 bits weaker.
        pub rx_ip_id_solved: u64,
        /// Received packets that are not valid RoCEv2, dropped.
        pub rx_malformed: u64,
        /// Received packets for a QP that does not exist, dropped.
        pub rx_unknown_qp: u64,
        /// Received packets for an RC or UC QP from an address other than its
        /// peer's, dropped.
        pub rx_wrong_peer: u64,
        /// Received packets of another transport than their QP's (an RC opcode
        /// for a UD QP, say), dropped.
        pub rx_wrong_transport: u64,
        /// Received packets for a QP in RESET, INIT or ERROR, dropped.
        pub rx_qp_not_receiving: u64,
        /// Received packets whose P_Key does not match their QP's, dropped.
        pub rx_bad_pkey: u64,
        /// Received UD packets longer than the path MTU, dropped.
        pub rx_too_long: u64,
        /// Request packets sent again (go-back-N after a loss or timeout), all
        /// QPs, past and present.
        pub retransmitted: u64,
        /// Retransmission timer expiries.
        pub timeouts: u64,
        /// NAK sequence errors received.
        pub seq_naks_received: u64,
        /// RNR NAKs received.
        pub rnr_naks_received: u64,
        /// NAK sequence errors sent.
        pub seq_naks_sent: u64,
        /// RNR NAKs sent.
        pub rnr_naks_sent: u64,
        /// Duplicate requests received.
        pub duplicates: u64,
        /// Congestion window cuts.
        pub window_cuts: u64,
        /// Requests refused with a NAK that ends the QP (invalid request: a bad
        /// opcode sequence, length or alignment; remote access; remote
        /// operational error).
        pub fatal_naks_sent: u64,
        /// UC packets dropped (the rest of a message after a gap, or a message
        /// refused: no receive WR, too long; and the rest of a message refused
        /// for access).
        pub uc_dropped: u64,
        /// UC messages refused for a remote access error (bad rkey, bounds,
        /// rights, PD), dropped: UC sends no NAK, so a peer sweeping rkeys
        /// shows here.
        pub uc_access_refused: u64,
        /// RC responses (ACKs, NAKs, READ responses, atomic ACKs) dropped for
        /// naming a PSN their QP never sent: posted work still held back (by
        /// the congestion window, a READ/atomic credit, a fence) or beyond.
        /// No genuine peer sends them; they are forged, or from a confused peer.
        pub acks_for_unsent: u64,
        /// RC request packets dropped for arriving ahead of the expected PSN
        /// (a packet before them was lost): the first of a gap is answered
        /// with one sequence NAK (`seq_naks_sent`), and it and the rest are
        /// dropped until the missing PSN comes.
        pub out_of_sequence: u64,
        /// RC READ and atomic requests refused with NAK invalid request (the
        /// QP goes to ERR) for exceeding the responder's resources: a new one
        /// while the oldest of the QP's `max_dest_rd_atomic` is still being
        /// answered — the peer has more outstanding than we offered — or any
        /// when `max_dest_rd_atomic` is 0. Also counted in `fatal_naks_sent`.
        pub rd_atomic_over_limit: u64,
        /// RC READ responses dropped at the PSN expected next for being out of
        /// place in their response stream: a FIRST, MIDDLE, LAST or ONLY where
        /// another belongs (the IBTA's order from the packet a READ request
        /// asked for first to its last), or a NAK syndrome in their AETH. A
        /// late response of an earlier ask, after the requester asked again
        /// for the rest, is one; a confused or forged peer the other.
        pub read_responses_out_of_place: u64,
        /// UD packets dropped for a Q_Key that did not match the QP's.
        pub qkey_violations: u64,
        /// UD packets dropped because their QP had no receive WR posted.
        pub ud_no_recv_wr: u64,
        /// MADs received on QP 1 and handed to the connection manager.
        pub mads_received: u64,
        /// Packets for QP 1 dropped: not a 256-byte MAD in a UD SEND ONLY,
        /// a wrong Q_Key (also in `qkey_violations`) or P_Key (also in
        /// `rx_bad_pkey`), no connection manager running, or its queue full.
        pub mads_dropped: u64,
        /// MADs sent from QP 1.
        pub mads_sent: u64,
        /// MADs the kernel refused to send (a full socket buffer, an
        /// unreachable network); the connection manager resends.
        pub mads_send_errors: u64,
        /// Connection manager messages sent (REQ, REP, RTU, REJ, MRA,
        /// DREQ, DREP, SIDR_REQ, SIDR_REP), resends included.
        pub cm_sent: u64,
        /// Connection manager messages received and decoded.
        pub cm_received: u64,
        /// Connection manager messages sent again (a timer, or a
        /// duplicate's answer).
        pub cm_retransmitted: u64,
        /// Connection manager requests given up on after their last resend
        /// (the peer unreachable).
        pub cm_timeouts: u64,
        /// MADs and connection manager messages dropped: not a CM message
        /// the connection manager takes, no connection or state they fit,
        /// a full backlog, too many half-open connections.
        pub cm_dropped: u64,
        /// Parks of a polling thread that stalled its program (the whole
        /// process's: a park ran out its time, and the thread then posted
        /// work instead of polling again); after the first, pollers no
        /// longer park. See `RVERBS_POLL_PARK` in the README.
        pub poll_park_stalls: u64,
        /// Same-host links agreed with devices of this host.
        pub local_links: u64,
        /// Of those, links without cross-memory attach (refused by the
        /// kernel or a seccomp profile).
        pub local_links_without_cma: u64,
        /// RC/UC QPs given a peer on this host with a link: same-host path.
        pub local_qps: u64,
        /// QPs given a peer with no rverbs device of this host behind it
        /// (a remote host, kernel Soft-RoCE, a peer with the path off): wire.
        pub wire_qps_not_local: u64,
        /// QPs whose peer device runs as another user: wire.
        pub wire_qps_other_user: u64,
        /// QPs whose handshake failed otherwise (timeout, protocol): wire.
        pub wire_qps_refused: u64,
        /// QPs given a peer while `RVERBS_SAME_HOST=0`: wire.
        pub wire_qps_path_off: u64,
        /// Packets pushed into same-host rings (counted in `tx_packets` too).
        pub local_tx_packets: u64,
        /// Packets taken from same-host rings (counted in `rx_packets` too).
        pub local_rx_packets: u64,
        /// Of those, packets whose payload the receiver copied straight from
        /// the sender's memory (cross-memory attach).
        pub local_rx_pulled: u64,
        /// Times a ring was full when a QP had packets to send (it waits).
        pub local_ring_full: u64,
        /// Doorbells sent to peers whose threads slept.
        pub local_doorbells_sent: u64,
        /// Doorbells received.
        pub local_doorbells_received: u64,
        /// Passes that put a doorbell off while the peer's records to us
        /// still waited unread.
        pub local_doorbells_deferred: u64,
        /// Deregistrations (and re-registrations) that stopped waiting for
        /// a live same-host peer to take the packets sent to it (after
        /// 5 s: a stopped peer may still copy from the memory later).
        pub local_copy_waits_given_up: u64,
    }
}

impl NetStats {
    pub(super) fn add(&mut self, c: &RcCounters) {
        let RcCounters {
            retransmitted,
            timeouts,
            seq_naks_received,
            rnr_naks_received,
            seq_naks_sent,
            rnr_naks_sent,
            duplicates,
            window_cuts,
            fatal_naks_sent,
            uc_dropped,
            uc_access_refused,
            acks_for_unsent,
            out_of_sequence,
            rd_atomic_over_limit,
            read_responses_out_of_place,
        } = *c;
        self.retransmitted += retransmitted;
        self.timeouts += timeouts;
        self.seq_naks_received += seq_naks_received;
        self.rnr_naks_received += rnr_naks_received;
        self.seq_naks_sent += seq_naks_sent;
        self.rnr_naks_sent += rnr_naks_sent;
        self.duplicates += duplicates;
        self.window_cuts += window_cuts;
        self.fatal_naks_sent += fatal_naks_sent;
        self.uc_dropped += uc_dropped;
        self.uc_access_refused += uc_access_refused;
        self.acks_for_unsent += acks_for_unsent;
        self.out_of_sequence += out_of_sequence;
        self.rd_atomic_over_limit += rd_atomic_over_limit;
        self.read_responses_out_of_place += read_responses_out_of_place;
    }

    /// Counts a packet a QP's transport dropped unread.
    pub(super) fn count_drop(&mut self, reason: RxDrop) {
        let counter = match reason {
            RxDrop::WrongTransport => &mut self.rx_wrong_transport,
            RxDrop::NotReceiving => &mut self.rx_qp_not_receiving,
            RxDrop::PKey => &mut self.rx_bad_pkey,
            RxDrop::TooLong => &mut self.rx_too_long,
        };
        *counter += 1;
    }

    pub(super) fn add_ud(&mut self, c: &UdCounters) {
        self.qkey_violations += c.qkey_violations;
        self.ud_no_recv_wr += c.no_recv_wr;
    }
}
