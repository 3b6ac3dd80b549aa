//! The connection manager: the InfiniBand CM protocol (IBA vol. 1 ch. 12)
//! that rdma_cm programs use to set up RC/UC connections and resolve UD
//! services, spoken with the Linux kernel's CM over the GSI QP (QP1).
//!
//! This module owns the protocol core only, sans-IO: [`msg`] holds the
//! messages as typed values and [`agent::CmAgent`] the per-device state
//! machine. Inputs are calls with `now` (user requests such as `connect`,
//! `accept`, `disconnect`; `handle_message` for a received message;
//! `handle_timeout`); outputs are polled (`poll_transmit`, `poll_event`,
//! `poll_timeout`). No sockets, threads or clock reads; randomness (local
//! comm IDs) is injected. The byte codec and the service thread that moves
//! messages between the agent and the GSI QP live elsewhere.
//!
//! # A connection's states
//!
//! Active side (`connect`):
//!
//! ```text
//! ReqSent ──MRA──▶ MraReqRcvd ──REP──┐
//!    │ REP                            ▼
//!    └──────────────────────────▶ RepRcvd ──(user slow: MRA)──▶ MraRepSent
//!                                   │ establish (RTU sent)         │ establish
//!                                   ▼                              ▼
//!                               Established ◀─────────────────────┘
//! ```
//!
//! Passive side (a REQ for a listened service):
//!
//! ```text
//! ReqRcvd ──(user slow, or duplicate REQ: MRA)──▶ MraReqSent
//!    │ accept (REP sent)                            │ accept
//!    ▼                                              ▼
//! RepSent ──MRA──▶ MraRepRcvd ──RTU, or the user's establish──▶ Established
//! ```
//!
//! Both sides: `Established ──disconnect (DREQ)──▶ DreqSent ──DREP, or
//! retries out──▶ TimeWait`; `Established ──DREQ (DREP sent)──▶ TimeWait`;
//! `TimeWait ──time-wait over──▶ Idle` (event `TimewaitExit`, comm ID
//! freed). A REJ, or resends running out on a REQ or REP (event
//! `Unreachable`), ends a connection in `Idle` — or in `TimeWait` when it
//! was past its REP, or the REJ says "stale connection". SIDR:
//! `SidrReqSent ──SIDR_REP──▶ Idle` (active), `SidrReqRcvd ──sidr_reply──▶
//! Idle` (passive). An `Idle` entry holds nothing but its `ConnId` until
//! the user's `destroy`, which frees a connection from any state.
//!
//! # Timers
//!
//! All times are `4.096 µs × 2^t` with `t` capped at
//! [`agent::MAX_TIMEOUT_EXP`] (24, ≈ 68.7 s). A REQ, REP or DREQ is resent
//! every *response wait* — the peer's CM response timeout plus twice the
//! packet life time (the packet life is the path's local ACK timeout
//! minus one, as the kernel derives it) — up to the REQ's Max CM Retries
//! times; so an unreachable peer is given up on after
//! `(retries + 1) × wait`. An MRA received makes the wait the MRA's
//! service timeout plus twice the packet life, for the rest of the
//! resends. The passive side sends its MRA half-way through the active
//! side's response timeout if the user has not accepted by then (and at
//! once on a duplicate REQ); the active side likewise MRAs a REP its user
//! has not answered. Time-wait lasts the QP's ACK timeout: the peer's ACK
//! delay plus twice the packet life.
//!
//! # Duplicates, stale connections, limits
//!
//! A duplicate REQ (same remote CA GUID and comm ID) is answered with an
//! MRA while the user decides, with the REP again once accepted, and
//! dropped otherwise; a duplicate REP with an MRA, or with the RTU once
//! established. A REQ (or REP) from a remote QP we hold a connection with
//! is rejected "stale connection" and the old connection, if established,
//! is disconnected. A DREQ for no connection is answered with a DREP
//! anyway. Messages that match no connection or state are dropped and
//! counted in [`agent::CmStats`].
//!
//! A REQ beyond a listener's backlog is dropped without a REJ — as the
//! kernel's `ucma` does (its handler returns `-ENOMEM` and the CM then
//! destroys the new ID without rejecting, "to allow future retries") — so
//! the REQ's resends may find room; a SIDR_REQ beyond it is answered
//! "rejected", as the kernel's CM does. The backlog counts requests
//! reported and not yet accepted, rejected or destroyed. Peers cannot grow
//! the agent beyond the backlogs plus [`agent::CmConfig::max_half_open`]
//! passive connections not yet established; events and transmits wait in
//! bounded queues. No received value can make it panic.
//!
//! # Not done
//!
//! Alternate paths (LAP/APR) and path migration are not supported: a REQ
//! offers only a primary path, REPs never accept failover, and LAP/APR
//! messages are not among [`msg::CmMessage`] — the codec drops them
//! (ignored, not answered with a REJ), as the Linux CM ignores LAP/APR on
//! RoCE ports. Neither are RD, XRC, peer-to-peer REQs, service ID masks or
//! redirection (a SIDR_REP "redirect" is passed to the user as received).

pub(crate) mod agent;
pub(crate) mod codec;
pub(crate) mod msg;
pub(crate) mod rendezvous;
pub(crate) mod service;

#[cfg(test)]
mod tests;
