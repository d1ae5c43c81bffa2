//! The tamper-evident per-node audit log of slurm-tenancy as the product's processes write it:
//! [`AuditLog::open`] / [`AuditLog::append`] (flock, chain head read from the tail, one
//! `write(2)` in `O_APPEND`, fsync), the records and their hash canonicalization ([`record`]),
//! and the anchors that copy the chain head to syslog and an anchor file ([`send_anchor`]).
//! Verification and reports are in `tenancy-audit`, which re-exports this crate.

pub mod anchor;
pub mod log;
pub mod record;

pub use anchor::{
    anchor_line, anchor_mac, parse_anchor_line, send_anchor, send_anchor_to, Anchor, AnchorKey,
    AnchorSet, AnchorStatus, NodeAnchors, Origin, SyslogStatus,
};
pub use log::{Appended, AuditError, AuditLog, Head, Rotated};
pub use record::{Event, Outcome, Record, Resource, ResourceAction, GENESIS};
