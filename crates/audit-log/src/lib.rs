//! The tamper-evident per-node audit log of slurm-tenancy as the product's processes write it:
//! [`AuditLog::open`] / [`AuditLog::append`] (flock, chain head read from the tail, one
//! `write(2)` in `O_APPEND`, fsync), the records and their hash canonicalization ([`record`]),
//! the anchors that copy the chain head to syslog and an anchor file ([`send_anchor`]), signed
//! with the node's own Ed25519 key ([`sign`]) and carrying the clock's state ([`clock`]).
//! Verification and reports are in `tenancy-accounting`.

pub mod anchor;
pub mod clock;
pub mod log;
pub mod record;
pub mod sign;

pub use anchor::{
    anchor_line, anchor_mac, anchor_text, parse_anchor_line, send_anchor, send_anchor_auth,
    send_anchor_to, signed_text, Anchor, AnchorAuth, AnchorKey, AnchorSet, AnchorStatus,
    AnchorTrust, NodeAnchors, NodeClock, Origin, ParsedAnchor, SyslogStatus,
};
pub use clock::{clock_sync, ClockSync};
pub use log::{Appended, AuditError, AuditLog, Head, Rotated};
pub use record::{Event, Outcome, Record, Resource, ResourceAction, GENESIS};
pub use sign::{NodeKey, PublicKeys, SigCheck};
