//! Queue pair types, capabilities, attributes and the state transition
//! table of `ibv_modify_qp` (which attributes each transition requires and
//! which it allows), as the Linux RDMA core enforces them.

use bitflags::bitflags;

use crate::attr::{AccessFlags, Gid, Mtu};
use crate::wr::QpState;

/// `enum ibv_qp_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum QpType {
    /// Reliable Connected.
    Rc = 2,
    /// Unreliable Connected.
    Uc = 3,
    /// Unreliable Datagram.
    Ud = 4,
}

/// Queue sizes of a QP (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCaps {
    /// Most outstanding send WRs.
    pub max_send_wr: u32,
    /// Most outstanding receive WRs.
    pub max_recv_wr: u32,
    /// Most SGEs per send WR.
    pub max_send_sge: u32,
    /// Most SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Most bytes of inline data per send WR.
    pub max_inline_data: u32,
}

/// Address vector: where the peer is (`struct ibv_ah_attr` with its GRH).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// The peer's GID (on RoCEv2, its IP address).
    pub dgid: Gid,
    /// Which local GID to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// Traffic class (DSCP/ECN).
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// The local port (1).
    pub port_num: u8,
}

impl Default for AhAttr {
    fn default() -> Self {
        AhAttr {
            dgid: Gid::ZERO,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            sl: 0,
            port_num: 1,
        }
    }
}

bitflags! {
    /// `enum ibv_qp_attr_mask`: which fields of [`QpAttr`] a modify sets.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`.
        const STATE = 1;
        /// `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr`.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` and friends.
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `rate_limit`.
        const RATE_LIMIT = 1 << 25;
    }
}

/// QP attributes (`struct ibv_qp_attr`): set by modify, returned by query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// The state to move to.
    pub qp_state: QpState,
    /// The state the caller believes the QP is in (with `CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// First PSN the responder expects.
    pub rq_psn: u32,
    /// First PSN the requester sends.
    pub sq_psn: u32,
    /// The peer QP number.
    pub dest_qp_num: u32,
    /// What peers may do (remote read / write / atomic).
    pub qp_access_flags: AccessFlags,
    /// Queue sizes.
    pub cap: QpCaps,
    /// The peer's address.
    pub ah_attr: AhAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Report SQ_DRAINED when entering SQD drains the send queue.
    pub en_sqd_async_notify: bool,
    /// Whether the send queue is still draining (query only).
    pub sq_draining: bool,
    /// Outstanding READ/atomic requests this QP may have as requester.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests this QP accepts as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this QP sends as responder.
    pub min_rnr_timer: u8,
    /// The port.
    pub port_num: u8,
    /// Local ACK timeout: 4.096 µs × 2^timeout (0: for ever).
    pub timeout: u8,
    /// Retries on timeout or NAK before RETRY_EXC_ERR.
    pub retry_cnt: u8,
    /// Retries on RNR NAK (7: for ever).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCaps::default(),
            ah_attr: AhAttr::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

/// What is wrong with a modify_qp request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionError {
    /// The state machine has no such transition for this QP type.
    Invalid {
        /// From.
        from: QpState,
        /// To.
        to: QpState,
    },
    /// Attributes the transition requires are missing from the mask.
    Missing(QpAttrMask),
    /// Attributes the transition does not allow are in the mask.
    Forbidden(QpAttrMask),
}

/// The attributes a transition requires and those it also allows, for a
/// QP type; `None` for a transition that does not exist (IBTA 10.3, as the
/// Linux RDMA core's `qp_state_table`).
pub fn transition_masks(
    ty: QpType,
    from: QpState,
    to: QpState,
) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    let (rc, uc, ud) = match (from, to) {
        (_, Reset) | (_, Err) => return Some((none, none)),
        (Reset, Init) => {
            let conn = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
            (
                (conn, none),
                (conn, none),
                (M::PKEY_INDEX | M::PORT | M::QKEY, none),
            )
        }
        (Init, Init) => {
            let conn = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
            (
                (none, conn),
                (none, conn),
                (none, M::PKEY_INDEX | M::PORT | M::QKEY),
            )
        }
        (Init, Rtr) => (
            (
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            (none, M::PKEY_INDEX | M::QKEY),
        ),
        (Rtr, Rts) => (
            (
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        ),
        (Rts, Rts) => (
            (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
            (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
            ),
            (none, M::CUR_STATE | M::QKEY),
        ),
        (Rts, Sqd) => (
            (none, M::EN_SQD_ASYNC_NOTIFY),
            (none, M::EN_SQD_ASYNC_NOTIFY),
            (none, M::EN_SQD_ASYNC_NOTIFY),
        ),
        (Sqd, Rts) => (
            (
                none,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            (
                none,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            (none, M::CUR_STATE | M::QKEY),
        ),
        (Sqd, Sqd) => (
            (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            (
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            (none, M::PKEY_INDEX | M::QKEY),
        ),
        (Sqe, Rts) => {
            let uc = (none, M::CUR_STATE | M::ACCESS_FLAGS);
            let ud = (none, M::CUR_STATE | M::QKEY);
            return match ty {
                QpType::Rc => None,
                QpType::Uc => Some(uc),
                QpType::Ud => Some(ud),
            };
        }
        _ => return None,
    };
    Some(match ty {
        QpType::Rc => rc,
        QpType::Uc => uc,
        QpType::Ud => ud,
    })
}

/// Checks a modify_qp request as `ib_modify_qp_is_ok` does: the transition
/// exists, every required attribute is set, nothing else but allowed ones
/// (and `STATE`) is.
pub fn check_transition(
    ty: QpType,
    from: QpState,
    to: QpState,
    mask: QpAttrMask,
) -> Result<(), TransitionError> {
    if mask.contains(QpAttrMask::CUR_STATE)
        && !matches!(
            from,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    {
        return Err(TransitionError::Forbidden(QpAttrMask::CUR_STATE));
    }
    let (required, optional) =
        transition_masks(ty, from, to).ok_or(TransitionError::Invalid { from, to })?;
    let missing = required - mask;
    if !missing.is_empty() {
        return Err(TransitionError::Missing(missing));
    }
    let forbidden = mask - (required | optional | QpAttrMask::STATE);
    if !forbidden.is_empty() {
        return Err(TransitionError::Forbidden(forbidden));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;

    #[test]
    fn rc_connection_sequence() {
        let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        check_transition(QpType::Rc, QpState::Reset, QpState::Init, init).unwrap();
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        check_transition(QpType::Rc, QpState::Init, QpState::Rtr, rtr).unwrap();
        let rts =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        check_transition(QpType::Rc, QpState::Rtr, QpState::Rts, rts).unwrap();
    }

    #[test]
    fn missing_and_forbidden_attributes_are_named() {
        assert_eq!(
            check_transition(
                QpType::Rc,
                QpState::Init,
                QpState::Rtr,
                M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
            ),
            Err(TransitionError::Missing(
                M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER
            ))
        );
        assert_eq!(
            check_transition(
                QpType::Rc,
                QpState::Reset,
                QpState::Init,
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::SQ_PSN
            ),
            Err(TransitionError::Forbidden(M::SQ_PSN))
        );
        assert_eq!(
            check_transition(QpType::Rc, QpState::Reset, QpState::Rts, M::STATE),
            Err(TransitionError::Invalid {
                from: QpState::Reset,
                to: QpState::Rts
            })
        );
        assert_eq!(
            check_transition(QpType::Rc, QpState::Sqe, QpState::Rts, M::STATE),
            Err(TransitionError::Invalid {
                from: QpState::Sqe,
                to: QpState::Rts
            })
        );
        assert_eq!(
            check_transition(
                QpType::Rc,
                QpState::Init,
                QpState::Init,
                M::STATE | M::CUR_STATE
            ),
            Err(TransitionError::Forbidden(M::CUR_STATE))
        );
    }

    #[test]
    fn any_state_to_reset_or_error() {
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Err,
        ] {
            check_transition(QpType::Rc, s, QpState::Err, M::STATE).unwrap();
            check_transition(QpType::Rc, s, QpState::Reset, M::STATE).unwrap();
        }
    }

    #[test]
    fn sqd_round_trip_and_ud_init() {
        check_transition(
            QpType::Rc,
            QpState::Rts,
            QpState::Sqd,
            M::STATE | M::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
        check_transition(
            QpType::Rc,
            QpState::Sqd,
            QpState::Sqd,
            M::STATE | M::TIMEOUT | M::AV,
        )
        .unwrap();
        check_transition(QpType::Rc, QpState::Sqd, QpState::Rts, M::STATE).unwrap();
        check_transition(
            QpType::Ud,
            QpState::Reset,
            QpState::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
        )
        .unwrap();
        check_transition(QpType::Ud, QpState::Rtr, QpState::Rts, M::STATE | M::SQ_PSN).unwrap();
    }
}
