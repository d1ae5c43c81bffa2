//! The node's clock synchronisation state as the kernel keeps it (adjtimex(2) read-only): what
//! every anchor records, so that `audit verify` can say which node's record times an assessor
//! cannot trust (PCI DSS 10.6, ISO/IEC 27001 A.8.17), and `tenancyctl doctor` warns.

use serde::Serialize;

/// What adjtimex says of the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClockSync {
    /// The kernel's clock is disciplined by a time service (NTP, chrony, PTP): adjtimex did not
    /// answer TIME_ERROR and STA_UNSYNC is clear.
    pub synchronised: bool,
    /// The time service's estimated error, in microseconds.
    pub esterror_us: i64,
    /// Its maximum error, in microseconds.
    pub maxerror_us: i64,
}

impl ClockSync {
    /// The anchor's words: `clock=synced esterror_us=N` or `clock=unsynced esterror_us=N`.
    pub fn token(&self) -> &'static str {
        if self.synchronised {
            "synced"
        } else {
            "unsynced"
        }
    }
}

/// Reads the clock's state (modes 0: nothing is changed, no privilege needed); `None` when the
/// kernel refuses (a seccomp filter, say).
pub fn clock_sync() -> Option<ClockSync> {
    // SAFETY: timex is plain data; modes 0 asks adjtimex to read only.
    let mut t: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut t) };
    if state < 0 {
        return None;
    }
    Some(ClockSync {
        synchronised: state != libc::TIME_ERROR && t.status & libc::STA_UNSYNC == 0,
        esterror_us: t.esterror as i64,
        maxerror_us: t.maxerror as i64,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_answers() {
        let c = super::clock_sync().expect("adjtimex answers on Linux");
        assert!(c.maxerror_us >= 0 && c.esterror_us >= 0, "{c:?}");
    }
}
